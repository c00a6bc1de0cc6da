"""Checkpoint averaging and the parameters that eval and translate load.

The paper averages the last 5 (base) or 20 (big) checkpoints; the mean is saved with orbax under
`<workdir>/averaged/<step>` (named after the newest averaged step), next to the training
checkpoints that `checkpoint.py` writes. `load_inference_params` picks one of the two.
"""

from __future__ import annotations

from typing import Sequence

import flax.serialization
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from flaxformer_nmt.checkpoint import (
    CHECKPOINTS,
    CheckpointError,
    PyTree,
    WHICH,
    _Unreadable,
    _DATA,
    _STATE,
    _host_leaf,
    _manager,
    _newest_readable,
    _read_step,
    _state_dict,
    _step_path,
    averaged_dir,
    checkpoint_dir,
)


def _params_template(template: PyTree) -> PyTree:
  """Accepts a TrainState(-like) template or a params tree."""
  return template.params if hasattr(template, "params") else template


def _training_dir(workdir_or_ckpt_dir: str) -> epath.Path:
  path = epath.Path(workdir_or_ckpt_dir)
  return path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path


def _existing_steps(directory: epath.Path) -> list[int]:
  if not directory.is_dir():
    return []
  return sorted(_manager(directory, read_only=True).all_steps())


def average_checkpoints(
    workdir_or_ckpt_dir: str, num_checkpoints: int, template: PyTree
) -> tuple[PyTree, list[int]]:
  """The mean of the params of the last `num_checkpoints` saved checkpoints, and their steps.

  The paper averages the last 5 (base) or 20 (big) checkpoints, written at 10-minute intervals.
  Sums are taken in float64 so the mean of K equal checkpoints is exactly that checkpoint.
  """
  if num_checkpoints < 1:
    raise ValueError(f"--num_checkpoints must be >= 1, got {num_checkpoints}.")
  directory = _training_dir(workdir_or_ckpt_dir)
  steps = _existing_steps(directory)
  if len(steps) < num_checkpoints:
    raise ValueError(
        f"--num_checkpoints={num_checkpoints} but {directory} holds {len(steps)} checkpoint(s)"
        + (f" (steps {', '.join(map(str, steps))})." if steps else ".")
    )
  chosen = steps[-num_checkpoints:]
  params_template = _params_template(template)
  template_sd = {"params": _state_dict(params_template)}
  manager = _manager(directory, read_only=True)
  total: PyTree = None
  newest: PyTree = None
  for step in chosen:
    try:
      state_sd, _ = _read_step(manager, step, template_sd, with_data=False)
    except _Unreadable as e:
      raise CheckpointError(
          f"Cannot average: checkpoint {e.path} is unreadable ({e.reason})."
      ) from e
    params = state_sd["params"]
    as64 = jax.tree.map(lambda x: x.astype(np.float64) if _is_float(x) else x, params)
    total = as64 if total is None else jax.tree.map(
        lambda t, x: t + x if _is_float(x) else x, total, as64
    )
    newest = params
  mean = jax.tree.map(
      lambda t, x: (t / num_checkpoints).astype(x.dtype) if _is_float(x) else x, total, newest
  )
  logging.info("Averaged the params of %d checkpoints of %s: steps %s.", len(chosen), directory,
               chosen)
  return flax.serialization.from_state_dict(params_template, mean), chosen


def _is_float(x: np.ndarray) -> bool:
  return np.issubdtype(x.dtype, np.floating)


def save_averaged(workdir: str, params: PyTree, steps: Sequence[int]) -> str:
  """Writes averaged `params` (of checkpoints `steps`) to `<workdir>/averaged/<newest step>`.

  Returns its path. Averaging the same newest step again (e.g. with another K) replaces that
  averaged checkpoint, which can be recomputed; averages named after older steps are kept.
  """
  steps = [int(s) for s in steps]
  if not steps:
    raise ValueError("save_averaged() needs the steps that were averaged.")
  manager = _manager(epath.Path(averaged_dir(workdir)))
  step = steps[-1]
  if step in manager.all_steps():
    logging.info("Replacing the averaged checkpoint %s.", _step_path(manager, step))
    manager.delete(step)
  info = {"averaged_steps": steps, "num_checkpoints": len(steps)}
  host = {"params": jax.tree.map(_host_leaf, _state_dict(params))}
  manager.save(
      step,
      args=ocp.args.Composite(
          **{_STATE: ocp.args.PyTreeSave(host), _DATA: ocp.args.JsonSave(info)}
      ),
      force=True,
  )
  manager.close()
  path = str(_step_path(manager, step))
  logging.info("Wrote the average of steps %s to %s.", steps, path)
  return path


def resolve_inference_source(workdir: str, which: str = "auto") -> str:
  """'averaged' or 'latest': which checkpoint `load_inference_params` will read (cheap: lists
  directories only, so eval and translate fail on a workdir without checkpoints before any work).
  """
  if which not in WHICH:
    raise ValueError(f"which must be one of {WHICH}, got {which!r}.")
  train_dir, avg_dir = epath.Path(checkpoint_dir(workdir)), epath.Path(averaged_dir(workdir))
  train_steps, avg_steps = _existing_steps(train_dir), _existing_steps(avg_dir)
  if which == "averaged" and not avg_steps:
    raise ValueError(
        f"No averaged checkpoint in {avg_dir}; make one with --mode=average --num_checkpoints=K."
    )
  if which == "latest" and not train_steps:
    raise ValueError(
        f"No training checkpoint in {train_dir}; train with --workdir={workdir} first."
    )
  if which == "auto":
    if not train_steps and not avg_steps:
      raise ValueError(f"No checkpoint in {workdir}; train with --workdir={workdir} first.")
    which = "averaged" if avg_steps else "latest"
    if avg_steps and train_steps and train_steps[-1] > avg_steps[-1]:
      logging.warning(
          "The averaged checkpoint (step %d) is older than the newest training checkpoint (step "
          "%d); using the latter. Rerun --mode=average to average the newest ones.",
          avg_steps[-1], train_steps[-1],
      )
      which = "latest"

  return which


def training_steps(workdir: str) -> list[int]:
  """Steps of the training checkpoints in `workdir`, oldest first."""
  return _existing_steps(epath.Path(checkpoint_dir(workdir)))


def load_inference_params(
    workdir: str, template_params: PyTree, which: str = "auto"
) -> tuple[PyTree, str]:
  """Params for translation and evaluation, and a line saying where they came from.

  'auto' takes the averaged checkpoint unless training has saved a newer checkpoint since it was
  made (then the newest training checkpoint, with a warning), 'averaged' and 'latest' force one.
  An unreadable newest checkpoint falls back to the previous one with a warning; nothing is moved.
  """
  which = resolve_inference_source(workdir, which)
  train_dir, avg_dir = epath.Path(checkpoint_dir(workdir)), epath.Path(averaged_dir(workdir))
  directory = avg_dir if which == "averaged" else train_dir
  params_template = _params_template(template_params)
  found = _newest_readable(
      _manager(directory, read_only=True),
      {"params": _state_dict(params_template)},
      with_data=which == "averaged",
  )
  assert found is not None  # steps were listed above
  step, state_sd, info = found
  path = directory / str(step)
  # The first word is a tag callers use in output file names ("averaged", "step1000").
  if which == "averaged":
    averaged = (info or {}).get("averaged_steps", [step])
    description = f"averaged params of {len(averaged)} checkpoints (steps {averaged}) in {path}"
  else:
    description = f"step{step} params (the newest readable training checkpoint) in {path}"
  logging.info("Loaded %s.", description)
  return flax.serialization.from_state_dict(params_template, state_sd["params"]), description
