"""benchmarks/test_times.py's figures from a pytest JUnit XML report (benchmarking/junit.py)."""

from __future__ import annotations

from flaxformer_nmt.benchmarking import junit

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.unit.test_a" name="test_one" time="2.5" />
<testcase classname="tests.unit.test_a" name="test_two[x]" time="0.5"><failure message="no"/>
</testcase>
<testcase classname="tests.unit.test_b.TestGroup" name="test_three" time="4.0" />
<testcase classname="tests.e2e.test_c" name="test_four@serve" time="1.0"><skipped/></testcase>
<testcase classname="tests.e2e.test_c" name="test_five" time="0.25"><error message="e"/>
</testcase>
</testsuite></testsuites>
"""


def test_files_outcomes_and_the_slowest(tmp_path):
  path = tmp_path / "report.xml"
  path.write_text(REPORT)
  got = junit.summarize(str(path), seconds=90.04, returncode=1, slowest=2)
  assert got["seconds"] == 90.0 and got["minutes"] == 1.5 and got["returncode"] == 1
  assert got["tests"] == 5 and got["test_seconds"] == 8.2
  assert got["outcomes"] == {"passed": 2, "failure": 1, "skipped": 1, "error": 1}
  # A test in a class counts to its file; files in descending time.
  assert got["files"] == {
    "tests/unit/test_b.py": 4.0,
    "tests/unit/test_a.py": 3.0,
    "tests/e2e/test_c.py": 1.2,
  }
  assert list(got["files"]) == [
    "tests/unit/test_b.py",
    "tests/unit/test_a.py",
    "tests/e2e/test_c.py",
  ]
  assert got["slowest"] == [
    {"test": "tests/unit/test_b.py::test_three", "seconds": 4.0},
    {"test": "tests/unit/test_a.py::test_one", "seconds": 2.5},
  ]
