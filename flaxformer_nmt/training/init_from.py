"""Starting a run from another run's parameters (`config.init_from`): fine-tuning.

`config.init_from` names a trained workdir (its averaged checkpoint if that is the newest, else its
latest, as `--checkpoint=auto`), or that workdir's `checkpoints/` folder (the latest), `averaged/`
folder or `best/` folder (config.best_metric's best evaluation). The new run starts from those
parameters with step 0, fresh Adam moments and a fresh data position, and it reuses the source
run's SentencePiece model: copied into the new workdir as its `spm.model`, and recorded with the
source in `<workdir>/init_from.json`.

Everything is checked before any data is read: a missing or checkpoint-less source, a vocabulary
other than the source's (`data.vocab_path`, or a workdir that already has another `spm.model`),
or a model other than the source's (the architecture fields of its saved config.json, such as
model.num_heads, and the parameter shapes of its checkpoint) is one line naming
`config.init_from`. A workdir that already has checkpoints resumes from them and ignores
`init_from` without looking at it (the log says so), so rerunning a preempted fine-tuning job
continues it even if the source has moved since. Every process of a multi-process run reads the same
checkpoint, so all start from the same parameters.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import averaging
from flaxformer_nmt.checkpoints import checkpointer as checkpoint
from flaxformer_nmt.checkpoints import reader as checkpoint_reader
from flaxformer_nmt.data.tokenizer import MODEL_FILENAME
from flaxformer_nmt.decoding import ensemble
from flaxformer_nmt.runtime import files, parallel

RECORD = "init_from.json"


@dataclasses.dataclass(frozen=True)
class Source:
  """Where a fine-tuning run's parameters and vocabulary come from."""

  setting: str  # config.init_from as given
  workdir: str  # the source run's workdir
  which: str  # "averaged" or "latest" (resolved)
  vocabulary: str  # the source run's SentencePiece model


def _split(setting: str) -> tuple[str, str]:
  """(workdir, checkpoint rule) that `setting` names; CheckpointError if none."""
  path = os.path.normpath(setting)
  name = os.path.basename(path)
  rules = {"checkpoints": "latest", "averaged": "averaged", "best": "best"}
  if name in rules and os.path.isdir(path):
    return os.path.dirname(path) or ".", rules[name]
  if os.path.isdir(path) and any(
    os.path.isdir(os.path.join(path, d)) for d in ("checkpoints", "averaged")
  ):
    return path, "auto"
  raise errors.CheckpointError(
    f"config.init_from={setting}: not a trained workdir (no checkpoints/ or averaged/ folder in "
    "it), nor such a folder (or its best/)."
  )


def check(config: ml_collections.ConfigDict, workdir: str) -> Source:
  """The checked source of config.init_from (the module docstring lists what is checked)."""
  from flaxformer_nmt.components import check_checkpoint_fits  # pylint: disable=g-import-not-at-top

  setting = config.init_from
  source_workdir, rule = _split(setting)
  try:
    which = averaging.resolve_inference_source(source_workdir, rule)
  except errors.UserError as e:
    raise type(e)(f"config.init_from={setting}: {e}") from e
  vocabulary = ensemble.vocabulary_path(source_workdir)
  if not os.path.isfile(vocabulary):
    raise errors.CheckpointError(f"config.init_from={setting}: no vocabulary at {vocabulary}.")
  ours = config.data.vocab_path or os.path.join(workdir, MODEL_FILENAME)
  if os.path.isfile(ours) and not files.same_bytes(ours, vocabulary):
    raise errors.ConfigError(
      f"config.init_from={setting}: its vocabulary {vocabulary} differs from this run's {ours}; "
      "a fine-tuned model keeps its source's vocabulary."
    )
  difference = ensemble.architecture_difference(config, source_workdir)
  if difference:
    raise errors.CheckpointMismatchError(
      f"config.init_from={setting}: the source was trained with {difference}; a fine-tuned "
      "model keeps its source's architecture."
    )
  # The model this config builds, with the source's vocabulary, against the source checkpoint.
  with_source_vocab = ml_collections.ConfigDict(config.to_dict())
  with_source_vocab.data.vocab_path = vocabulary
  try:
    check_checkpoint_fits(
      with_source_vocab, workdir, averaging.inference_dir(source_workdir, which)
    )
  except errors.UserError as e:
    raise type(e)(f"config.init_from={setting}: {e}") from e
  return Source(setting, source_workdir, which, vocabulary)


def resumes(workdir: str, setting: str) -> bool:
  """Whether the workdir has checkpoints of its own, which resume the run instead of init_from
  (then the source is not even looked at: it may have been moved or deleted since)."""
  steps = checkpoint_reader.CheckpointDir(checkpoint.checkpoint_dir(workdir)).steps()
  if steps:
    logging.info(
      "config.init_from=%s is ignored: %s already has checkpoints (step %d), and resuming them "
      "continues this fine-tuning run.",
      setting,
      workdir,
      steps[-1],
    )
  return bool(steps)


def adopt_vocabulary(config: ml_collections.ConfigDict, workdir: str, source: Source) -> None:
  """Copies the source's SentencePiece model into the workdir (process 0; the others wait for the
  file, as for a trained one), unless config.data.vocab_path already names it."""
  target = os.path.join(workdir, MODEL_FILENAME)
  if config.data.vocab_path or os.path.isfile(target) or not parallel.is_main_process():
    return
  partial = target + ".partial"
  shutil.copyfile(source.vocabulary, partial)
  os.replace(partial, target)
  logging.info("Copied the vocabulary of %s into %s.", source.setting, target)


def load_params(source: Source, template: Any, workdir: str) -> Any:
  """The source's parameters (every process reads them), recorded in <workdir>/init_from.json."""
  params, description = averaging.load_inference_params(source.workdir, template, source.which)
  if parallel.is_main_process():
    record = {
      "init_from": source.setting,
      "source_workdir": source.workdir,
      "parameters": description,
      "vocabulary": source.vocabulary,
    }
    files.write_text(os.path.join(workdir, RECORD), json.dumps(record, indent=2) + "\n")
  logging.info("Starting from %s (config.init_from=%s).", description, source.setting)
  return params
