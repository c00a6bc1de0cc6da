"""Checkpoint save / resume / fallback / averaging on tiny train states (fast, CPU)."""

from __future__ import annotations

import os
import pathlib
import re

import jax
import numpy as np

from flaxformer_nmt.checkpoints import checkpointer as checkpoint


def new_ckpt(path: pathlib.Path, keep: int = 3, every_steps: int = 0, every_secs: float = 0.0):
  return checkpoint.Checkpointer(
    str(path), keep=keep, every_steps=every_steps, every_secs=every_secs
  )


def test_a_save_in_flight_lands_when_the_program_exits_by_an_exception(tmp_path):
  """The loop may die (non-finite loss, failing eval) right after starting an asynchronous save."""
  import subprocess
  import sys

  script = (
    "import sys, numpy as np\n"
    "from flaxformer_nmt.checkpoints import checkpointer as checkpoint\n"
    "ckpt = checkpoint.Checkpointer(sys.argv[1], keep=1, every_steps=0)\n"
    "state = {'params': {'w': np.ones((2048, 2048), np.float32)}, 'step': np.int32(1)}\n"
    "ckpt.save(1, lambda: (state, {'index': 1}), force=True)\n"
    "raise SystemExit(3)  # no close(): the exit hook must finish the save\n"
  )
  proc = subprocess.run(
    [sys.executable, "-c", script, str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert proc.returncode == 3, proc.stderr[-3000:]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1"], proc.stderr[-3000:]
  with new_ckpt(tmp_path) as ckpt:
    state = {
      "params": {"w": jax.ShapeDtypeStruct((2048, 2048), np.float32)},
      "step": jax.ShapeDtypeStruct((), np.int32),
    }
    restored, data, step = ckpt.restore(state)
  assert step == 1 and data == {"index": 1} and restored["params"]["w"].min() == 1.0


def test_a_damaged_newest_checkpoint_is_one_warning_line_and_no_traceback(tmp_path):
  """Issue 60, defect 7: with the newest checkpoint's largest data file cut to a third, translate
  fell back to the previous checkpoint and translated (exit 0), as it should, but stderr carried
  hundreds of lines of `RuntimeError: Event loop is closed` tracebacks from orbax's reads still in
  flight. The handled fault is one warning line and nothing else."""
  import shutil  # pylint: disable=g-import-not-at-top

  import helpers  # pylint: disable=g-import-not-at-top

  work = tmp_path / "workdir"
  shutil.copytree(helpers.SAVED_RUN, work)
  data = sorted((work / "checkpoints" / "12" / "state" / "d").iterdir())
  biggest = max(data, key=lambda p: p.stat().st_size)
  biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 3])
  (tmp_path / "in.txt").write_text("I have three apples.\n")
  # Twice: the late reports come from threads, and how many is a matter of timing (one run in
  # six showed none of the asyncio task ones before they were filtered too).
  for _ in range(2):
    proc = helpers.run_main(
      f"--workdir={work}",
      "--mode=translate",
      "--checkpoint=latest",
      f"--input={tmp_path / 'in.txt'}",
      f"--output={tmp_path / 'out.txt'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "/checkpoints/8" in proc.stdout.splitlines()[-1]  # the fallback translated
    assert "Traceback" not in proc.stderr and "Event loop is closed" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert not [line for line in lines if re.match(r"E\d{4} ", line)], proc.stderr[-2000:]
    warnings = [line for line in lines if re.match(r"W\d{4} ", line)]
    assert len(warnings) == 1 and "checkpoints/12 is corrupt" in warnings[0], warnings
