"""The run a command works on, opened once: its folder, its saved config, the command's config.

Every command (each --mode, the server, the API) starts here. The run's config.json is read once,
its paths made absolute (`absolute_paths`), and the command's config held to the run's rules
(config/run_config.py: what a command may change). A data.vocab_path must be the run's own
vocabulary by content, and a resume's training data the data the run recorded (run/identity.py).
Every refusal is one line that names the run and the config it was trained with.

Paths are absolute, so that read from any folder a run means the same files: a relative
`data.dir` or `data.vocab_path` used to be saved as typed, and a resume or a translate started
in another folder read whatever that relative path held there. A run saved before (relative paths
in its config.json) is read as it always was, against the current folder, with one warning line;
its next training command saves the paths absolute and records its data (run/identity.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Collection
from typing import Any

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.config import checks, run_config
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.run import making, selection
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import compile_cache


@dataclasses.dataclass(frozen=True)
class Run:
  """A command's run: its folder, the config the command runs with (validated), and the run's
  saved config (None before training has saved one)."""

  folder: Workdir
  config: ml_collections.ConfigDict
  saved: ml_collections.ConfigDict | None


def open_run(
  config: ml_collections.ConfigDict | None, workdir: str, mode: str, typed: Collection[str] = ()
) -> Run:
  """The run a `mode` command works on, before any expensive work: the folder's own checks, the
  run's saved config read once (paths made absolute), reconciled with the command's `config`
  (None = the run's own; config/run_config.py says what a command may change), the vocabulary
  and a resume's training data checked by content, the config's rules. ConfigError (one line)
  for the first problem. Nothing is written, but a training run's folder is made. `typed`: the
  fields the command line set itself (a fine-tune refuses to replace them with its source's)."""
  folder = Workdir(workdir)
  folder.check()
  text = folder.saved_config_text()  # config.json, read once for the whole command
  saved = run_config.from_json(text, folder.config_path) if text is not None else None
  if config is not None:
    config = config.copy_and_resolve_references()  # the caller's config stays as it was
    absolute_paths(config)
  if saved is not None:
    absolute_paths(saved, saved=folder.config_path)
  if mode == "train" and saved is not None and folder.imported():
    raise errors.ConfigError(
      f"--workdir={workdir} holds an imported model, which is not trained in place: fine-tune "
      f"it into a new workdir with --config.init_from={workdir}."
    )
  resuming = mode == "train" and bool(folder.training_steps())
  # Before the reconcile, which compares them. A fine-tuned run's architecture and vocabulary are
  # its source's at its first start, then its own config.json's (the source is not read again:
  # it may have moved), whatever config file a later command names. The command line's typed
  # values are held to them, except on a resume (runs from before typed values were refused
  # took the source's silently, and their rerun must resume).
  if mode == "train" and config is not None and config.get("init_from"):
    own = saved.to_dict() if resuming and saved is not None else None
    selection.adopt_architecture(config, own, () if resuming else typed)
  elif mode != "train" and config is not None and saved is not None and saved.get("init_from"):
    selection.adopt_architecture(config, saved.to_dict(), typed)
  if saved is not None and (config is None or mode != "train" or resuming):
    recorded = folder.training_data() if resuming else None
    try:
      config = run_config.reconcile(
        config if config is not None else saved,
        saved,
        mode,
        folder.config_path,
        # Checked by content below: a moved corpus or vocabulary may be named anew.
        by_content=("data.vocab_path",) + (("data.dir",) if recorded else ()),
      )
    except errors.ConfigError as e:
      name = folder.trained_with()
      if not name:
        raise
      raise errors.ConfigError(f"{folder.path} was trained with `{name}`: {e}") from None
    _check_vocabulary(config, saved, folder)
    if resuming:
      _check_training_data(config, saved, folder, recorded)
  elif config is None:
    raise errors.ConfigError(
      f"{folder.config_path}: no such file; give the config {workdir} was trained with."
    )
  if mode == "train" and saved is not None:
    _check_kept_vocabulary(config, folder)
  if mode == "train":
    making.check_new_run(folder, "train")
  checks.validate(config)
  compile_cache.check(config.get("compile_cache", "auto"))
  if mode == "train":
    folder.create()  # one line if it cannot be, before anything is compiled or read
  return Run(folder, config, saved)


def open_new_run(workdir: str, kind: str) -> Workdir:
  """The folder a command that makes a run from elsewhere (`kind`="import") makes it in,
  checked as open_run checks a new training run's before any work: the folder's own checks, a
  run already there refused, and anything but a killed start's leftovers refused
  (making.check_new_run). Nothing is written; making.new_run makes it."""
  folder = Workdir(workdir)
  folder.check()
  if folder.holds_run():
    raise errors.ConfigError(f"--workdir={workdir}: already holds a run; {kind} into a new folder.")
  making.check_new_run(folder, kind)
  return folder


def _trained_with(folder: Workdir) -> str:
  """ "runs/demo (trained with `demo`)": which config a refused command's run came from."""
  name = folder.trained_with()
  return f"{folder.path} (trained with `{name}`)" if name else folder.path


def _check_vocabulary(
  config: ml_collections.ConfigDict, saved: ml_collections.ConfigDict, folder: Workdir
) -> None:
  """ConfigError, before any work, when the command's data.vocab_path is not the run's own
  vocabulary by content (another path to the same file, or a copy, is fine)."""
  given = config.data.vocab_path
  if not given or given == saved.data.vocab_path:
    return
  own = folder.vocabulary(saved)
  if not tokenizer_lib.vocabulary_exists(given):
    raise errors.ConfigError(f"config.data.vocab_path={given}: no such file.")
  if tokenizer_lib.vocabulary_exists(own) and not tokenizer_lib.same_vocabulary(given, own):
    raise errors.ConfigError(
      f"config.data.vocab_path={given} is not the vocabulary of {_trained_with(folder)}: "
      f"its content differs from {own}. Leave it out (the run's own is used)."
    )


def _check_kept_vocabulary(config: ml_collections.ConfigDict, folder: Workdir) -> None:
  """ConfigError, before any work, when a training command's data.vocab_path differs by content
  from the copy the run made at its first start (a file changed in place since, or another path
  after a start killed before its first checkpoint): its parameters and tokenized data use the
  copy's ids, and replacing it would make every later score silently wrong."""
  given = config.data.vocab_path
  kept = folder.kept_vocabulary()
  if not given or kept is None or not tokenizer_lib.vocabulary_exists(given):
    return  # moved or deleted since: the run reads its own copy (Workdir.vocabulary)
  if not tokenizer_lib.same_vocabulary(given, kept):
    raise errors.ConfigError(
      f"config.data.vocab_path={given}: its content differs from {kept}, the vocabulary "
      f"{folder.path} has held since its first start, and a run's vocabulary cannot "
      f"change. Restore the file, name the run's copy (--config.data.vocab_path={kept}), or "
      "train in another --workdir."
    )


def _check_training_data(
  config: ml_collections.ConfigDict,
  saved: ml_collections.ConfigDict,
  folder: Workdir,
  recorded: dict[str, Any] | None,
) -> None:
  """ConfigError, before any work, when a resume would train on other data than the run
  recorded (run/identity.py); one warning for a run that recorded none (saved before)."""
  if recorded is None:
    logging.warning(
      "%s has no record of its training data (it was trained before runs recorded one): "
      "resuming on what the config names now, and recording it.",
      folder.path,
    )
    return
  from flaxformer_nmt.run import identity  # pylint: disable=g-import-not-at-top (a resume's)

  differs = identity.difference(recorded, identity.training_data(config, recorded))
  if differs:
    raise errors.ConfigError(
      f"{_trained_with(folder)} was trained on other data: {differs}. Resume it on the data it "
      f"recorded in {folder.run_record_path}, or train in another --workdir."
    )


# Fields that name a file or folder (init_from: a run or one of its checkpoints, when it is a
# path that exists; anything else there is left for init_from's own checks to name).
PATH_FIELDS = ("data.dir", "data.vocab_path", "data.tfds_data_dir", "init_from")


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # gs://bucket/tfds: TFDS reads it as it is


def absolute_path(field: str, value: object, base: str | None = None) -> str | None:
  """The absolute form of path field `field`'s `value` against `base` (default: the current
  folder), or None when it stays as it is: empty, absolute already, a URL (gs://...), or an
  init_from that is no path here."""
  if not isinstance(value, str) or not value or os.path.isabs(value) or _URL.match(value):
    return None
  base = os.path.abspath(base or os.getcwd())
  if field == "init_from" and not os.path.exists(os.path.join(base, value)):
    return None
  return os.path.normpath(os.path.join(base, value))


def _node(config: Any, path: str) -> tuple[Any, str] | None:
  """(the group holding dotted `path`'s field, the field's name), or None if a group is missing:
  for a ConfigDict or the dicts of a config.json alike."""
  *groups, name = path.split(".")
  node = config
  for group in groups:
    if group not in node:
      return None
    node = node[group]
  return node, name


def absolute_paths(config: Any, *, saved: str = "", base: str | None = None) -> dict[str, str]:
  """Makes `config`'s relative path fields absolute (`absolute_path`), in place; returns
  {field: its absolute path}. `config` is a ConfigDict or a config.json's dict. `saved` names
  the config.json they were read from: then one warning line says how they are read."""
  changed: dict[str, str] = {}
  for field in PATH_FIELDS:
    found = _node(config, field)
    if found is None or found[1] not in found[0]:
      continue
    node, name = found
    path = absolute_path(field, node[name], base)
    if path is not None:
      changed[field] = node[name] = path
  if saved and changed:
    logging.warning(
      "%s was saved with relative paths (before runs saved them absolute): reading %s from "
      "the current folder.",
      saved,
      ", ".join(f"{field}={path}" for field, path in changed.items()),
    )
  return changed
