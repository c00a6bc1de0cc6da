"""Benchmark records: each benchmark's result, saved with the machine and versions that made it.

Every script in benchmarks/ ends by calling `report(result)`: the result goes into
`benchmarks/results/<record>.json` (the record named by `--record`, by default the script's name)
and then to stdout as the last line. The README and docs/ cite a figure as a link to its record,
`[12.3](benchmarks/results/decode_small_beam4.json#sentences_per_s)`, and
tests/unit/test_figures.py checks that every such figure is its record's value, so a figure can be
neither mistyped nor left behind when a record is measured again.

A record also says where it was measured (processor, cores, accelerator), with which packages, by
which command and at which commit: speed figures, and BLEU on a CPU, move between machines.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

from absl import flags

from flaxformer_nmt.runtime import files

RECORD = flags.DEFINE_string(
  "record", "", "The record's name: benchmarks/results/<record>.json ('' = the script's name)."
)
RESULTS_DIR = flags.DEFINE_string(
  "results_dir",
  "",
  "Where records go ('' = benchmarks/results of this checkout); 'none' = nowhere.",
)

# The packages whose versions can move a figure.
PACKAGES = (
  "jax",
  "jaxlib",
  "flax",
  "optax",
  "orbax-checkpoint",
  "numpy",
  "ml_dtypes",  # 0.7.0's import costs every process about 1 s (pyproject.toml)
  "sentencepiece",
  "sacrebleu",
  "ctranslate2",
  "libtpu",
)
# Variables that change what XLA compiles, and so a figure: a record lists those set (XLA_FLAGS as
# the run saw it, runtime/xla_flags.py's GPU defaults included). Decoding on an H200 ran at half
# the speed under one option (docs/performance.md), and records made before this field cannot say
# which options they ran under.
ENVIRONMENT = ("XLA_FLAGS", "FLAXFORMER_NMT_XLA_DEFAULTS", "LIBTPU_INIT_ARGS")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def processor() -> str:
  """The CPU's model name (/proc/cpuinfo on Linux), else what the platform module knows."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def accelerator() -> str:
  """What JAX computes on when it is not the CPU ('none' otherwise). Asked here, at the end of a
  benchmark, also by scripts whose work ran in subprocesses (experiments.py)."""
  try:
    import jax  # pylint: disable=g-import-not-at-top

    device = jax.devices()[0]
  except (ImportError, RuntimeError):
    return "none"
  if device.platform == "cpu":
    return "none"
  return f"{jax.device_count()} x {device.device_kind}"


def machine() -> dict[str, Any]:
  return {
    "processor": processor(),
    "cores": os.cpu_count(),
    "accelerator": accelerator(),
    "system": f"{platform.system()} {platform.machine()}",
  }


def versions() -> dict[str, str]:
  """Python's and each installed package's version (absent packages are left out)."""
  found = {"python": platform.python_version()}
  for name in PACKAGES:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return found


def environment() -> dict[str, str]:
  """The `ENVIRONMENT` variables set in this process, with their values."""
  return {name: os.environ[name] for name in ENVIRONMENT if os.environ.get(name)}


def commit() -> str:
  """The checkout's commit, with "+ uncommitted changes" when its tracked files differ from it
  (records aside: measuring several figures in a row rewrites them)."""

  def git(*args: str) -> str:
    return subprocess.run(
      ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()

  try:
    head = git("rev-parse", "--short=12", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results")
    found = f"{head} + uncommitted changes" if dirty else head
  except (OSError, subprocess.SubprocessError):
    found = "unknown (not a git checkout)"
  # A copy of a working tree sent to another machine can carry an older .git (the H200's did,
  # 2026-11-28): RECORD_COMMIT names the commit the tree was made from, beside what git says.
  declared = os.environ.get("RECORD_COMMIT", "").strip()
  return f"{declared} (RECORD_COMMIT; this checkout's git: {found})" if declared else found


def command_line(argv: list[str]) -> str:
  """`argv` as a user would type it: `python <script relative to the checkout> <flags>`."""
  script = os.path.abspath(argv[0])
  if script.startswith(REPO + os.sep):
    script = os.path.relpath(script, REPO)
  return shlex.join(["python", script, *argv[1:]])


def make_record(name: str, result: dict[str, Any], command: str) -> dict[str, Any]:
  """The record of `result`: what it is, where and how it was measured."""
  return {
    "record": name,
    "command": command,
    "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    "commit": commit(),
    "machine": machine(),
    "versions": versions(),
    "environment": environment(),
    "result": result,
  }


def results_dir() -> str:
  return RESULTS_DIR.value or os.path.join(REPO, "benchmarks", "results")


def save(name: str, result: dict[str, Any], command: str) -> str | None:
  """Writes `result`'s record to <results_dir>/<name>.json (whole, or not at all); its path."""
  if RESULTS_DIR.value == "none":
    return None
  folder = results_dir()
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, f"{name}.json")
  text = json.dumps(make_record(name, result, command), indent=1, sort_keys=False) + "\n"
  files.write_text(path, text)
  return path


def report(result: dict[str, Any]) -> None:
  """A benchmark's last step: its record saved (--record, --results_dir), then `result` printed
  as the last line of stdout."""
  name = RECORD.value or os.path.splitext(os.path.basename(sys.argv[0]))[0]
  path = save(name, result, command_line(sys.argv))
  if path:
    print(f"Record: {path}", flush=True)
  print(json.dumps(result), flush=True)
