"""Every mistake a user can make is one line (`error: ...`), exit status 2, and touches nothing.

The table of mistakes runs in this process, through what `main.py` runs: flag mistakes through
`cli.parse_flags` (which prints the line and exits 2), the rest through the mode functions, which
must raise a `UserError` whose message is one line naming the culprit (`cli.main` prints exactly
that and exits 2). Where the workdir already holds a trained run, every file in it must be
byte-for-byte and timestamp-for-timestamp as it was. tests/e2e/test_errors.py runs two cases as
`python main.py` subprocesses, checking the wrapper itself end to end.
"""

from __future__ import annotations

import logging
import pathlib
import re
import sys

import pytest
from absl import flags

from flaxformer_nmt import cli, errors

import helpers
from error_cases import CASES, FLAG_CASES, arguments
from error_runner import run_mode

ERRORS_PAGE = helpers.REPO / "docs" / "errors.md"


def documented_lines() -> dict[str, str]:
  """docs/errors.md's table of mistakes: {the mistake: the line it prints}."""
  rows = re.findall(r"^\| ([^|`]+?) \| `(error: [^`]+)` \|$", ERRORS_PAGE.read_text("utf-8"), re.M)
  return dict(rows)


DOCUMENTED = documented_lines()


def as_documented(line: str, folder: pathlib.Path) -> str:
  """The line as docs/errors.md writes it: the case's scratch folder as DIR, a free port as PORT."""
  line = line.replace(str(folder), "DIR")
  return re.sub(r"--port=\d+(: cannot listen)", r"--port=PORT\1", line)


def test_the_errors_page_documents_every_case_and_no_other():
  assert sorted(DOCUMENTED) == sorted(c.name for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_one_line_exit_2_and_nothing_touched(case, tmp_path, monkeypatch, capsys):
  """Each case on a copy of the committed small trained workdir (tests/unit/conftest.py)."""
  monkeypatch.chdir(helpers.REPO)  # the paths in the arguments are a clone's (configs/demo.py)
  args = arguments(case, tmp_path)
  for name, value in (a[4:].split("=", 1) for a in args if a.startswith("ENV:")):
    monkeypatch.setenv(name, value)
  args = [a for a in args if not a.startswith("ENV:")]
  workdir = pathlib.Path(args[0].split("=", 1)[1]) if case.trained else None
  before = helpers.snapshot(workdir) if workdir else {}
  if case.name in FLAG_CASES:
    argv, saved = ["main.py", *args], sys.argv[:]
    sys.argv[:] = argv  # ml_collections finds `--config.x=y` overrides in sys.argv itself
    absl_level = logging.getLogger("absl").level
    flags.FLAGS.unparse_flags()  # a flag the case before gave would still count as present
    try:
      with pytest.raises(SystemExit) as exit_info:
        cli.parse_flags(argv)
    finally:
      sys.argv[:] = saved
      # Flags set absl's logger to --verbosity's level (WARNING): a later test in this worker
      # would no longer see INFO lines in caplog (test_data_pipeline.py's drop counts did not).
      logging.getLogger("absl").setLevel(absl_level)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    line = lines[0]
  else:
    with pytest.raises(errors.UserError) as error_info:
      run_mode(args)
    line = f"error: {' '.join(str(error_info.value).split())}"  # exactly what cli.main prints
  assert case.culprit in line, line
  print(f"{case.name}: {line}")
  assert DOCUMENTED.get(case.name) == as_documented(line, tmp_path), "docs/errors.md's row"
  if workdir is not None:
    assert before and helpers.snapshot(workdir) == before
    assert (workdir / "checkpoints").is_dir()
