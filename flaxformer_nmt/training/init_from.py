"""Starting a run from another run's parameters (`config.init_from`): fine-tuning.

`config.init_from` names a trained workdir (its average if that is current, else its latest
checkpoint, as `--checkpoint=auto`), or that workdir's `checkpoints/` folder (the latest),
`averaged/` folder (the average written last) or `best/` folder (config.best_metric's best
evaluation). The new run starts from those parameters with step 0, fresh Adam moments and a fresh
data position, and it reuses the source run's SentencePiece model: copied into the new workdir as
its vocabulary, and recorded with the source in `<workdir>/init_from.json`.

Everything is checked before any data is read: a missing or checkpoint-less source, a vocabulary
other than the source's (`data.vocab_path`, or a workdir that already has another vocabulary), or
a model other than the source's (the architecture fields of its saved config.json, such as
model.num_heads, and the parameter shapes of its checkpoint, against the command's one
`Components`) is one line naming `config.init_from`. A workdir that already has checkpoints
resumes from them and ignores `init_from` without looking at it (the log says so), so rerunning a
preempted fine-tuning job continues it even if the source has moved since. Every process of a
multi-process run reads the same checkpoint, so all start from the same parameters.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import params as params_lib
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import files, parallel


@dataclasses.dataclass(frozen=True)
class Source:
  """Where a fine-tuning run's parameters and vocabulary come from."""

  setting: str  # config.init_from as given
  workdir: Workdir  # the source run's
  location: params_lib.Location  # its parameters, as resolved
  vocabulary: str  # the source run's SentencePiece model


def _split(setting: str) -> tuple[Workdir, str]:
  """(source workdir, checkpoint rule) that `setting` names; CheckpointError if none."""
  path = os.path.normpath(setting)
  name = os.path.basename(path)
  rules = {"checkpoints": "latest", "averaged": "averaged", "best": "best"}
  if name in rules and os.path.isdir(path):
    return Workdir(os.path.dirname(path) or "."), rules[name]
  source = Workdir(path)
  if os.path.isdir(source.checkpoints) or os.path.isdir(source.averaged):
    return source, "auto"
  model_type = source.saved_config().get("model_type")
  if model_type:  # a transformers model folder (config.json of a MarianConfig, ...)
    raise errors.CheckpointError(
      f"config.init_from={setting} is a transformers model (model_type {model_type!r}), not a "
      f"run: import it first (--mode=import --input={setting} --workdir=NEW), then "
      "--config.init_from=NEW."
    )
  raise errors.CheckpointError(
    f"config.init_from={setting}: not a trained workdir (no checkpoints/ or averaged/ folder in "
    "it), nor such a folder (or its best/)."
  )


def check(config: ml_collections.ConfigDict, workdir: Workdir) -> Source:
  """The source config.init_from names, checked in everything but the parameter shapes
  (`check_fits`, once the command's Components exist): lists files only."""
  setting = config.init_from
  source, rule = _split(setting)
  try:
    location = selection.resolve(source, rule)
  except errors.UserError as e:
    raise type(e)(f"config.init_from={setting}: {e}") from e
  vocabulary = selection.check_compatible(
    source,
    config,
    workdir.vocabulary(config),
    f"config.init_from={setting}",
    "a fine-tuned model and its source",
  )
  return Source(setting, source, location, vocabulary)


def check_fits(source: Source, components: Components) -> None:
  """CheckpointMismatchError naming config.init_from if the source's parameters are not the
  shapes of this config's model (built with the source's vocabulary)."""
  try:
    params_lib.check_fits(source.location.directory, components.abstract_params)
  except errors.UserError as e:
    raise type(e)(f"config.init_from={source.setting}: {e}") from e


def log_ignored(setting: str, workdir: Workdir) -> None:
  """Says that a workdir with checkpoints of its own resumes them instead of init_from (the
  source is not even looked at: it may have been moved or deleted since)."""
  logging.info(
    "config.init_from=%s is ignored: %s already has checkpoints (step %d), and resuming them "
    "continues this fine-tuning run.",
    setting,
    workdir.path,
    workdir.training_steps()[-1],
  )


def adopt_vocabulary(config: ml_collections.ConfigDict, workdir: Workdir, source: Source) -> None:
  """Copies the source's SentencePiece model into the workdir (process 0; the others wait for the
  file, as for a trained one), unless config.data.vocab_path already names it."""
  target = workdir.own_vocabulary(source.vocabulary)
  if config.data.vocab_path or os.path.exists(target) or not parallel.is_main_process():
    return
  workdir.copy_vocabulary(source.vocabulary)
  logging.info("Copied the vocabulary of %s into %s.", source.setting, target)


def load_params(source: Source, template: Any, workdir: Workdir) -> Any:
  """The source's parameters (every process reads them), recorded in <workdir>/init_from.json."""
  params, description = params_lib.load(source.location, template)
  if parallel.is_main_process():
    record = {
      "init_from": source.setting,
      "source_workdir": source.workdir.path,
      "parameters": description,
      "vocabulary": source.vocabulary,
    }
    files.write_text(workdir.init_from_record, json.dumps(record, indent=2) + "\n")
  logging.info("Starting from %s (config.init_from=%s).", description, source.setting)
  return params
