"""Loading the members of an ensemble (`--ensemble=WORKDIR[,WORKDIR...]`) for eval and translate.

The ensemble is `--workdir`'s model plus each listed workdir's, decoded together by averaging their
next-token probabilities (decode.Ensemble). Every member must be the same model size and use the
same vocabulary file, byte for byte: the search feeds one token id to all of them. Each member's
parameters are chosen by the same `--checkpoint` rule, applied in its own workdir ("auto" takes a
member's averaged checkpoint if it has one). Every check runs before any parameters are read, and
a failure is one line naming the member.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import averaging
from flaxformer_nmt.data.tokenizer import MODEL_FILENAME
from flaxformer_nmt.runtime import files


def vocabulary_path(workdir: str, config: ml_collections.ConfigDict | None = None) -> str:
  """The vocabulary a workdir's run used: `data.vocab_path` of `config` (default: the run's saved
  config.json), else `<workdir>/spm.model`."""
  vocab_path = ""
  if config is not None:
    vocab_path = config.data.vocab_path
  else:
    vocab_path = files.saved_config(workdir).get("data", {}).get("vocab_path", "")
  return vocab_path or os.path.join(workdir, MODEL_FILENAME)


# config.model fields that change what a set of parameters computes. Parameter shapes
# (check_checkpoint_fits) catch most size changes, but not model.num_heads or model.pre_ln's
# placement, so these are compared with the run's saved config.json.
ARCHITECTURE = (
  "num_layers",
  "d_model",
  "d_ff",
  "num_heads",
  "pre_ln",
  "positional",
  "share_embeddings",
)


def architecture_difference(config: ml_collections.ConfigDict, workdir: str) -> str | None:
  """The first architecture field in which the run saved in `workdir/config.json` differs from
  `config`, as "model.X=theirs where this config has ours"; None if none does (or none saved)."""
  model = files.saved_config(workdir).get("model", {})
  for field in ARCHITECTURE:
    if field in model and field in config.model and model[field] != config.model[field]:
      return f"model.{field}={model[field]} where this config has {config.model[field]}"
  return None


def check_members(
  config: ml_collections.ConfigDict, workdir: str, members: Sequence[str], which: str
) -> list[tuple[str, str]]:
  """(member workdir, resolved checkpoint choice) for each member; UserError naming the first
  member that is missing, has no checkpoint, another vocabulary or another architecture."""
  from flaxformer_nmt.components import check_checkpoint_fits  # pylint: disable=g-import-not-at-top

  ours = vocabulary_path(workdir, config)
  checked = []
  for member in members:
    if os.path.abspath(member) == os.path.abspath(workdir):
      raise errors.ConfigError(f"--ensemble member {member} is --workdir itself; list the others.")
    if not os.path.isdir(member):
      raise errors.CheckpointError(f"--ensemble member {member}: no such workdir.")
    theirs = vocabulary_path(member)
    if not os.path.isfile(theirs):
      raise errors.CheckpointError(f"--ensemble member {member}: no vocabulary at {theirs}.")
    if os.path.isfile(ours) and not files.same_bytes(theirs, ours):
      raise errors.CheckpointMismatchError(
        f"--ensemble member {member}: its vocabulary {theirs} differs from {ours}; the members "
        "of an ensemble must share one vocabulary."
      )
    difference = architecture_difference(config, member)
    if difference:
      raise errors.CheckpointMismatchError(
        f"--ensemble member {member}: it was trained with {difference}; the members of an "
        "ensemble must be one architecture."
      )
    try:
      resolved = averaging.resolve_inference_source(member, which)
      check_checkpoint_fits(config, workdir, averaging.inference_dir(member, resolved))
    except errors.UserError as e:
      raise type(e)(f"--ensemble member {member}: {e}") from e
    checked.append((member, resolved))
  return checked


def load_members(checked: Sequence[tuple[str, str]], template: Any) -> list[tuple[Any, str]]:
  """(parameters, description) of each checked member."""
  return [averaging.load_inference_params(m, template, which) for m, which in checked]
