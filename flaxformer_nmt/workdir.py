"""A run's folder, and the one type that knows what it holds: `Workdir`.

  <workdir>/
    config.json                 the config training ran with (compared on every rerun)
    spm.model                   the shared vocabulary (unless config.data.vocab_path names one)
    data_cache/                 tokenized corpora
    checkpoints/<step>/         training checkpoints: state (with the EMA), input position
    averaged/<name>/<step>/     averages (--mode=average), named by what they hold, e.g.
                                params_5_steps_200_to_600; averaged/latest.json names the one
                                written last (workdirs from before: averaged/<step>/)
    best/<step>/                config.best_metric's best evaluation (best_result.json)
    eval/                       test hypotheses and their scores
    attention/                  --mode=attention's pictures (by default)
    train_metrics.jsonl, dev_metrics.jsonl, results.jsonl, <mode>_result.json
    init_from.json              where a fine-tuning run started
    train.lock                  the training job that holds the folder
    events.out.tfevents.*       TensorBoard

No other module joins a path inside a workdir: it asks this one. `resolve` turns --checkpoint's
choice into the folder to read, in one place, with one line for each reason it cannot (no
checkpoint, no average, no EMA kept, no best), before any model is built; `resolve_members` does
the same for each workdir of --ensemble, and checks that they share the vocabulary and the
architecture.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import averaging, checkpointer, reader
from flaxformer_nmt.checkpoints.params import PARAMS_PATH, Location
from flaxformer_nmt.config.choices import CHECKPOINTS
from flaxformer_nmt.runtime import files, parallel, records
from flaxformer_nmt.training.optim import EMA_PATH

VOCABULARY = "spm.model"
LATEST_AVERAGE = "latest.json"
BEST_INCOMING = ".incoming"  # a new evaluation of best/'s step, written before it is swapped in
# config.model fields that change what a set of parameters computes. Parameter shapes catch most
# size changes (checkpoints.params.check_fits), but not model.num_heads or model.pre_ln, so these
# are compared with a run's saved config.json.
ARCHITECTURE = (
  "num_layers",
  "d_model",
  "d_ff",
  "num_heads",
  "d_k",
  "pre_ln",
  "positional",
  "share_embeddings",
)


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


class Workdir:
  """The layout of one run's folder (module docstring), and the choices made from what is in it."""

  def __init__(self, path: str) -> None:
    self.path = str(path)

  def __repr__(self) -> str:
    return f"Workdir({self.path!r})"

  def join(self, *parts: str) -> str:
    return os.path.join(self.path, *parts)

  # ------------------------------------------------------------------------------- the folder

  def check(self) -> None:
    """ConfigError if `--workdir` names something other than a directory (before any work)."""
    if os.path.exists(self.path) and not os.path.isdir(self.path):
      raise errors.ConfigError(f"--workdir={self.path} exists and is not a directory.")

  def create(self) -> None:
    self.check()
    os.makedirs(self.path, exist_ok=True)

  # ------------------------------------------------------------------------------- paths

  @property
  def checkpoints(self) -> str:
    return self.join("checkpoints")

  @property
  def averaged(self) -> str:
    return self.join("averaged")

  @property
  def best(self) -> str:
    return self.join("best")

  @property
  def eval_dir(self) -> str:
    return self.join("eval")

  @property
  def attention_dir(self) -> str:
    return self.join("attention")

  @property
  def data_cache(self) -> str:
    return self.join("data_cache")

  @property
  def lock_path(self) -> str:
    return self.join("train.lock")

  @property
  def init_from_record(self) -> str:
    return self.join("init_from.json")

  @property
  def tensorboard_dir(self) -> str:
    return self.path

  @property
  def config_path(self) -> str:
    return self.join("config.json")

  def metrics_path(self, split: str) -> str:
    """`<split>_metrics.jsonl`: train figures at each log step, dev at each evaluation."""
    return self.join(f"{split}_metrics.jsonl")

  def result_path(self, mode: str) -> str:
    """`<mode>_result.json`: the latest final figures of a mode."""
    return self.join(f"{mode}_result.json")

  def vocabulary(self, config: ml_collections.ConfigDict | None = None) -> str:
    """The run's SentencePiece model: `data.vocab_path` of `config` (default: of the run's saved
    config.json), else `<workdir>/spm.model`."""
    if config is not None:
      vocab_path = config.data.vocab_path
    else:
      vocab_path = self.saved_config().get("data", {}).get("vocab_path", "")
    return vocab_path or self.join(VOCABULARY)

  # ------------------------------------------------------------------------------- records

  def saved_config(self) -> dict[str, Any]:
    """The config a training run saved here (as JSON), or {} if it saved none."""
    if not os.path.isfile(self.config_path):
      return {}
    with open(self.config_path, encoding="utf-8") as f:
      return json.load(f)

  def saved_config_text(self) -> str | None:
    try:
      with open(self.config_path, encoding="utf-8") as f:
        return f.read()
    except OSError:
      return None

  def write_config(self, config: ml_collections.ConfigDict) -> None:
    files.write_text(self.config_path, config.to_json_best_effort(indent=2))

  def write_result(self, result: dict[str, Any], *, echo: bool = True) -> None:
    """A mode's figures to `<mode>_result.json` and `results.jsonl`, then (echo) to stdout."""
    records.write_result(
      self.result_path(result["mode"]), self.join("results.jsonl"), result, echo=echo
    )

  def read_result(self, mode: str) -> dict[str, Any] | None:
    return records.read_result(self.result_path(mode))

  def dev_records(self) -> list[dict[str, Any]]:
    return records.read_jsonl(self.metrics_path("dev"))

  def architecture_difference(self, config: ml_collections.ConfigDict) -> str | None:
    """The first architecture field in which the run saved here differs from `config`, as
    "model.X=theirs where this config has ours"; None if none does (or none was saved)."""
    model = self.saved_config().get("model", {})
    for field in ARCHITECTURE:
      if field in model and field in config.model and model[field] != config.model[field]:
        return f"model.{field}={model[field]} where this config has {config.model[field]}"
    return None

  def trained_with_ema(self) -> bool:
    """Whether the run saved here kept a parameter average (True if unknown: then the
    checkpoint's own metadata decides)."""
    saved = self.saved_config()
    return bool(saved.get("optim", {}).get("ema_decay", 0.0)) if saved else True

  # ------------------------------------------------------------------------------- checkpoints

  def training_steps(self) -> list[int]:
    return reader.CheckpointDir(self.checkpoints).steps()

  def best_folder(self) -> str:
    """best/, or, in the moment between the two renames that replace a best step with a new
    evaluation of it (training/best.py), best/.incoming, which then holds the new one."""
    if not reader.CheckpointDir(self.best).steps():
      incoming = os.path.join(self.best, BEST_INCOMING)
      if reader.CheckpointDir(incoming).steps():
        return incoming
    return self.best

  def best_step(self) -> int:
    """The step best/ holds; CheckpointError if the run kept none."""
    steps = reader.CheckpointDir(self.best_folder()).steps()
    if not steps:
      raise errors.CheckpointError(
        f"--checkpoint=best: no best checkpoint in {self.best}; train with "
        "config.best_metric='dev_bleu' or 'dev_loss' to keep one."
      )
    return steps[-1]

  def latest_average(self) -> Average | None:
    """The average written last: the one averaged/latest.json names; without it, the most
    recently written named one; in a workdir from before averages had names, the highest step
    of averaged/<step>/ (named after the newest step it averaged)."""
    pointer = records.read_result(os.path.join(self.averaged, LATEST_AVERAGE)) or {}
    named = []
    if os.path.isdir(self.averaged):
      for name in os.listdir(self.averaged):
        path = os.path.join(self.averaged, name)
        if not name.isdigit() and os.path.isdir(path) and reader.CheckpointDir(path).steps():
          named.append(path)
    chosen = os.path.join(self.averaged, pointer.get("name", ""))
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
    old = reader.CheckpointDir(self.averaged).steps()
    if old:
      return Average(self.averaged, (old[-1],), "params", old[-1])
    return None

  def resolve(self, which: str = "auto") -> Location:
    """Where the parameters `--checkpoint=which` names live; one line (UserError) if there are
    none. Lists folders only, so a mode fails before it builds or loads anything.

    auto: the average written last, unless training saved a newer checkpoint since it was made
    (then the newest training checkpoint, with a warning); latest; averaged; best; ema.
    """
    if which not in CHECKPOINTS:
      raise errors.ConfigError(f"--checkpoint={which}: choose one of {', '.join(CHECKPOINTS)}.")
    train_steps = self.training_steps()
    if which in ("latest", "ema") and not train_steps:
      raise errors.CheckpointError(
        f"No training checkpoint in {self.checkpoints}; train with --workdir={self.path} first."
      )
    if which == "ema":
      if not self.trained_with_ema():
        raise errors.CheckpointError(
          f"--checkpoint=ema: {self.path} was not trained with config.optim.ema_decay > 0 (its "
          "config.json says so), so its checkpoints hold no parameter average."
        )
      return Location("ema", self.checkpoints, EMA_PATH)
    if which == "best":
      self.best_step()  # one line if there is none
      return Location("best", self.best_folder(), PARAMS_PATH, with_data=True)
    if which == "latest":
      return Location("latest", self.checkpoints)
    average = self.latest_average()
    if which == "averaged":
      if average is None:
        raise errors.CheckpointError(
          f"No averaged checkpoint in {self.averaged}; make one with --mode=average "
          "--num_checkpoints=K."
        )
      return Location("averaged", average.directory, PARAMS_PATH, with_data=True)
    if average is None and not train_steps:
      raise errors.CheckpointError(
        f"No checkpoint in {self.path}; train with --workdir={self.path} first."
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
    return Location("latest", self.checkpoints)

  def resolve_members(
    self, members: Sequence[str], which: str, config: ml_collections.ConfigDict
  ) -> list[tuple[Workdir, Location]]:
    """(workdir, location) of each --ensemble member, each by `which` in its own workdir ("auto":
    its own average or not); UserError naming the first member that is this workdir, missing,
    has no checkpoint, or another vocabulary or architecture."""
    if isinstance(members, str):
      raise TypeError(f"ensemble members must be a list of workdirs, not the string {members!r}.")
    ours = self.vocabulary(config)
    resolved = []
    for member in members:
      if os.path.abspath(member) == os.path.abspath(self.path):
        raise errors.ConfigError(
          f"--ensemble member {member} is --workdir itself; list the others."
        )
      if not os.path.isdir(member):
        raise errors.CheckpointError(f"--ensemble member {member}: no such workdir.")
      theirs = Workdir(member)
      vocabulary = theirs.vocabulary()
      if not os.path.isfile(vocabulary):
        raise errors.CheckpointError(f"--ensemble member {member}: no vocabulary at {vocabulary}.")
      if os.path.isfile(ours) and not files.same_bytes(vocabulary, ours):
        raise errors.CheckpointMismatchError(
          f"--ensemble member {member}: its vocabulary {vocabulary} differs from {ours}; the "
          "members of an ensemble must share one vocabulary."
        )
      difference = theirs.architecture_difference(config)
      if difference:
        raise errors.CheckpointMismatchError(
          f"--ensemble member {member}: it was trained with {difference}; the members of an "
          "ensemble must be one architecture."
        )
      try:
        resolved.append((theirs, theirs.resolve(which)))
      except errors.UserError as e:
        raise type(e)(f"--ensemble member {member}: {e}") from e
    return resolved

  # ------------------------------------------------------------------------------- averages

  def average_plan(self, num_checkpoints: int, which: str) -> AveragePlan:
    """What --mode=average --num_checkpoints=K --checkpoint=which averages; UserError before
    any work if it cannot: latest (or auto) the newest K training checkpoints' params, best the
    newest K up to the best step, ema the parameter averages of the newest K."""
    if which not in ("auto", "latest", "best", "ema"):
      raise errors.ConfigError(
        f"--mode=average --checkpoint={which}: average reads training checkpoints; use auto, "
        "latest, best (the K up to the best step) or ema (their parameter averages)."
      )
    if which == "ema":
      self.resolve("ema")  # one line if the run kept no average
    steps, scope = self.training_steps(), ""
    if which == "best":
      best = self.best_step()
      steps, scope = [s for s in steps if s <= best], f" up to the best step {best}"
    chosen = averaging.last_steps(steps, num_checkpoints, self.checkpoints, scope)
    if which == "ema":
      return AveragePlan(chosen, "ema", EMA_PATH)
    return AveragePlan(chosen, "params", PARAMS_PATH)

  def save_average(self, params: Any, steps: Sequence[int], of: str) -> str:
    """Writes an average to averaged/<average_name>/<newest step> and names it in
    averaged/latest.json (after it is complete), so `--checkpoint=averaged` reads it. Making the
    same average again replaces it. Returns its path. Every process calls it."""
    steps = [int(s) for s in steps]
    directory = os.path.join(self.averaged, average_name(of, steps))
    info = {"averaged_steps": steps, "num_checkpoints": len(steps), "of": of}
    path = checkpointer.write(directory, steps[-1], {"params": params}, info, replace=True)
    training = self.training_steps()
    pointer = {
      "name": os.path.basename(directory),
      "steps": steps,
      "of": of,
      "newest_training_step": training[-1] if training else steps[-1],
    }
    if parallel.is_main_process():
      files.write_text(os.path.join(self.averaged, LATEST_AVERAGE), json.dumps(pointer) + "\n")
    logging.info("Wrote the average of steps %s to %s.", steps, path)
    return path
