"""Checkpoint averaging and the parameters that eval and translate load.

The paper averages the last 5 (base) or 20 (big) checkpoints; the mean is saved with orbax under
`<workdir>/averaged/<step>` (named after the newest averaged step), next to the training
checkpoints that `checkpoint.py` writes. `load_inference_params` picks what --checkpoint names:
those, the best dev evaluation's parameters in `<workdir>/best/`, or the parameter average (EMA)
inside the newest training checkpoint. Everything
here reads through `checkpoint_reader.CheckpointDir` and writes through `checkpoint.write`.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.serialization
import jax
import numpy as np
from absl import logging

from flaxformer_nmt.checkpoints import checkpointer as checkpoint
from flaxformer_nmt.checkpoints import reader as checkpoint_reader
from flaxformer_nmt.errors import CheckpointError
from flaxformer_nmt.runtime import files
from flaxformer_nmt.training import optim

PyTree = checkpoint.PyTree


def _params_template(template: PyTree) -> PyTree:
  """Accepts a TrainState(-like) template or a params tree."""
  return template.params if hasattr(template, "params") else template


def _is_float(x: np.ndarray) -> bool:
  return np.issubdtype(x.dtype, np.floating)


def _best_step(workdir: str) -> int:
  steps = checkpoint_reader.CheckpointDir(checkpoint.best_dir(workdir)).steps()
  if not steps:
    raise CheckpointError(
      f"--checkpoint=best: no best checkpoint in {checkpoint.best_dir(workdir)}; train with "
      "config.best_metric='dev_bleu' or 'dev_loss' to keep one."
    )
  return steps[-1]


def check_num_checkpoints(workdir: str, num_checkpoints: int, which: str = "latest") -> list[int]:
  """The steps `--num_checkpoints` would average; CheckpointError if there are not that many.

  `which`: "latest" (or "auto") the newest K, "best" the newest K up to the best step, "ema"
  the newest K's parameter averages.
  """
  if which not in ("auto", "latest", "best", "ema"):
    raise CheckpointError(
      f"--mode=average --checkpoint={which}: average reads training checkpoints; use auto, "
      "latest, best (the K up to the best step) or ema (their parameter averages)."
    )
  if which == "ema":
    resolve_inference_source(workdir, "ema")  # one line if the run kept no average
  steps = checkpoint_reader.CheckpointDir(checkpoint.checkpoint_dir(workdir)).steps()
  scope = ""
  if which == "best":
    best = _best_step(workdir)
    steps, scope = [s for s in steps if s <= best], f" up to the best step {best}"
  if not 1 <= num_checkpoints <= len(steps):
    raise CheckpointError(
      f"--num_checkpoints={num_checkpoints}, but {checkpoint.checkpoint_dir(workdir)} holds "
      f"{len(steps)} checkpoints{scope}"
      + (f" (steps {steps})" if steps else "")
      + "; it must be between 1 and that (raise config.keep_checkpoints to keep more)."
    )
  return steps[-num_checkpoints:]


def average_checkpoints(
  workdir: str, num_checkpoints: int, template: PyTree, which: str = "latest"
) -> tuple[PyTree, list[int]]:
  """The mean of the params (or, `which="ema"`, of the parameter averages) of the training
  checkpoints `check_num_checkpoints` chooses, and their steps.

  Sums are taken in float64 so the mean of K equal checkpoints is exactly that checkpoint.
  """
  chosen = check_num_checkpoints(workdir, num_checkpoints, which)
  reader = checkpoint_reader.CheckpointDir(checkpoint.checkpoint_dir(workdir))
  params_template = _params_template(template)
  path_in_state = optim.EMA_PATH if which == "ema" else ("params",)
  template_sd = _nest(path_in_state, checkpoint_reader.state_dict(params_template))
  total: PyTree = None
  newest: PyTree = None
  for step in chosen:
    try:
      state_sd, _ = reader.read(step, template_sd)
    except checkpoint_reader.Unreadable as e:
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
    lambda t, x: (t / num_checkpoints).astype(x.dtype) if _is_float(x) else x, total, newest
  )
  logging.info(
    "Averaged the params of %d checkpoints of %s: steps %s.", len(chosen), reader.directory, chosen
  )
  return flax.serialization.from_state_dict(params_template, mean), chosen


def save_averaged(workdir: str, params: PyTree, steps: Sequence[int], of: str = "params") -> str:
  """Writes averaged `params` (of checkpoints `steps`) to `<workdir>/averaged/<newest step>`.

  Returns its path. Averaging the same newest step again (e.g. with another K) replaces that
  averaged checkpoint, which can be recomputed; averages named after older steps are kept.
  """
  steps = [int(s) for s in steps]
  info = {"averaged_steps": steps, "num_checkpoints": len(steps), "of": of}
  path = checkpoint.write(
    checkpoint.averaged_dir(workdir), steps[-1], {"params": params}, info, replace=True
  )
  logging.info("Wrote the average of steps %s to %s.", steps, path)
  return path


def resolve_inference_source(workdir: str, which: str = "auto") -> str:
  """'averaged' or 'latest': which checkpoint `load_inference_params` will read (cheap: lists
  directories only, so eval and translate fail on a workdir without checkpoints before any work).
  """
  if which not in checkpoint.WHICH:
    raise ValueError(f"which must be one of {checkpoint.WHICH}, got {which!r}.")
  train_dir, avg_dir = checkpoint.checkpoint_dir(workdir), checkpoint.averaged_dir(workdir)
  train_steps = checkpoint_reader.CheckpointDir(train_dir).steps()
  avg_steps = checkpoint_reader.CheckpointDir(avg_dir).steps()
  if which == "averaged" and not avg_steps:
    raise CheckpointError(
      f"No averaged checkpoint in {avg_dir}; make one with --mode=average --num_checkpoints=K."
    )
  if which in ("latest", "ema") and not train_steps:
    raise CheckpointError(
      f"No training checkpoint in {train_dir}; train with --workdir={workdir} first."
    )
  if which == "ema" and not _trained_with_ema(workdir):
    raise CheckpointError(
      f"--checkpoint=ema: {workdir} was not trained with config.optim.ema_decay > 0 (its "
      "config.json says so), so its checkpoints hold no parameter average."
    )
  if which == "best":
    _best_step(workdir)  # fails with one line if there is none
  if which == "auto":
    if not train_steps and not avg_steps:
      raise CheckpointError(f"No checkpoint in {workdir}; train with --workdir={workdir} first.")
    which = "averaged" if avg_steps else "latest"
    if avg_steps and train_steps and train_steps[-1] > avg_steps[-1]:
      logging.warning(
        "The averaged checkpoint (step %d) is older than the newest training checkpoint (step "
        "%d); using the latter. Rerun --mode=average to average the newest ones.",
        avg_steps[-1],
        train_steps[-1],
      )
      which = "latest"
  return which


def _trained_with_ema(workdir: str) -> bool:
  """Whether the run saved in `workdir/config.json` kept a parameter average (True if unknown:
  then the checkpoint's own metadata decides)."""
  saved = files.saved_config(workdir)
  return bool(saved.get("optim", {}).get("ema_decay", 0.0)) if saved else True


def inference_dir(workdir: str, which: str) -> str:
  """The checkpoint folder that `which` (as resolved: not 'auto') reads from."""
  if which == "averaged":
    return checkpoint.averaged_dir(workdir)
  if which == "best":
    return checkpoint.best_dir(workdir)
  return checkpoint.checkpoint_dir(workdir)


def _nest(path: Sequence[str], tree: PyTree) -> PyTree:
  """{path[0]: {path[1]: ... tree}}: a template for a subtree deep inside a saved state."""
  for key in reversed(path):
    tree = {key: tree}
  return tree


def load_inference_params(
  workdir: str, template_params: PyTree, which: str = "auto"
) -> tuple[PyTree, str]:
  """Params for translation and evaluation, and a line saying where they came from.

  'auto' takes the averaged checkpoint unless training has saved a newer checkpoint since it was
  made (then the newest training checkpoint, with a warning), 'averaged' and 'latest' force one.
  A corrupt newest checkpoint falls back to the previous one with a warning; nothing is moved.
  """
  which = resolve_inference_source(workdir, which)
  reader = checkpoint_reader.CheckpointDir(inference_dir(workdir, which))
  params_template = _params_template(template_params)
  # The EMA is read alone from the training state (Adam's moments stay on disk).
  path_in_state = optim.EMA_PATH if which == "ema" else ("params",)
  found = reader.newest_readable(
    _nest(path_in_state, checkpoint_reader.state_dict(params_template)),
    with_data=which in ("averaged", "best"),
  )
  assert found is not None  # steps were listed above
  step, state_sd, info = found
  for key in path_in_state:
    state_sd = state_sd[key]
  path = reader.path(step)
  # The first word is a tag callers use in output file names ("averaged", "step1000").
  if which == "averaged":
    averaged = (info or {}).get("averaged_steps", [step])
    of = (info or {}).get("of", "params")
    description = f"averaged {of} of {len(averaged)} checkpoints (steps {averaged}) in {path}"
  elif which == "best":
    info = info or {}
    description = (
      f"best params ({info.get('parameters', 'params')} of step {step}, "
      f"{info.get('metric')} {info.get('value')}) in {path}"
    )
  elif which == "ema":
    description = f"ema{step} params (the parameter average of step {step}) in {path}"
  else:
    description = f"step{step} params (the newest readable training checkpoint) in {path}"
  logging.info("Loaded %s.", description)
  return flax.serialization.from_state_dict(params_template, state_sd), description
