"""Checkpoint save / resume / fallback / averaging on tiny train states (fast, CPU)."""

from __future__ import annotations

import os
import pathlib

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
