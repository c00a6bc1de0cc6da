"""A run's saved config is the run's: what a later command may change, and the typed loader.

Once training has written `<workdir>/config.json`, it is the truth about the run. Every later
command (eval, translate, serve, export, attention, average, and training's resume) starts from
it, and `reconcile` says which of the command's values it may use. Every config field is of one
of four kinds, listed here and nowhere else (tests/unit/test_run_config.py checks that every field
of every installed config has one):

  FIXED      what the parameters compute or were trained on: the architecture, the vocabulary,
             the training data's identity (training prefix and split, languages, the demo's
             generator), the seed. A command that disagrees is refused before any work, with one
             line naming the field and both values.
  DECODING   implementation choices that compute the same function (the attention
             implementation, the compute dtype, how dropout masks are drawn), the longest source
             (data.max_len: training's length filter, decoding's cut), and where the evaluation
             sets come from (data.source, dir, tfds_name, the dev split): eval scores the test
             set they name, with the run's vocabulary (docs/wmt14.md scores the filtered
             newstest2014 from text files with a TFDS-trained model), and how training trains
             (dropout, label smoothing, the batch, the best metric), which no decoding command
             reads. Free for decoding commands (eval says so when its test set is not the
             run's own); fixed when training resumes (a run keeps its precision, masks, data and
             objective).
  RESUME     the length of training, evaluation and checkpoint cadence, checkpoints kept,
             early-stopping patience, the optimizer (its own rule stays: the EMA cannot be
             switched on or off, training/state.py), rematerialisation and the blocked loss
             (memory), fine-tuning's source (read at step 0 only). Free when training resumes,
             and irrelevant to other commands.
  FREE       decoding settings, which test set to score, evaluation batch sizes, the compile
             cache, where TFDS keeps its files and where a corpus is downloaded from.

A field a saved run does not have (added to the config since) takes the command's value; a field
that no installed config has (a user's own) is FIXED, the safe default. `model.dtype="auto"` is
resolved when training starts and saved resolved (`resolve_dtype`), so a resume on other hardware
cannot switch precision halfway through; a command's "auto" then means the run's. So does a
command's `model.attention="auto"` on a run saved with another kernel (AUTO_MEANS_THE_RUNS); a
run saved with "auto" keeps it unresolved, choosing per machine (model/attention_choice.py),
because every kernel it may pick computes the same function.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders  # the table of sizes: from_json

FIXED, DECODING, RESUME, FREE = "fixed", "decoding", "resume", "free"
TRAIN_MODES = ("train",)  # where DECODING fields are fixed: a resumed run keeps how it computes
CONFIG_FILE = "config.json"  # in the run's folder (run.folder.Workdir.config_path)

# Fields added to the config after runs were saved with it, with the value that reproduces what
# those runs did: a saved config.json without one of them equals a config that has it at this
# value (training/loop.py's finished-run check).
ADDED_FIELDS: dict[str, object] = {
  "model.d_k": 0,
  # Pretrained models' options (docs/pretrained.md).
  "model.activation": "relu",
  "model.attention_bias": False,
  "model.layer_norm_epsilon": 1e-6,
  "model.num_decoder_layers": 0,
  "model.logits_bias": False,
  "model.decoder_start": "pad",
  "data.lang_tag_format": "<2{}>",
  "data.lang_tokens": "",  # M2M100's language tokens came with its import
  "data.languages": "",
  "compile_cache": "auto",
  # Many directions (config/directions.py): a run saved before them is bilingual.
  "data.directions": "",
  "data.corpora": "",
  "data.temperature": 5.0,
  "data.zero_shot": "",
  # float16's loss scale (training/loss_scale.py): used by float16 runs only, which came later.
  "optim.loss_scale_init": 2.0**15,
  "optim.loss_scale_period": 2000,
  # LoRA fine-tuning (training/lora.py) came later.
  "optim.lora_rank": 0,
  "optim.lora_alpha": 16.0,
  "optim.lora_targets": "q,k,v,o",
  "optim.lora_dropout": 0.0,
  "eval.max_test_sentences": 0,
  "eval.bleu_protocol": "",  # a published BLEU protocol beside the others (decoding/bleu.py)
  "model.loss_block_tokens": 0,  # training's blocked output layer and loss came later
}


# Fields whose "auto", given to a saved run, means the run's own value: the dtype training
# resolved and recorded (resolve_dtype), and the attention kernel of a run saved before "auto"
# was the default ("ours"; one saved with "auto" keeps choosing per machine; `_keeps_the_runs`).
# A run saved before model.attention existed computed with ours: `_same_config` reads it so.
AUTO_MEANS_THE_RUNS = ("model.dtype", "model.attention")

# config.model fields that decide what a set of parameters computes: another run's parameters (an
# ensemble member, a fine-tuning source) must agree on each (run/selection.py). Shapes
# catch most size changes (checkpoints.params.check_fits), but not num_heads or pre_ln.
ARCHITECTURE = (
  "num_layers",
  "d_model",
  "d_ff",
  "num_heads",
  "d_k",
  "pre_ln",
  "positional",
  "share_embeddings",
  "activation",
  "attention_bias",
  "layer_norm_epsilon",
  "num_decoder_layers",
  "logits_bias",
  "decoder_start",
)

# Each field's kind, by dotted path; a group's entry ("decode") covers every field in it unless a
# longer path names the field. Anything not listed is FIXED.
KINDS: dict[str, str] = {
  # --- top level
  "num_train_steps": RESUME,
  "max_train_minutes": RESUME,
  "log_every_steps": RESUME,
  "eval_every_steps": RESUME,
  "checkpoint_every_steps": RESUME,
  "checkpoint_every_secs": RESUME,
  "keep_checkpoints": RESUME,
  "early_stopping_patience": RESUME,
  "skip_nonfinite": RESUME,
  "init_from": RESUME,
  "compile_cache": FREE,
  # --- the model: FIXED except how it is computed
  "model.dtype": DECODING,
  "model.attention": DECODING,
  "model.dropout_rng": DECODING,
  # Training kept the pairs no longer than this; a decoding command cuts its sources to it.
  "data.max_len": DECODING,
  # Where the evaluation sets are read from; training's own data stays fixed (train_prefix,
  # train_split, languages, vocabulary, batch, the demo's training size).
  "data.source": DECODING,
  "data.dir": DECODING,
  "data.tfds_name": DECODING,
  "data.dev_split": DECODING,
  "data.dev_prefix": DECODING,
  "data.demo_dev_size": DECODING,
  # How training trains: decoding commands never read these; a resumed run keeps them.
  "label_smoothing": DECODING,
  "best_metric": DECODING,
  "model.dropout_rate": DECODING,
  "model.attention_dropout_rate": DECODING,
  "model.relu_dropout_rate": DECODING,
  "optim.lora_dropout": DECODING,
  "data.tokens_per_batch": DECODING,
  "model.remat": RESUME,
  "model.loss_block_tokens": RESUME,  # memory, as remat: a resume on a smaller GPU may turn it on
  # --- the optimizer: today's rules (training/state.check_resume_fits)
  "optim": RESUME,
  # --- data: the training data's identity is FIXED; which test set, where files come from: FREE
  "data.test_split": FREE,
  "data.test_prefix": FREE,
  "data.extra_test_sets": FREE,
  "data.demo_test_size": FREE,
  "data.tfds_data_dir": FREE,
  "data.url": FREE,
  "data.prefetch_batches": FREE,
  # --- many directions: the trained directions are FIXED (a decoding command may narrow them,
  # `_narrows`); how they were sampled is training's; zero-shot scoring is a test set's choice.
  "data.corpora": DECODING,
  "data.temperature": DECODING,
  "data.zero_shot": FREE,
  # --- decoding and evaluation settings
  "decode": FREE,
  "eval": FREE,
}


def kind(path: str) -> str:
  """The kind of the field at dotted `path` (module docstring): its own entry, else its
  group's, else FIXED."""
  parts = path.split(".")
  for end in range(len(parts), 0, -1):
    found = KINDS.get(".".join(parts[:end]))
    if found is not None:
      return found
  return FIXED


def may_change(path: str, mode: str) -> bool:
  """Whether a `mode` command may use a value other than the run's saved one at `path`."""
  k = kind(path)
  if k == FIXED:
    return False
  if k == DECODING:
    return mode not in TRAIN_MODES
  return True


def flatten(config: ml_collections.ConfigDict | dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """{dotted path: value} of every leaf field."""
  out: dict[str, Any] = {}
  for key, value in config.items():
    path = f"{prefix}{key}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out.update(flatten(value, path + "."))
    else:
      out[path] = value
  return out


def _normal(value: Any) -> str:
  """A value as JSON, so a tuple equals its saved list and 1 equals 1.0."""
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  return json.dumps(value, sort_keys=True, default=str)


def _cast(template: Any, value: Any) -> Any:
  """`value` (read from JSON) in the type of the field it fills."""
  if isinstance(template, bool) or value is None or template is None:
    return value
  if isinstance(template, float) and isinstance(value, int):
    return float(value)
  if isinstance(template, tuple) and isinstance(value, list):
    return tuple(value)
  return value


def _overlay(node: ml_collections.ConfigDict, saved: dict[str, Any]) -> None:
  for key, value in saved.items():
    if key in node and isinstance(node[key], ml_collections.ConfigDict) and isinstance(value, dict):
      _overlay(node[key], value)
    elif key in node:
      node[key] = _cast(node[key], value)
    else:
      node[key] = ml_collections.ConfigDict(value) if isinstance(value, dict) else value


def from_json(text: str, source: str = CONFIG_FILE) -> ml_collections.ConfigDict:
  """The ConfigDict a saved config.json describes, with its fields' types: the builders' full
  config of its model size, overlaid with every saved value (cast to the field's type), plus any
  field the saved run had that no installed config has. ConfigError naming `source` if it is
  not a saved config."""
  try:
    saved = json.loads(text)
  except ValueError as e:
    raise errors.ConfigError(f"{source}: not JSON ({e}).") from None
  if isinstance(saved, dict) and "model_type" in saved and "model" not in saved:
    folder = os.path.dirname(source) or "."
    raise errors.ConfigError(
      f"{folder} is a transformers model (model_type {saved['model_type']!r}), not a run: import "
      f"it first (--mode=import --input={folder} --workdir=NEW), then use NEW."
    )
  if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
    raise errors.ConfigError(f"{source}: not a saved flaxformer_nmt config (no 'model' group).")
  size = saved["model"].get("size")
  config = builders.base_config(size if size in builders.SIZES else "tiny")
  config.unlock()
  _overlay(config, saved)
  return config


# config.json texts this process has read: {path: ((inode, size, mtime_ns), text)}. A command
# reads its run's config.json in several places before the run is opened (the command line's
# --config standing for it is loaded twice by absl and ml_collections, the API's load_run_config),
# and each would open the file again; the text is reused while the file is unchanged.
_READ: dict[str, tuple[tuple[int, int, int], str]] = {}


def read_saved_text(path: str) -> str | None:
  """The text of the config.json at `path`, or None if there is none; read once per process
  while the file stays as it was (its inode, size and modification time), so every reader of
  one command sees the same text."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    _READ.pop(path, None)
    return None
  except OSError as e:
    raise errors.ConfigError(f"{path}: cannot be read ({e.strerror}).") from None
  key = (st.st_ino, st.st_size, st.st_mtime_ns)
  kept = _READ.get(path)
  if kept is not None and kept[0] == key:
    return kept[1]
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except FileNotFoundError:
    return None
  except OSError as e:
    raise errors.ConfigError(f"{path}: cannot be read ({e.strerror}).") from None
  _READ[path] = (key, text)
  return text


def forget_saved_text(path: str) -> None:
  """After this process wrote `path`: the next read reads the file."""
  _READ.pop(path, None)


def reconcile(
  given: ml_collections.ConfigDict,
  saved_config: ml_collections.ConfigDict,
  mode: str,
  where: str,
  by_content: tuple[str, ...] = (),
) -> ml_collections.ConfigDict:
  """The config a `mode` command runs with on a saved run: the run's `saved_config`, with the
  command's value wherever `may_change` allows it, and wherever the run saved no such field.
  ConfigError (one line: the field, both values, `where` the run's config is) at the first field
  the command may not change; nothing is written either way."""
  ours, theirs = flatten(given), flatten(saved_config)
  result = ml_collections.ConfigDict(saved_config.to_dict())  # a copy, unlocked
  for path, value in ours.items():
    if path not in theirs:
      _set(result, path, value)
      continue
    old = theirs[path]
    if _normal(value) == _normal(old):
      continue
    if path in AUTO_MEANS_THE_RUNS and value == "auto" and _keeps_the_runs(path, old, mode):
      continue  # "auto" on a run that saved its own choice: the run's
    if path == "data.directions" and mode not in TRAIN_MODES and _narrows(value, old):
      _set(result, path, value)  # eval scores some of the run's directions
      continue
    if path in by_content and value:
      _set(result, path, value)
      continue
    if not may_change(path, mode):
      reason = {
        FIXED: "it decides what the parameters compute or were trained on",
        DECODING: "a resumed run keeps how it computes, the data it reads and how it trains",
      }[kind(path)]
      raise errors.ConfigError(
        f"config.{path}={value!r} disagrees with the run: {where} has {old!r}, and {reason}. "
        f"Drop that value (the run's config applies when --config is left out), or train in "
        f"another --workdir (config.init_from starts from this run's parameters)."
      )
    _set(result, path, value)
  return result


def _keeps_the_runs(path: str, old: Any, mode: str) -> bool:
  """Whether a command's "auto" for `path` means the run's saved `old`: always for the dtype;
  for the attention kernel when training resumes (a run keeps how it computes) or when the run
  saved "ours", while a decoding command on a run saved with "cudnn" or "jax" chooses per
  machine (cuDNN's is refused on a CPU, and every kernel computes the same function)."""
  return path != "model.attention" or mode in TRAIN_MODES or old == "ours"


def _narrows(value: Any, old: Any) -> bool:
  """Whether data.directions `value` is some of the run's `old` directions (eval may score
  fewer; anything else changes what the model was trained on)."""
  ours = [d.strip() for d in str(value).split(",") if d.strip()]
  theirs = {d.strip() for d in str(old).split(",") if d.strip()}
  return bool(ours) and set(ours) <= theirs


def _set(config: ml_collections.ConfigDict, path: str, value: Any) -> None:
  *groups, name = path.split(".")
  node = config
  for group in groups:
    if group not in node:
      node[group] = ml_collections.ConfigDict()
    node = node[group]
  if name in node and node[name] is not None and value is not None:
    node[name] = _cast(node[name], value)
  else:
    node[name] = value


def resolve_dtype(config: ml_collections.ConfigDict, resolved: str, *, resuming: bool) -> None:
  """Training records the compute dtype it runs with: "auto" becomes `resolved` (what it means
  on this machine), so config.json says the precision and a resume keeps it.

  A run that is `resuming` with "auto" still in its config.json was saved before dtypes were
  recorded, when "auto" never meant float16: where it would mean float16 now (an older GPU), it
  keeps float32, what it trained in, rather than switching precision halfway.
  """
  if config.model.dtype == "auto":
    config.model.dtype = "float32" if resuming and resolved == "float16" else resolved
