"""Small train states and checkpointers for the checkpoint tests (tests/unit/test_checkpoint.py,
test_averaging.py): states with Adam moments that are not all zero, saved at chosen steps, and a
bitwise comparison of trees."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import optax

from flaxformer_nmt.checkpoints import checkpointer as checkpoint
from flaxformer_nmt.training.steps import TrainState


def make_state(seed: int, step: int = 3, width: int = 8) -> TrainState:
  """A TrainState with Adam moments that are not all zero, all leaves host numpy."""
  rng = np.random.default_rng(seed)
  params = {
    "embed": {"embedding": rng.standard_normal((11, width)).astype(np.float32)},
    "dense": {
      "kernel": rng.standard_normal((width, 4)).astype(np.float32),
      "bias": rng.standard_normal((4,)).astype(np.float32),
    },
  }
  tx = optax.adam(1e-3)
  opt_state = tx.init(params)
  grads = jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(np.float32), params)
  _, opt_state = tx.update(grads, opt_state, params)
  state = TrainState(
    step=np.int32(step),
    params=params,
    opt_state=opt_state,
    rng=np.asarray(jax.random.PRNGKey(seed)),
  )
  return jax.device_get(state)


def abstract(state: TrainState) -> TrainState:
  return jax.eval_shape(lambda s: s, state)


def assert_bitwise_equal(a, b) -> None:
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b, strict=True):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


def new_ckpt(path: pathlib.Path, keep: int = 3, every_steps: int = 0, every_secs: float = 0.0):
  return checkpoint.Checkpointer(
    str(path), keep=keep, every_steps=every_steps, every_secs=every_secs
  )


def save_steps(ckpt: checkpoint.Checkpointer, steps, width: int = 8) -> dict[int, TrainState]:
  states = {}
  for s in steps:
    states[s] = make_state(seed=s, step=s, width=width)
    assert ckpt.save(s, lambda: (states[s], {"epoch": 0, "index": 100 * s}), force=True)
  ckpt.wait_until_finished()
  return states
