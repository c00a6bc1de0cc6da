r"""How long the tests take: each tier from an empty compilation cache, then again warm.

  python benchmarks/test_times.py                      # the unit tier, then the README's command
  python benchmarks/test_times.py --tiers=unit         # the unit tier alone (about 5 minutes)

For each tier a new, empty folder becomes the tests' kept compilation cache
(FLAXFORMER_NMT_TEST_CACHE, tests/jax_caches.py), and the tier runs twice with the same command a
developer types: first cold (what a new machine and CI's first run get), then warm (what every
later run gets). The unit tier also runs `-m "not slow"` warm: the edit-test loop of
docs/developing.md. Each run's wall-clock seconds (pytest's start to exit), its counts, its
per-file totals and its 20 slowest tests (setup and teardown included, from pytest's JUnit XML)
go into the record, with where JAX's time went in the test processes (`jax`: programs
compiled, seconds compiling, tracing and lowering, in all, per file and per program;
tests/compile_profile.py; not the commands end-to-end tests launch). The figures so far are
written after every run (<record>.json.partial, until the record replaces it), so a long run
loses nothing.
Last line JSON, recorded in benchmarks/results/<--record>.json (default test_times).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app, flags

from flaxformer_nmt.benchmarking import junit, record
from flaxformer_nmt.runtime import files

_TIERS = flags.DEFINE_list("tiers", ["unit", "all"], "unit: tests/unit; all: the README's command.")
_WORKERS = flags.DEFINE_integer("workers", 2, "pytest-xdist workers (-n), as the README's command.")
_SLOWEST = flags.DEFINE_integer("slowest", 20, "How many of the slowest tests each run lists.")
_PATHS = flags.DEFINE_list(
  "paths", [], "Test paths every tier runs instead of its own (a quick check of this script)."
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What each tier runs: the README's test command and docs/developing.md's (python -m pytest ...).
PATHS = {"unit": ["tests/unit"], "all": ["tests"]}
_INHERITED = ("PYTEST_", "XLA_FLAGS", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")


def run_tier(paths: list[str], cache: str, scratch: str, name: str, *extra: str) -> dict[str, Any]:
  """Runs `python -m pytest -q -n W <paths> <extra>` against the tests' cache `cache`."""
  report = os.path.join(scratch, f"{name}.xml")
  argv = [sys.executable, "-m", "pytest", "-q", "-n", str(_WORKERS.value), *paths, *extra]
  # As a developer's shell runs it: nothing of a pytest or JAX set-up this script may run under.
  env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED)}
  env["FLAXFORMER_NMT_TEST_CACHE"] = cache
  print(f"[{name}] {' '.join(argv[1:])} (cache {cache})", flush=True)
  start = time.perf_counter()
  profile = os.path.join(scratch, f"{name}.compile.json")
  proc = subprocess.run(
    [*argv, f"--junitxml={report}", f"--compile-profile={profile}", "-p", "no:cacheprovider"],
    cwd=REPO,
    env=env,
  )
  seconds = time.perf_counter() - start
  result = junit.summarize(report, seconds, proc.returncode, _SLOWEST.value)
  if os.path.exists(profile):  # where JAX's time went (tests/compile_profile.py)
    with open(profile) as f:
      result["jax"] = json.load(f)
  result["command"] = " ".join(["python", *argv[1:]])
  print(f"[{name}] {result['seconds']} s, {result['outcomes']}", flush=True)
  return result


def _progress(name: str, result: dict[str, Any]) -> None:
  """The figures so far, beside the record (<name>.json.partial, removed when the record is
  written): the record itself would be read by the very tests being timed (test_figures.py)."""
  if record.RESULTS_DIR.value != "none":
    os.makedirs(record.results_dir(), exist_ok=True)
    path = os.path.join(record.results_dir(), f"{name}.json.partial")
    files.write_text(
      path, json.dumps(record.make_record(name, result, record.command_line(sys.argv)))
    )


def main(argv: list[str]) -> None:
  del argv
  unknown = set(_TIERS.value) - set(PATHS)
  if unknown:
    raise app.UsageError(f"--tiers: unknown {sorted(unknown)} (unit, all)")
  result: dict[str, Any] = {"workers": _WORKERS.value}
  name = record.RECORD.value or "test_times"
  with tempfile.TemporaryDirectory(prefix="test_times_") as scratch:
    for tier in _TIERS.value:
      cache = os.path.join(scratch, f"{tier}_cache")  # empty: the cold run fills it
      runs = result.setdefault(tier, {})
      paths = _PATHS.value or PATHS[tier]
      runs["cold"] = run_tier(paths, cache, scratch, f"{tier}_cold")
      _progress(name, result)  # nothing lost if stopped later
      runs["warm"] = run_tier(paths, cache, scratch, f"{tier}_warm")
      _progress(name, result)
      if tier == "unit":
        runs["not_slow_warm"] = run_tier(paths, cache, scratch, "unit_not_slow", "-m", "not slow")
  failed = [f"{t}/{r}" for t in _TIERS.value for r, x in result[t].items() if x["returncode"]]
  result["failed_runs"] = failed
  record.report(result)
  partial = os.path.join(record.results_dir(), f"{name}.json.partial")
  if os.path.exists(partial):
    os.remove(partial)
  if failed:
    sys.exit(f"test_times: these runs failed: {failed}")


if __name__ == "__main__":
  app.run(main)
