"""How many times one command does what it should do once, and how heavy the API's import is.

  python tools/run_audit.py                      # on a copy of tests/fixtures' trained workdir
  python tools/run_audit.py --workdir=runs/demo  # on a copy of any trained run

Counts (each measured, none read from the code by eye):
  api_modules          package modules `import flaxformer_nmt.api` loads (package __init__s
                       counted), in a fresh interpreter; and whether sacrebleu came with them
                       (the API imports modes.py at its first call: the two commands below also
                       give "modules", the package modules loaded by the end of the command, and
                       "other_stages", any training, serving, export, importing, benchmarking,
                       input pipeline or BLEU module among them)
  config_opens         opens of <workdir>/config.json (an audit hook on `open`) by
                       `main.py --mode=translate` with --config left out, and by
                       `api.load(workdir)` followed by one `.translate`
  resolve_target       calls of config.directions.resolve_target in those two commands
  workdir_joins        paths joined inside a workdir outside run/folder.py
                       (tests/unit/test_package_layout.py's AST check)
  long_functions       library functions over 80 lines (AST: def to last line, docstring
                       included)
Each command runs in its own interpreter. Last line: JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "workdir_97ad9e1"

# Run inside the measured interpreter: counts config.json opens and resolve_target calls, then
# runs the command given after it; the counts go to stderr as one "AUDIT {...}" line at exit.
_PROBE = r"""
import atexit, json, os, sys
workdir = os.path.realpath(sys.argv[1])
counts = {"config_opens": 0, "resolve_target": 0}
def hook(event, args):
  if event == "open" and isinstance(args[0], str):
    if os.path.realpath(args[0]) == os.path.join(workdir, "config.json"):
      counts["config_opens"] += 1
sys.addaudithook(hook)
from flaxformer_nmt.config import directions
real = directions.resolve_target
def counted(*a, **k):
  counts["resolve_target"] += 1
  return real(*a, **k)
directions.resolve_target = counted
def report():
  ours = [m for m in sys.modules if m.split(".")[0] == "flaxformer_nmt"]
  counts["modules"] = len(ours)
  # Stages a decoding command should not need.
  counts["other_stages"] = sorted({".".join(m.split(".")[:2]) for m in ours if m.split(".")[1:2]
    and m.split(".")[1] in ("training", "serving", "export", "importing", "benchmarking")}
    | {m for m in ours if m in ("flaxformer_nmt.data.pipeline", "flaxformer_nmt.decoding.bleu")})
  print("AUDIT " + json.dumps(counts), file=sys.__stderr__, flush=True)
atexit.register(report)
if sys.argv[2] == "cli":
  sys.argv = ["main.py", *sys.argv[3:]]
  import runpy
  runpy.run_path("main.py", run_name="__main__")
else:
  from flaxformer_nmt import api
  api.load(workdir).translate(["I have three apples."])
"""


def _audited(workdir: str, *args: str) -> dict[str, int]:
  proc = subprocess.run(
    [sys.executable, "-c", _PROBE, workdir, *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  lines = [line for line in proc.stderr.splitlines() if line.startswith("AUDIT ")]
  if proc.returncode != 0 or not lines:
    raise SystemExit(f"run_audit: {args[0]} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
  return json.loads(lines[-1].removeprefix("AUDIT "))


def api_modules() -> dict[str, object]:
  code = (
    "import sys, json; import flaxformer_nmt.api; "
    "print(json.dumps({'modules': sorted(m for m in sys.modules if "
    "m.split('.')[0] == 'flaxformer_nmt'), 'sacrebleu': 'sacrebleu' in sys.modules}))"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
  )
  found = json.loads(out.stdout.strip().splitlines()[-1])
  return {"count": len(found["modules"]), "sacrebleu": found["sacrebleu"]}


def long_functions(limit: int = 80) -> list[str]:
  out = []
  for path in sorted((REPO / "flaxformer_nmt").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        length = node.end_lineno - node.lineno + 1
        if length > limit:
          out.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
  return out


def workdir_joins(checker: pathlib.Path) -> list[str]:
  sys.path[:0] = [str(checker / "tests"), str(checker / "tests" / "unit")]
  import test_package_layout  # pylint: disable=g-import-not-at-top

  owner = REPO / "flaxformer_nmt" / "run" / "folder.py"
  paths = sorted((REPO / "flaxformer_nmt").rglob("*.py"))
  return [j for p in paths if p != owner for j in test_package_layout.workdir_joins(p)]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", default=str(FIXTURE), help="a trained run (copied first)")
  parser.add_argument(
    "--checker",
    default=str(REPO),
    help="the checkout whose tests/unit/test_package_layout.py finds the joins (to count them "
    "in an older checkout, which has no such check: this one's)",
  )
  args = parser.parse_args()
  scratch = tempfile.mkdtemp(prefix="run_audit-")
  try:
    work = os.path.join(scratch, "workdir")
    shutil.copytree(args.workdir, work)
    source = os.path.join(scratch, "in.txt")
    with open(source, "w", encoding="utf-8") as f:
      f.write("I have three apples.\nWe need twenty-five chairs.\n")
    translate = _audited(
      work,
      "cli",
      f"--workdir={work}",
      "--mode=translate",
      f"--input={source}",
      f"--output={os.path.join(scratch, 'out.txt')}",
    )
    api_translate = _audited(work, "api")
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  long = long_functions()
  joins = workdir_joins(pathlib.Path(args.checker))
  result = {
    "api_modules": api_modules(),
    "translate": translate,
    "api_load_and_translate": api_translate,
    "workdir_joins_outside_folder_owner": {"count": len(joins), "where": joins},
    "library_functions_over_80_lines": {"count": len(long), "which": long},
  }
  print(json.dumps(result))


if __name__ == "__main__":
  main()
