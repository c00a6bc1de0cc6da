"""A run's folder, and the one type that knows what it holds: `Workdir`.

  <workdir>/
    config.json                 the config training ran with (compared on every rerun), its
                                paths absolute (run/command.py)
    run.json                    what the run was made from: the config's name as given
                                (--config=demo) and its training data's fingerprint
                                (run/identity.py), checked on every resume
    spm.model                   the shared vocabulary: trained here, or a copy of the file
                                config.data.vocab_path names (runs from before: that file)
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

No other module joins a path inside a workdir: it asks this one. Which parameters a command
reads (--checkpoint, best/, averaged/, the EMA) is run/selection.py's; what a later
command may change of config.json is config/run_config.py's.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import run_config
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.runtime import files

VOCABULARY = "spm.model"
IMPORT_RECORD = "import.json"  # where an imported run came from (importing/imported_run.py)
LATEST_AVERAGE = "latest.json"  # averaged/latest.json: the average written last
IMPORTED = "imported"  # averaged/imported/0: an imported model's parameters
BEST_INCOMING = ".incoming"  # a new evaluation of best/'s step, written before it is swapped in
BEST_OUTGOING = ".outgoing"  # the step it replaces, renamed aside until the swap is done
# An imported Marian model's vocabulary (data/pair_vocabulary.py): source.spm, target.spm,
# vocab.json in this folder.
PAIR_VOCABULARY = "vocabulary"
_UNREAD = object()  # config.json not read yet


class Workdir:
  """The layout of one run's folder (module docstring), and the choices made from what is in it."""

  def __init__(self, path: str) -> None:
    self.path = str(path)
    self._config_text: str | None | object = _UNREAD
    self._made: str | None = None  # the topmost folder `create` made ("" none), None: not asked

  def __repr__(self) -> str:
    return f"Workdir({self.path!r})"

  def join(self, *parts: str) -> str:
    return os.path.join(self.path, *parts)

  # ------------------------------------------------------------------------------- the folder

  def check(self) -> None:
    """ConfigError if `--workdir` names something other than a directory (before any work)."""
    if os.path.exists(self.path) and not os.path.isdir(self.path):
      raise errors.ConfigError(f"--workdir={self.path} exists and is not a directory.")
    parent = os.path.dirname(os.path.abspath(self.path))
    while not os.path.exists(parent):
      parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
      raise errors.ConfigError(f"--workdir={self.path}: {parent} is a file, not a folder.")

  def holds_run(self) -> bool:
    """Whether the folder holds a run a command may resume or read: its config.json, or the
    checkpoints/ of a run trained before runs saved config.json."""
    return os.path.isfile(self.config_path) or os.path.isdir(self.checkpoints)

  def create(self) -> None:
    """Makes the folder (and any missing parent: `remove_if_empty` removes those it made too);
    one line (ConfigError) if it cannot be made (under a file, read-only)."""
    self.check()
    if self._made is None:
      self._made = self.first_missing()
    try:
      os.makedirs(self.path, exist_ok=True)
    except OSError as e:
      raise errors.ConfigError(
        f"--workdir={self.path} cannot be created: {e.strerror or e} ({e.filename or self.path})."
      ) from None

  def first_missing(self) -> str:
    """The topmost folder of the path that does not exist yet ("" when the folder exists)."""
    top = os.path.abspath(self.path)
    if os.path.exists(top):
      return ""
    while not os.path.exists(os.path.dirname(top)):
      top = os.path.dirname(top)
    return top

  def remove_if_empty(self, made: str | None = None) -> None:
    """Deletes the folder if no file is in it (a new run refused before any work: a missing
    corpus, a wrong field). A lock file means another job holds it, and it stays: so does any
    file written there. `made` (default: what this object's `create` made) is the topmost
    parent made for it: those up to it go too when empty."""
    if os.path.isdir(self.path):
      if any(names for _, _, names in os.walk(self.path)):
        return
      shutil.rmtree(self.path, ignore_errors=True)
    # The parents `create` made for it (--workdir=newA/newB), up to the first that held anything.
    top = (made if made is not None else self._made) or ""
    current = os.path.dirname(os.path.abspath(self.path))
    while top and (current + os.sep).startswith(top + os.sep) and os.path.isdir(current):
      try:
        os.rmdir(current)  # only an empty folder
      except OSError:
        break
      if current == top:
        break
      current = os.path.dirname(current)

  def remove_entries(self, names: set[str]) -> None:
    """Removes these files and folders of the run's folder (what a failed command made)."""
    for name in names:
      path = self.join(name)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

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
  def best_incoming(self) -> str:
    """best/.incoming: a new evaluation of best/'s step, written there before the swap."""
    return self.join("best", BEST_INCOMING)

  @property
  def best_outgoing(self) -> str:
    """best/.outgoing: the step being replaced, renamed aside during the swap."""
    return self.join("best", BEST_OUTGOING)

  def best_step(self, step: int) -> str:
    """best/<step>: the best parameters, named by their training step."""
    return self.join("best", str(step))

  def average_dir(self, name: str) -> str:
    """averaged/<name>: one average's checkpoints (`selection.average_name`, or IMPORTED)."""
    return self.join("averaged", name)

  @property
  def latest_average_path(self) -> str:
    """averaged/latest.json: which average was written last."""
    return self.join("averaged", LATEST_AVERAGE)

  @property
  def pair_vocabulary_dir(self) -> str:
    """vocabulary/: an imported Marian model's vocabulary (data/pair_vocabulary.py)."""
    return self.join(PAIR_VOCABULARY)

  @property
  def import_record(self) -> str:
    return self.join(IMPORT_RECORD)

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
  def run_record_path(self) -> str:
    return self.join("run.json")

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
    return self.join(run_config.CONFIG_FILE)

  def metrics_path(self, split: str) -> str:
    """`<split>_metrics.jsonl`: train figures at each log step, dev at each evaluation."""
    return self.join(f"{split}_metrics.jsonl")

  def result_path(self, mode: str) -> str:
    """`<mode>_result.json`: the latest final figures of a mode."""
    return self.join(f"{mode}_result.json")

  def vocabulary(self, config: ml_collections.ConfigDict | None = None) -> str:
    """The run's vocabulary: `<workdir>/vocabulary/` when it holds a Marian model's (imported,
    or copied from init_from's source), else its SentencePiece model. A run that has started
    training (it saved config.json)
    reads its own `<workdir>/spm.model` (trained here, or copied from data.vocab_path): the file
    that path names may change or move later. Before that, and for a run from before the copy,
    `data.vocab_path` of `config` (default: of the run's saved config.json) when given; else
    where `<workdir>/spm.model` is (or is to be trained)."""
    if os.path.isdir(self.join(PAIR_VOCABULARY)):  # imported, or copied from init_from's source
      return self.join(PAIR_VOCABULARY)
    own = self.join(VOCABULARY)
    if os.path.isfile(own) and os.path.isfile(self.config_path):
      return own
    if config is not None:
      vocab_path = config.data.vocab_path
    else:
      vocab_path = self.saved_config().get("data", {}).get("vocab_path", "")
    return vocab_path or own

  def own_vocabulary(self, given: str) -> str:
    """Where this run keeps a copy of the vocabulary at `given`: `spm.model` for a SentencePiece
    file, `vocabulary/` for a Marian folder (data/pair_vocabulary.py)."""
    return self.join(PAIR_VOCABULARY if os.path.isdir(given) else VOCABULARY)

  def copy_vocabulary(self, given: str) -> str:
    """Copies the vocabulary at `given` into the run (`own_vocabulary`), replacing one left by
    an earlier attempt; a Marian or M2M100 folder's vocabulary files only. Returns the copy's
    path."""
    own = self.own_vocabulary(given)
    if os.path.isdir(given):
      scratch = f"{own}.tmp-{os.getpid()}"
      shutil.rmtree(scratch, ignore_errors=True)
      os.makedirs(scratch)
      for name in tokenizer_lib.folder_files(given):
        if name != "tokenizer_config.json" or os.path.isfile(os.path.join(given, name)):
          shutil.copyfile(os.path.join(given, name), os.path.join(scratch, name))
      shutil.rmtree(own, ignore_errors=True)
      os.replace(scratch, own)
    else:
      with files.atomic_path(own) as scratch:
        shutil.copyfile(given, scratch)
    return own

  def kept_vocabulary(self) -> str | None:
    """The run's own copy of its vocabulary (`vocabulary/`, else `spm.model`) once the run has
    started (saved config.json), or None: from then on the run's vocabulary is fixed."""
    if not os.path.isfile(self.config_path):
      return None
    for own in (self.join(PAIR_VOCABULARY), self.join(VOCABULARY)):
      if os.path.exists(own):
        return own
    return None

  def keep_vocabulary(self, config: ml_collections.ConfigDict) -> None:
    """Copies the vocabulary data.vocab_path names into the run (`spm.model`, or `vocabulary/`
    for a Marian folder) when training first starts, so the run keeps its vocabulary whatever
    happens to that path later (process 0, once the run's checks have passed). Copied once: a
    copy left by a start killed before config.json is replaced, but a started run's copy never
    is (run/command.py refuses a differing file before any work; this is the last guard)."""
    given = config.data.vocab_path
    if not given or not os.path.exists(given):
      return
    own = self.own_vocabulary(given)
    if os.path.exists(own) and tokenizer_lib.same_vocabulary(own, given):
      return
    kept = self.kept_vocabulary()
    if kept is not None:
      raise errors.ConfigError(
        f"config.data.vocab_path={given}: its content differs from {kept}, the vocabulary "
        f"{self.path} has held since its first start."
      )
    self.copy_vocabulary(given)

  # ------------------------------------------------------------------------------- records

  def saved_config_text(self) -> str | None:
    """config.json's text, or None if the run saved none: read once per Workdir (a command's
    checks, selection and resume all ask), and kept in step with `write_config`."""
    if self._config_text is _UNREAD:
      self._config_text = run_config.read_saved_text(os.path.abspath(self.config_path))
    return self._config_text  # type: ignore[return-value]

  def saved_config(self) -> dict[str, Any]:
    """The config a training run saved here (as JSON), or {} if it saved none (or it is torn:
    run_config.from_json names that)."""
    text = self.saved_config_text()
    try:
      return json.loads(text) if text else {}
    except ValueError:
      return {}

  def run_record(self) -> dict[str, Any]:
    """run.json (what the run was made from), or {} for a run from before it."""
    try:
      with open(self.run_record_path, encoding="utf-8") as f:
        return json.load(f)
    except (OSError, ValueError):
      return {}

  def imported(self) -> bool:
    """Whether the run was made by --mode=import (run.json's training data says so, or its
    import.json is there)."""
    kind = (self.run_record().get("training_data") or {}).get("kind")
    return kind == "imported" or os.path.isfile(self.import_record)

  def training_data(self) -> dict[str, Any] | None:
    """The fingerprint of the data the run trained on (run/identity.py), if it recorded one."""
    return self.run_record().get("training_data")

  def trained_with(self) -> str:
    """The config the run was trained with, as its first training command named it ("" if
    unknown)."""
    return str(self.run_record().get("config", ""))

  def write_run_record(self, config_name: str, training_data: dict[str, Any]) -> None:
    record = {"config": config_name or self.trained_with(), "training_data": training_data}
    files.write_text(self.run_record_path, json.dumps(record, indent=2) + "\n")

  def write_config(self, config: ml_collections.ConfigDict) -> None:
    text = config.to_json_best_effort(indent=2)
    files.write_text(self.config_path, text)
    run_config.forget_saved_text(os.path.abspath(self.config_path))
    self._config_text = text

  def write_result(self, result: dict[str, Any], *, echo: bool = True) -> None:
    """A mode's figures to `<mode>_result.json` and `results.jsonl`, then (echo) to stdout."""
    files.write_result(
      self.result_path(result["mode"]), self.join("results.jsonl"), result, echo=echo
    )

  def read_result(self, mode: str) -> dict[str, Any] | None:
    return files.read_result(self.result_path(mode))

  def dev_records(self) -> list[dict[str, Any]]:
    return files.read_jsonl(self.metrics_path("dev"))

  # ------------------------------------------------------------------------------- checkpoints

  def training_steps(self) -> list[int]:
    from flaxformer_nmt.checkpoints import reader  # pylint: disable=g-import-not-at-top (no JAX for cli)

    return reader.CheckpointDir(self.checkpoints).steps()
