"""The commands of the README and of docs/*.md, as `tests/e2e/test_readme.py` runs them.

The README is read first, then the docs pages in name order. A command is a line of a ```bash
block (backslash continuations joined; a `for ... done` loop, a quoted multi-line argument and a
batch script are one command each), a ```python block, or an inline code span that starts with
`python `, `bash ` or `pip ` (the results table's commands). Each belongs to one *chain*: commands
that share a scratch folder and run in order (the demo's workdir is trained by the quick start,
then averaged, evaluated, exported ...).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import helpers

README = helpers.REPO / "README.md"
PAGES = (README, *sorted((helpers.REPO / "docs").glob("*.md")))

# The chains, in the order a user meets them.
CHAINS = (
  "ci",
  "install",
  "demo",
  "decoding",
  "fine-tuning",
  "pretrained",
  "serving",
  "wmt14",
  "files",
  "benchmarks",
  "api",
  "local",
  "srun",
  "gcloud",
)
# Pages whose demo commands make chains of their own (each starts from the quick start's trained
# runs/demo), so that they run beside the README's.
OWN_DEMO_CHAINS = {
  "decoding.md": "decoding",
  "fine-tuning.md": "fine-tuning",
  "pretrained.md": "pretrained",
  "serving.md": "serving",
}


@dataclasses.dataclass(frozen=True)
class Command:
  text: str  # as the README writes it (continuations joined for bash)
  kind: str  # "bash" or "python"
  section: str  # the `## ` heading it is under
  page: str = "README.md"  # the file it is written in

  @property
  def chain(self) -> str:
    return chain_of(self)


def _config(text: str) -> str:
  """The --config value of a command, or ""."""
  match = re.search(r"--config=(\S+)", text)
  return match.group(1) if match else ""


def chain_of(command: Command) -> str:
  """Which chain runs `command`; "" when none does (test_readme fails on that)."""
  chain = _chain_of(command)
  return OWN_DEMO_CHAINS.get(command.page, chain) if chain == "demo" else chain


def _chain_of(command: Command) -> str:
  t = command.text
  config = _config(t)
  if command.page == "pretrained.md" and re.search(r"--(workdir|input)=runs/demo", t):
    return "demo"  # docs/pretrained.md's walk-through on the quick start's runs/demo
  if command.kind == "python":
    return "api" if "flaxformer_nmt import api" in t else "demo" if "ctranslate2" in t else ""
  if "pytest" in t or t.startswith("python tools/"):
    return "ci"  # the test commands and checks: .ci/run runs them verbatim
  if t.startswith("pip install"):
    return "install" if "&&" not in t else "demo"  # the quick start's demo, after its install
  if "#SBATCH" in t or t.startswith("srun "):
    return "srun"
  if t.startswith("gcloud "):
    return "gcloud"
  if "JAX_COORDINATOR_ADDRESS" in t:
    return "local"
  if "multi30k" in t:  # the Multi30k config, its script, or its downloaded files
    return "files"
  if re.match(r"python benchmarks/\w+\.py", t):
    return "benchmarks"
  if "demo" in config or t.startswith(("printf ", "python -m flaxformer_nmt.data.demo_text")):
    return "demo"
  if t.startswith("mkdir -p data/demo_bt"):  # the back-translation recipe's concatenation
    return "demo"
  if t.startswith("curl ") and "127.0.0.1:8080" in t:  # a request to the demo's server
    return "demo"
  if "wmt14" in config or t.startswith(("sacrebleu ", "mkdir -p wmt14_text")):
    return "wmt14"
  return ""


def _bash_commands(block: str) -> list[str]:
  """One command per line, a `\\`-continued line or a multi-line loop, quoted string or script
  (the SLURM batch script) being one."""
  if block.startswith("#!"):
    return [block.strip()]
  commands, current, continued = [], "", False
  for line in block.splitlines():
    current = current + line if continued or not current else f"{current}\n{line}"
    continued = current.endswith("\\")
    if continued:
      current = current[:-1].rstrip() + " "
      continue
    open_quote = current.count('"') % 2 == 1
    open_loop = current.lstrip().startswith("for ") and "done" not in current
    if open_quote or open_loop:
      continue
    stripped = current.strip()
    if stripped and not stripped.startswith("#"):
      commands.append(stripped)
    current = ""
  assert not current.strip(), f"unterminated README command: {current!r}"
  return commands


def commands() -> list[Command]:
  """Every command of the README and the docs pages, in order."""
  out: list[Command] = []
  for page in PAGES:
    out += _page_commands(page)
  return out


def _page_commands(page: pathlib.Path) -> list[Command]:
  text = page.read_text(encoding="utf-8")
  out: list[Command] = []
  section = ""
  pattern = re.compile(
    r"^## ([^\n]+)$|^```(bash|python)\n(.*?)^```|`((?:python|bash|pip) [^`]+)`", re.M | re.S
  )
  for match in pattern.finditer(text):
    heading, kind, body, inline = match.groups()
    if heading:
      section = heading.strip()
    elif kind == "bash":
      out += [Command(c, "bash", section, page.name) for c in _bash_commands(body)]
    elif kind == "python":
      out.append(Command(body, "python", section, page.name))
    elif inline:
      out.append(Command(inline, "bash", section, page.name))
  return out


def in_chain(chain: str) -> list[Command]:
  return [c for c in commands() if c.chain == chain]


# The overrides that make the demo config small in the README tests (appended to its commands).
DEMO = [
  "--config.num_train_steps=30",
  "--config.checkpoint_every_steps=10",
  "--config.eval_every_steps=30",
  "--config.log_every_steps=10",
  "--config.data.demo_train_size=2000",
  "--config.data.demo_dev_size=20",
  "--config.data.demo_test_size=20",
  "--config.eval.dev_bleu_sentences=10",
  "--config.decode.max_len_offset=8",  # an untrained model stops at the length limit
]


# The overrides that make the WMT14 configs' models small (a chain appends its steps to them).
SMALL_MODEL = helpers.SMALL_MODEL_FLAGS + ["--config.decode.max_len_offset=8"]

_INSTALL = "pip install -e . && "  # the quick start's install, done already where tests run


def as_installed(command: Command) -> Command:
  """`command` without the quick start's leading install (the package is installed already)."""
  if not command.text.startswith(_INSTALL):
    return command
  return Command(command.text[len(_INSTALL) :], "bash", command.section, command.page)


def quick_start_training() -> Command:
  """The quick start's training of runs/demo, which the docs' demo chains start from."""
  (command,) = [c for c in in_chain("demo") if c.text.startswith(_INSTALL)]
  return as_installed(command)
