"""The parameters eval, translate, export, attention and fine-tuning read: from where
`run.selection.resolve` says, checked against the model before anything is loaded.

A `Location` is one folder of orbax steps and the subtree wanted in its newest readable step: the
train state's `params`, the parameter average (EMA) inside a training checkpoint's optimizer
state, or the `params` of an average or of `best/`. A corrupt newest step falls back to the
previous one with a warning (checkpoints/reader.py's rules); nothing is moved.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import flax.serialization
from absl import logging

from flaxformer_nmt.checkpoints import reader
from flaxformer_nmt.errors import CheckpointError

PyTree = Any
PARAMS_PATH = ("params",)
# The parameter average (config.optim.ema_decay) inside a training checkpoint's state: the second
# optimizer transformation's state (training/optim.py builds the chain so).
EMA_PATH = ("opt_state", "1", "ema")


@dataclasses.dataclass(frozen=True)
class Location:
  """Where one set of inference parameters lives.

  kind: "latest", "averaged", "best" or "ema" (what --checkpoint resolved to).
  directory: the folder of orbax steps; its newest readable step is read.
  path_in_state: the subtree of the saved state that holds the parameters.
  with_data: whether the step's JSON item is read too (averages and best/ describe themselves).
  """

  kind: str
  directory: str
  path_in_state: tuple[str, ...] = PARAMS_PATH
  with_data: bool = False


def nest(path: Sequence[str], tree: PyTree) -> PyTree:
  """{path[0]: {path[1]: ... tree}}: a template for a subtree deep inside a saved state."""
  for key in reversed(path):
    tree = {key: tree}
  return tree


def check_fits(directory: str, template_params: PyTree) -> None:
  """CheckpointMismatchError, before anything is read, if `directory`'s newest step holds
  parameters of another model (another size or vocabulary); nothing if it holds no step.

  Only parameter names and shapes are compared, from the checkpoint's metadata; a step whose
  metadata cannot be read is left to the restore (which falls back past a corrupt one).
  """
  steps = reader.CheckpointDir(directory)
  saved = steps.steps()
  if not saved:
    return
  try:
    steps.check_matches(saved[-1], {"params": reader.state_dict(template_params)})
  except reader.Unreadable:
    pass


def describe(location: Location, step: int, info: dict[str, Any] | None, path: str) -> str:
  """One line saying which parameters were read. Its first word is a tag that output file names
  use ("averaged", "best", "ema600", "step600")."""
  info = info or {}
  if location.kind == "averaged" and info.get("imported_from"):
    return f"imported params (from {info['imported_from']}) in {path}"
  if location.kind == "averaged":
    steps = info.get("averaged_steps", [step])
    return (
      f"averaged {info.get('of', 'params')} of {len(steps)} checkpoints (steps {steps}) in {path}"
    )
  if location.kind == "best":
    return (
      f"best params ({info.get('parameters', 'params')} of step {step}, {info.get('metric')} "
      f"{info.get('value')}) in {path}"
    )
  if location.kind == "ema":
    return f"ema{step} params (the parameter average of step {step}) in {path}"
  return f"step{step} params (the newest readable training checkpoint) in {path}"


def tag(location: Location, step: int) -> str:
  """The parameters, for file names: `step600`, `ema600`, `best-step400`, or the average's own
  name (`averaged-params_5_steps_200_to_600`), so files of different parameters never collide."""
  if location.kind == "averaged":
    name = os.path.basename(os.path.normpath(location.directory))
    if name == "imported":  # run/selection.save_imported
      return name
    return f"averaged-{name}" if name != "averaged" else f"averaged-step{step}"
  if location.kind == "best":
    return f"best-step{step}"
  if location.kind == "ema":
    return f"ema{step}"
  return f"step{step}"


def load(location: Location, template_params: PyTree) -> tuple[PyTree, str]:
  """(the parameters at `location`, shaped like `template_params`; the line `describe` makes)."""
  params, description, _ = load_with_step(location, template_params)
  return params, description


def load_with_step(location: Location, template_params: PyTree) -> tuple[PyTree, str, int]:
  """`load`'s parameters and line, and the step of the folder's checkpoint that was read."""
  steps = reader.CheckpointDir(location.directory)
  found = steps.newest_readable(
    nest(location.path_in_state, reader.state_dict(template_params)),
    with_data=location.with_data,
  )
  if found is None:
    raise CheckpointError(f"No checkpoint in {location.directory}.")
  step, state_sd, info = found
  for key in location.path_in_state:
    state_sd = state_sd[key]
  description = describe(location, step, info, str(steps.path(step)))
  logging.info("Loaded %s.", description)
  return flax.serialization.from_state_dict(template_params, state_sd), description, step
