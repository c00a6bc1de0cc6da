"""Checkpoints as plain trees: what is stored (`state_dict`), read back into the model's objects
(`from_state_dict`), and the one check that a checkpoint's parameters are the model's
(`check_matches_model`: the first parameter whose name or shape differs, in one line)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.serialization
import jax
import numpy as np
from etils import epath

from flaxformer_nmt.errors import CheckpointMismatchError

PyTree = Any


def state_dict(tree: PyTree) -> PyTree:
  """Plain nested dicts (dataclass fields, optax namedtuples by name, tuples by index).

  Storing this rather than the Python objects keeps checkpoints readable if TrainState or optax's
  state classes change, and gives parameter paths like `params/encoder/layer_0/...` in errors.
  A part the state leaves out (a field that is None: `TrainState.loss_scale` outside float16) is
  not stored at all, so checkpoints of such runs keep the layout they had before the field.
  """
  state = flax.serialization.to_state_dict(tree)
  if isinstance(state, dict):
    state = {k: v for k, v in state.items() if v is not None}
  return state


def from_state_dict(template: PyTree, state: PyTree) -> PyTree:
  """`template`'s objects from a state dict read back (`state_dict`'s inverse): the parts the
  template leaves out (None) are None again."""
  full = flax.serialization.to_state_dict(template)
  if isinstance(full, dict) and isinstance(state, dict):
    state = {**{k: None for k, v in full.items() if v is None}, **state}
  return flax.serialization.from_state_dict(template, state)


def abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
  dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
  return jax.ShapeDtypeStruct(np.shape(x), dtype)


def _path_str(path: Sequence[Any]) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def flatten(tree: PyTree, *, metadata: bool = False) -> dict[str, Any]:
  """`{"params/encoder/...": leaf}`; for orbax metadata trees, every non-container is a leaf."""
  is_leaf = (lambda x: not isinstance(x, (dict, list, tuple))) if metadata else None
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {_path_str(path): leaf for path, leaf in flat}


def check_matches_model(ckpt: epath.Path, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
  """Raises CheckpointMismatchError naming the first parameter whose name or shape differs.

  `params/...` are checked first: a user who changed the model size wants to hear about a weight
  matrix, not about the Adam moment that happens to sort first.
  """
  order = [p for p in wanted if p.startswith("params/")]
  order += [p for p in wanted if not p.startswith("params/")]
  hint = "was it trained with another --config or model size?"
  for path in order:
    want = tuple(wanted[path].shape)
    if path not in saved:
      raise CheckpointMismatchError(
        f"Checkpoint {ckpt} does not match the model: it has no {path} (shape {want} in the "
        f"model); {hint}"
      )
    have = tuple(getattr(saved[path], "shape", ()) or ())
    if have != want:
      raise CheckpointMismatchError(
        f"Checkpoint {ckpt} does not match the model: {path} has shape {have} in the checkpoint "
        f"but {want} in the model; {hint}"
      )
  extra = [p for p in saved if p not in wanted]
  if extra:
    shape = tuple(getattr(saved[extra[0]], "shape", ()) or ())
    raise CheckpointMismatchError(
      f"Checkpoint {ckpt} does not match the model: it has {extra[0]} (shape {shape}), which the "
      f"model lacks; {hint}"
    )
