"""A pytest run's figures from its JUnit XML report (benchmarks/test_times.py): counts, the time
each test file took, the slowest tests. Here, not in the script, so a unit test can check it."""

from __future__ import annotations

import collections
import xml.etree.ElementTree as ElementTree
from typing import Any


def _per_test(junit: str) -> list[tuple[str, str, float, str]]:
  """(file, test id, seconds, outcome) of each test in a JUnit XML report; seconds are pytest's
  whole test: setup, call and teardown (its junit_duration_report default)."""
  rows = []
  for case in ElementTree.parse(junit).getroot().iter("testcase"):
    parts = case.get("classname", "").split(".")  # tests.unit.test_x[.TestClass]
    modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
    file = "/".join(parts[: modules[-1] + 1]) + ".py" if modules else ".".join(parts)
    outcome = "passed"
    for kind in ("failure", "error", "skipped"):
      if case.find(kind) is not None:
        outcome = kind
    rows.append((file, f"{file}::{case.get('name')}", float(case.get("time", 0.0)), outcome))
  return rows


def summarize(junit: str, seconds: float, returncode: int, slowest: int) -> dict[str, Any]:
  """One run's figures: wall time, counts, per-file totals, the slowest tests."""
  rows = _per_test(junit)
  files: dict[str, float] = collections.Counter()
  for file, _, s, _ in rows:
    files[file] += s
  outcomes = collections.Counter(outcome for *_, outcome in rows)
  return {
    "seconds": round(seconds, 1),
    "minutes": round(seconds / 60, 2),
    "returncode": returncode,
    "tests": len(rows),
    "outcomes": dict(outcomes),
    "test_seconds": round(sum(s for _, _, s, _ in rows), 1),
    "files": {f: round(s, 1) for f, s in sorted(files.items(), key=lambda x: -x[1])},
    "slowest": [
      {"test": test, "seconds": round(s, 2)}
      for _, test, s, _ in sorted(rows, key=lambda r: -r[2])[:slowest]
    ],
  }
