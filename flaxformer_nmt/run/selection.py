"""Which parameters a command uses: the one owner of `--checkpoint`'s choice, of `best/` (and the
swap that replaces it), of `averaged/` (named averages and the pointer to the newest), of the EMA
subtree inside a training checkpoint, and of the check that another run's parameters fit this one.

  auto      the average written last, unless training saved a newer checkpoint since it was made
            (then the newest training checkpoint, with a warning)
  latest    the newest readable training checkpoint
  averaged  the average written last (averaged/latest.json names it)
  best      config.best_metric's best evaluation (best/, or best/.incoming mid-swap)
  ema       the parameter average kept in the newest training checkpoint

`resolve` turns the choice into a `params.Location`, with one line for each reason it cannot (no
checkpoint, no average, no EMA kept, no best), before any model is built; `resolve_members` does
the same for each workdir of --ensemble; `check_compatible` is the one test that another run
(an ensemble member, a fine-tuning source) has this run's vocabulary and architecture. The
folder layout itself is `run.folder.Workdir`'s.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Collection, Sequence
from typing import Any

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import reader
from flaxformer_nmt.checkpoints.params import EMA_PATH, PARAMS_PATH, Location
from flaxformer_nmt.config import run_config
from flaxformer_nmt.config.choices import CHECKPOINTS
from flaxformer_nmt.config.run_config import ARCHITECTURE
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.run.folder import IMPORTED, Workdir
from flaxformer_nmt.runtime import files, parallel


@dataclasses.dataclass(frozen=True)
class Average:
  """One average of a workdir: its folder of orbax steps and what it says of itself."""

  directory: str
  steps: tuple[int, ...]  # the training steps averaged
  of: str  # "params" or "ema"
  newest_training_step: int  # the newest training checkpoint when it was made


@dataclasses.dataclass(frozen=True)
class AveragePlan:
  """Which training steps an average reads, what of them, and where that is in their state."""

  steps: list[int]
  of: str  # "params" or "ema"
  path_in_state: tuple[str, ...]


def average_name(of: str, steps: Sequence[int]) -> str:
  """The folder name of an average: what it holds, e.g. `params_5_steps_200_to_600`."""
  return f"{of}_{len(steps)}_steps_{steps[0]}_to_{steps[-1]}"


def architecture_difference(theirs: Workdir, config: ml_collections.ConfigDict) -> str | None:
  """The first architecture field (run_config.ARCHITECTURE) in which the run saved in `theirs`
  differs from `config`, as "model.X=theirs where this config has ours"; None if none does (or
  it saved no config)."""
  model = theirs.saved_config().get("model", {})
  for field in ARCHITECTURE:
    if field in model and field in config.model and model[field] != config.model[field]:
      return f"model.{field}={model[field]} where this config has {config.model[field]}"
  return None


# What a fine-tuning run takes from its init_from source's config.json rather than from its own
# config (docs/pretrained.md): the architecture (and model.size, its name), the positions' table
# size, how its vocabulary spells a language tag, and what that vocabulary is (its size and model
# type: the run copies the source's, so the config must not record another). Dropout, the data,
# the schedule and the decoding settings stay the command's.
ADOPTED = tuple(f"model.{f}" for f in (*ARCHITECTURE, "size", "max_len")) + (
  "data.lang_tag_format",
  "data.lang_tokens",
  "data.languages",
  "data.vocab_size",
  "data.vocab_model_type",
)


def adopt_architecture(
  config: ml_collections.ConfigDict,
  saved: dict[str, Any] | None = None,
  typed: Collection[str] = (),
) -> list[str]:
  """Sets the ADOPTED fields of `config` to those of `saved` (a resumed run's own config), else
  of the run config.init_from names (its folder, or the run above its checkpoints/, averaged/ or
  best/), so an imported model's architecture need not be restated; returns the fields that
  changed, which are logged. `typed`: the fields the command line set itself (`model.num_heads`
  for --config.model.num_heads=8): one of them that differs from the source is a ConfigError
  naming both values, not replaced behind the user's back."""
  where = "this fine-tuned run's own config.json"
  if saved is None:
    path = os.path.normpath(config.init_from)
    if os.path.basename(path) in ("checkpoints", "averaged", "best"):
      path = os.path.dirname(path) or "."
    source = Workdir(path)
    saved = source.saved_config()
    if isinstance(saved.get("model"), dict):  # ours (not a transformers folder: init_from says)
      # With its types, and the fields it predates at their defaults (what it computes).
      saved = run_config.from_json(source.saved_config_text() or "", source.config_path).to_dict()
    where = f"config.init_from={config.init_from}'s config.json"
  changed = []
  for field in ADOPTED:
    group, name = field.split(".")
    if name in saved.get(group, {}) and name in config[group]:
      value = saved[group][name]
      if config[group][name] != value:
        if field in typed:
          raise errors.ConfigError(
            f"--config.{field}={config[group][name]!r}: {where} has {field}={value!r}, and a "
            "fine-tuned model keeps its source's architecture and vocabulary; leave it out."
          )
        config[group][name] = value
        changed.append(f"{field}={value!r}")
  if changed:
    logging.warning("The architecture comes from %s: %s.", where, ", ".join(changed))
  return changed


def check_compatible(
  theirs: Workdir, config: ml_collections.ConfigDict, ours: str, who: str, what: str
) -> str:
  """The vocabulary of the run in `theirs`, checked to be this run's (`ours`, if it exists) and
  its architecture `config`'s: CheckpointError / CheckpointMismatchError naming `who` ("--ensemble
  member X", "config.init_from=X") otherwise; `what` says who must agree ("the members of an
  ensemble"). Parameter shapes are checked apart (params.check_fits), once the model exists."""
  vocabulary = theirs.vocabulary()
  if not tokenizer_lib.vocabulary_exists(vocabulary):
    raise errors.CheckpointError(f"{who}: no vocabulary at {vocabulary}.")
  if tokenizer_lib.vocabulary_exists(ours) and not tokenizer_lib.same_vocabulary(vocabulary, ours):
    raise errors.CheckpointMismatchError(
      f"{who}: its vocabulary {vocabulary} differs from {ours}; {what} must share one vocabulary."
    )
  difference = architecture_difference(theirs, config)
  if difference:
    raise errors.CheckpointMismatchError(
      f"{who}: it was trained with {difference}; {what} must be one architecture."
    )
  return vocabulary


def trained_with_ema(folder: Workdir) -> bool:
  """Whether the run saved here kept a parameter average (True if unknown: then the
  checkpoint's own metadata decides)."""
  saved = folder.saved_config()
  return bool(saved.get("optim", {}).get("ema_decay", 0.0)) if saved else True


def best_folder(folder: Workdir) -> str:
  """best/, or, in the moment between the two renames that replace a best step with a new
  evaluation of it (training/best.py), best/.incoming, which then holds the new one."""
  if not reader.CheckpointDir(folder.best).steps():
    incoming = folder.best_incoming
    if reader.CheckpointDir(incoming).steps():
      return incoming
  return folder.best


def best_step(folder: Workdir) -> int:
  """The step best/ holds; CheckpointError if the run kept none."""
  steps = reader.CheckpointDir(best_folder(folder)).steps()
  if not steps:
    raise errors.CheckpointError(
      f"--checkpoint=best: no best checkpoint in {folder.best}; train with "
      "config.best_metric='dev_bleu' or 'dev_loss' to keep one."
    )
  return steps[-1]


def latest_average(folder: Workdir) -> Average | None:
  """The average written last: the one averaged/latest.json names; without it, the most
  recently written named one; in a workdir from before averages had names, the highest step
  of averaged/<step>/ (named after the newest step it averaged)."""
  pointer = files.read_result(folder.latest_average_path) or {}
  named = []
  if os.path.isdir(folder.averaged):
    for name in os.listdir(folder.averaged):
      path = folder.average_dir(name)
      if not name.isdigit() and os.path.isdir(path) and reader.CheckpointDir(path).steps():
        named.append(path)
  chosen = folder.average_dir(pointer.get("name", ""))
  if pointer.get("name") and chosen in named:
    return Average(
      chosen,
      tuple(pointer["steps"]),
      pointer.get("of", "params"),
      int(pointer["newest_training_step"]),
    )
  if named:
    path = max(named, key=os.path.getmtime)
    steps = reader.CheckpointDir(path).steps()
    return Average(path, (steps[-1],), "params", steps[-1])
  old = reader.CheckpointDir(folder.averaged).steps()
  if old:
    return Average(folder.averaged, (old[-1],), "params", old[-1])
  return None


def imported_has_no_training(folder: Workdir, asked: str) -> str:
  """The one line for asking an imported run (never trained in place) for training
  checkpoints."""
  return (
    f"{asked}: {folder.path} is an imported model; it has no training checkpoints, only its "
    f"imported parameters (--checkpoint=auto). To train it, fine-tune it into a new workdir "
    f"with --config.init_from={folder.path}."
  )


def resolve(folder: Workdir, which: str = "auto") -> Location:
  """Where the parameters `--checkpoint=which` names live; one line (UserError) if there are
  none. Lists folders only, so a mode fails before it builds or loads anything.

  auto: the average written last, unless training saved a newer checkpoint since it was made
  (then the newest training checkpoint, with a warning); latest; averaged; best; ema.
  """
  if which not in CHECKPOINTS:
    raise errors.ConfigError(f"--checkpoint={which}: choose one of {', '.join(CHECKPOINTS)}.")
  train_steps = folder.training_steps()
  if which in ("latest", "ema") and not train_steps and folder.imported():
    raise errors.CheckpointError(imported_has_no_training(folder, f"--checkpoint={which}"))
  if which in ("latest", "ema") and not train_steps:
    raise errors.CheckpointError(
      f"No training checkpoint in {folder.checkpoints}; train with --workdir={folder.path} first."
    )
  if which == "ema":
    if not trained_with_ema(folder):
      raise errors.CheckpointError(
        f"--checkpoint=ema: {folder.path} was not trained with config.optim.ema_decay > 0 (its "
        "config.json says so), so its checkpoints hold no parameter average."
      )
    return Location("ema", folder.checkpoints, EMA_PATH)
  if which == "best":
    best_step(folder)  # one line if there is none
    return Location("best", best_folder(folder), PARAMS_PATH, with_data=True)
  if which == "latest":
    return Location("latest", folder.checkpoints)
  average = latest_average(folder)
  if which == "averaged":
    if average is None:
      raise errors.CheckpointError(
        f"No averaged checkpoint in {folder.averaged}; make one with --mode=average "
        "--num_checkpoints=K."
      )
    return Location("averaged", average.directory, PARAMS_PATH, with_data=True)
  if average is None and not train_steps:
    raise errors.CheckpointError(
      f"No checkpoint in {folder.path}; train with --workdir={folder.path} first."
    )
  if average is not None and (not train_steps or train_steps[-1] <= average.newest_training_step):
    return Location("averaged", average.directory, PARAMS_PATH, with_data=True)
  if average is not None:
    logging.warning(
      "The average in %s was made when the newest training checkpoint was step %d; training "
      "has saved step %d since, which is used. Rerun --mode=average to average the newest.",
      average.directory,
      average.newest_training_step,
      train_steps[-1],
    )
  return Location("latest", folder.checkpoints)


def resolve_members(
  folder: Workdir, members: Sequence[str], which: str, config: ml_collections.ConfigDict
) -> list[tuple[Workdir, Location]]:
  """(workdir, location) of each --ensemble member, each by `which` in its own workdir ("auto":
  its own average or not); UserError naming the first member that is this workdir, missing,
  has no checkpoint, or another vocabulary or architecture."""
  if isinstance(members, str):
    raise TypeError(f"ensemble members must be a list of workdirs, not the string {members!r}.")
  ours = folder.vocabulary(config)
  resolved = []
  for member in members:
    if os.path.abspath(member) == os.path.abspath(folder.path):
      raise errors.ConfigError(f"--ensemble member {member} is --workdir itself; list the others.")
    if not os.path.isdir(member):
      raise errors.CheckpointError(f"--ensemble member {member}: no such workdir.")
    theirs = Workdir(member)
    check_compatible(
      theirs, config, ours, f"--ensemble member {member}", "the members of an ensemble"
    )
    try:
      resolved.append((theirs, resolve(theirs, which)))
    except errors.UserError as e:
      raise type(e)(f"--ensemble member {member}: {e}") from e
  return resolved


def average_plan(folder: Workdir, num_checkpoints: int, which: str) -> AveragePlan:
  """What --mode=average --num_checkpoints=K --checkpoint=which averages; UserError before
  any work if it cannot: latest (or auto) the newest K training checkpoints' params, best the
  newest K up to the best step, ema the parameter averages of the newest K."""
  if which not in ("auto", "latest", "best", "ema"):
    raise errors.ConfigError(
      f"--mode=average --checkpoint={which}: average reads training checkpoints; use auto, "
      "latest, best (the K up to the best step) or ema (their parameter averages)."
    )
  if not folder.training_steps() and folder.imported():
    raise errors.CheckpointError(imported_has_no_training(folder, "--mode=average"))
  if which == "ema":
    resolve(folder, "ema")  # one line if the run kept no average
  steps, scope = folder.training_steps(), ""
  if which == "best":
    best = best_step(folder)
    steps, scope = [s for s in steps if s <= best], f" up to the best step {best}"
  from flaxformer_nmt.checkpoints import averaging  # pylint: disable=g-import-not-at-top

  chosen = averaging.last_steps(steps, num_checkpoints, folder.checkpoints, scope)
  if which == "ema":
    return AveragePlan(chosen, "ema", EMA_PATH)
  return AveragePlan(chosen, "params", PARAMS_PATH)


def save_imported(folder: Workdir, params: Any, source: str) -> str:
  """Writes an imported model's parameters as `averaged/imported/0`, named in averaged/latest.json:
  `--checkpoint=auto` and `averaged` read them, and so does `config.init_from`."""
  directory = folder.average_dir(IMPORTED)
  info = {"imported_from": source, "averaged_steps": [0], "num_checkpoints": 1, "of": "params"}
  from flaxformer_nmt.checkpoints import checkpointer  # pylint: disable=g-import-not-at-top (writers)

  path = checkpointer.write(directory, 0, {"params": params}, info, replace=True)
  pointer = {"name": IMPORTED, "steps": [0], "of": "params", "newest_training_step": 0}
  if parallel.is_main_process():
    files.write_text(folder.latest_average_path, json.dumps(pointer) + "\n")
  return path


def save_average(folder: Workdir, params: Any, steps: Sequence[int], of: str) -> str:
  """Writes an average to averaged/<average_name>/<newest step> and names it in
  averaged/latest.json (after it is complete), so `--checkpoint=averaged` reads it. Making the
  same average again replaces it. Returns its path. Every process calls it."""
  steps = [int(s) for s in steps]
  directory = folder.average_dir(average_name(of, steps))
  info = {"averaged_steps": steps, "num_checkpoints": len(steps), "of": of}
  from flaxformer_nmt.checkpoints import checkpointer  # pylint: disable=g-import-not-at-top (writers)

  path = checkpointer.write(directory, steps[-1], {"params": params}, info, replace=True)
  training = folder.training_steps()
  pointer = {
    "name": os.path.basename(directory),
    "steps": steps,
    "of": of,
    "newest_training_step": training[-1] if training else steps[-1],
  }
  if parallel.is_main_process():
    files.write_text(folder.latest_average_path, json.dumps(pointer) + "\n")
  logging.info("Wrote the average of steps %s to %s.", steps, path)
  return path
