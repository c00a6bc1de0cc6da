"""Checkpoint averaging: the mean of the parameters (or of their EMA) of the last K checkpoints.

The paper averages the last 5 (base) or 20 (big) checkpoints. Which K steps, and where the mean
is written, is `run.folder.Workdir`'s choice (`average_plan`, `save_average`); this module only
chooses among listed steps and computes the mean, reading through `reader.CheckpointDir`.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.serialization
import jax
import numpy as np
from absl import logging

from flaxformer_nmt.checkpoints import reader
from flaxformer_nmt.checkpoints.params import nest
from flaxformer_nmt.errors import CheckpointError

PyTree = reader.PyTree


def _is_float(x: np.ndarray) -> bool:
  return np.issubdtype(x.dtype, np.floating)


def last_steps(
  steps: Sequence[int], num_checkpoints: int, directory: str, scope: str = ""
) -> list[int]:
  """The newest `num_checkpoints` of `steps`; CheckpointError if there are not that many.

  `scope` says which steps were offered (" up to the best step 400"), for the message.
  """
  steps = list(steps)
  if not 1 <= num_checkpoints <= len(steps):
    raise CheckpointError(
      f"--num_checkpoints={num_checkpoints}, but {directory} holds {len(steps)} checkpoints"
      f"{scope}"
      + (f" (steps {steps})" if steps else "")
      + "; it must be between 1 and that (raise config.keep_checkpoints to keep more)."
    )
  return steps[-num_checkpoints:]


def average(
  directory: str, steps: Sequence[int], template_params: PyTree, path_in_state: Sequence[str]
) -> PyTree:
  """The mean of the subtree `path_in_state` (the params, or the EMA) of `directory`'s `steps`.

  Sums are taken in float64 so the mean of K equal checkpoints is exactly that checkpoint.
  """
  steps_dir = reader.CheckpointDir(directory)
  template_sd = nest(path_in_state, reader.state_dict(template_params))
  total: PyTree = None
  newest: PyTree = None
  for step in steps:
    try:
      state_sd, _ = steps_dir.read(step, template_sd)
    except reader.Unreadable as e:
      raise CheckpointError(
        f"Cannot average: checkpoint {e.path} is unreadable ({e.reason})."
      ) from e
    params = state_sd
    for key in path_in_state:
      params = params[key]
    as64 = jax.tree.map(lambda x: x.astype(np.float64) if _is_float(x) else x, params)
    total = (
      as64
      if total is None
      else jax.tree.map(lambda t, x: t + x if _is_float(x) else x, total, as64)
    )
    newest = params
  mean = jax.tree.map(
    lambda t, x: (t / len(steps)).astype(x.dtype) if _is_float(x) else x, total, newest
  )
  logging.info("Averaged %d checkpoints of %s: steps %s.", len(steps), directory, list(steps))
  return flax.serialization.from_state_dict(template_params, mean)
