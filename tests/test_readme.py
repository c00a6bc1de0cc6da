"""Every `python main.py` command the README shows still parses: its config file loads, its
flags and `--config.*` overrides exist, its mode is one main.py has, and the config validates.

What the commands *do* is run elsewhere, with tiny overrides: the demo by the quick start
(`.ci/run`, `../shared/tools/fresh-quickstart`), the WMT14 recipe by test_wmt14.py, eval, average,
translate and export by test_api.py, test_export.py and test_errors.py, attention by
test_attention.py, the multi-host launch by test_multiprocess.py, Multi30k by test_scripts.py.
This test catches the README drifting from the code.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

import helpers

_PARSE = (
  "import sys, main; main.parse_flags(sys.argv); "
  "from flaxformer_nmt import config_lib; config_lib.validate(main.flags.FLAGS.config); "
  "print(main.flags.FLAGS.mode)"
)


def readme_main_commands() -> list[str]:
  """`python main.py ...` lines of the README's bash blocks, continuations joined, without the
  ones written with `...` placeholders."""
  text = (helpers.REPO / "README.md").read_text(encoding="utf-8")
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    for line in block.replace("\\\n", " ").splitlines():
      line = line.split("#", 1)[0].strip()
      if "python main.py" not in line or "..." in line:
        continue
      command = line[line.index("python main.py") :].split(" &")[0]  # a background launch
      commands.append(command.rstrip('"').strip())
  return commands


def test_the_readme_shows_main_commands():
  commands = readme_main_commands()
  assert len(commands) >= 10
  modes = {re.search(r"--mode=(\w+)", c).group(1) for c in commands if "--mode=" in c}
  assert {"prepare", "average", "eval"} <= modes


@pytest.mark.parametrize("command", readme_main_commands())
def test_readme_command_parses(command):
  argv = shlex.split(command)[2:]  # after `python main.py`
  proc = subprocess.run(
    [sys.executable, "-c", _PARSE, *argv],
    cwd=helpers.REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  mode = re.search(r"--mode=(\w+)", command)
  assert proc.stdout.strip() == (mode.group(1) if mode else "train")
