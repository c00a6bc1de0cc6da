"""main.py's one-line errors end to end: two cases of the table (tests/unit/test_errors.py runs all
of them in process) as `python main.py` subprocesses, a second training job on a held workdir,
and an internal error, which keeps its traceback.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time

import pytest

import helpers
from error_cases import CASES, arguments


@pytest.mark.parametrize(
  "name", ["shape-mismatched checkpoint", "unknown flag"], ids=["mode error", "flag error"]
)
def test_main_py_prints_one_line_exits_2_and_touches_nothing(name, tmp_path):
  """The wrapper end to end, as a user runs it: a mistake found deep in a mode and one in the
  flags, each the last line of stderr, exit status 2, no traceback."""
  (case,) = [c for c in CASES if c.name == name]
  args = arguments(case, tmp_path)
  workdir = pathlib.Path(args[0].split("=", 1)[1])
  before = helpers.snapshot(workdir)
  # JAX_PLATFORMS unset, as on a user's machine: JAX then tries its TPU backend too (and logs
  # that it found none), which the test session's `cpu` would spare it.
  result = helpers.run_main(*args, env={"JAX_PLATFORMS": ""})
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors_printed = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors_printed) == 1 and case.culprit in errors_printed[0], result.stderr[-3000:]
  assert errors_printed[0] == result.stderr.strip().splitlines()[-1]
  # No library chatter around it: JAX's "no TPU backend" INFO line, orbax's "read only" warning.
  assert "xla_bridge" not in result.stderr and "read only" not in result.stderr, result.stderr
  if name == "unknown flag":  # found before any work: the line is all there is
    assert result.stderr.strip().splitlines() == errors_printed, result.stderr
  assert helpers.snapshot(workdir) == before


def test_a_mistake_found_before_any_work_is_the_only_stderr_line_and_leaves_no_folder(tmp_path):
  """Issue 52: eval of a folder without checkpoints first logged "Compilation cache: ..." (the
  cache was set up before the checks); a new run refused for a missing corpus left its empty
  folder behind."""
  (tmp_path / "empty").mkdir()
  eval_empty = helpers.run_main(
    "--config=configs/demo.py", f"--workdir={tmp_path / 'empty'}", "--mode=eval"
  )
  assert eval_empty.returncode == 2, eval_empty.stderr[-3000:]
  lines = eval_empty.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: No checkpoint in"), eval_empty.stderr
  new = tmp_path / "runs" / "new"
  no_corpus = helpers.run_main(
    "--config=multi30k", f"--config.data.dir={tmp_path / 'nothing'}", f"--workdir={new}"
  )
  assert no_corpus.returncode == 2, no_corpus.stderr[-3000:]
  assert no_corpus.stderr.strip().splitlines()[-1].startswith("error: data.")
  assert not new.exists()  # the run folder it made is gone (runs/, made on the way, stays)


def test_a_second_training_job_on_a_workdir_stops_at_once(tmp_path):
  """A real training job holds the workdir; a second one names it, and leaves it be."""
  workdir = tmp_path / "w"
  first = subprocess.Popen(
    [
      sys.executable,
      "main.py",
      "--config=configs/demo.py",
      f"--workdir={workdir}",
      "--config.num_train_steps=100000",
      "--config.data.demo_train_size=2000",
      "--config.checkpoint_every_steps=100000",
      "--config.log_every_steps=1",
    ],
    cwd=helpers.REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    lock, training = workdir / "train.lock", workdir / "train_metrics.jsonl"
    deadline = time.time() + 120
    while not training.exists() and first.poll() is None and time.time() < deadline:
      time.sleep(0.2)  # until the first job trains (and handles SIGTERM as a preemption)
    assert training.exists(), first.stderr.read() if first.poll() is not None else "not training"
    held = lock.read_text()
    second = helpers.run_main("--config=configs/demo.py", f"--workdir={workdir}")
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "another training job holds this workdir" in line
    assert f"pid {first.pid}" in line and "host " in line and "started " in line
    print(line)
    assert lock.read_text() == held and first.poll() is None  # the first job goes on
  finally:
    first.send_signal(signal.SIGTERM)  # a preemption: it saves and exits cleanly
    _, err = first.communicate(timeout=120)
  assert first.returncode == 0, err[-3000:]
  assert not lock.exists()


def test_an_internal_error_keeps_its_traceback(tmp_path):
  """A bug (here: the train step raising) is not a user error: the traceback shows where."""
  script = tmp_path / "broken_main.py"
  script.write_text(
    "import runpy, sys\n"
    f"sys.path.insert(0, {str(helpers.REPO)!r})\n"
    "from flaxformer_nmt.training import steps\n"
    "def broken(*args, **kwargs):\n"
    "  raise KeyError('a bug inside the train step')\n"
    "steps.train_step = broken\n"
    f"sys.argv[0] = {str(helpers.REPO / 'main.py')!r}\n"
    f"runpy.run_path({str(helpers.REPO / 'main.py')!r}, run_name='__main__')\n"
  )
  result = subprocess.run(
    [
      sys.executable,
      str(script),
      "--config=configs/demo.py",
      f"--workdir={tmp_path / 'w'}",
      "--config.data.demo_train_size=500",
    ],
    cwd=helpers.REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback (most recent call last)" in result.stderr
  assert "in broken" in result.stderr and "KeyError: 'a bug inside the train step'" in (
    result.stderr
  )
  assert "error: " not in result.stderr
  assert not (tmp_path / "w" / "train.lock").exists()  # released on the way out
