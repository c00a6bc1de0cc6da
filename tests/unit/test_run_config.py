"""A run's saved config rules (config/run_config.py): the kinds of field, the typed loader, and
what each mode may change, down to the modes refusing a conflict without touching the workdir."""

from __future__ import annotations

import json

import pytest

from flaxformer_nmt import api, errors
from flaxformer_nmt.config import builders, loading, run_config
from flaxformer_nmt.config.run_config import DECODING, FIXED, FREE, RESUME

import helpers

# Every installed config, with each variant its file takes.
SPECS = [
  "demo",
  "multi30k",
  "wmt14_ende_base",
  "wmt14_ende_base:files",
  "wmt14_ende_big",
  "wmt14_enfr_big",
  "wmt14_table3:B1",
  "wmt14_table3:E",
]


def test_every_listed_kind_names_a_real_field_or_group():
  """No stale entry: each path in KINDS is a field or group of the builders' full config."""
  fields = run_config.flatten(builders.base_config("base"))
  groups = {p.rsplit(".", 1)[0] for p in fields if "." in p}
  for path in run_config.KINDS:
    assert path in fields or path in groups, path


@pytest.mark.parametrize(
  "path,kind",
  [
    # what the parameters compute, their vocabulary, the training data's identity, the seed
    *[
      (f"model.{f}", FIXED)
      for f in (
        "num_layers",
        "d_model",
        "d_ff",
        "num_heads",
        "d_k",
        "pre_ln",
        "positional",
        "share_embeddings",
      )
    ],
    *[
      (f"data.{f}", FIXED)
      for f in (
        "train_prefix",
        "train_split",
        "src_lang",
        "tgt_lang",
        "vocab_size",
        "vocab_path",
        "demo_train_size",
        "demo_seed",
      )
    ],
    # where the evaluation sets come from: free for decoding, fixed for training
    *[(f"data.{f}", DECODING) for f in ("source", "dir", "tfds_name", "dev_prefix")],
    ("seed", FIXED),
    # how training trains: no decoding command reads it
    *[(f, DECODING) for f in ("label_smoothing", "best_metric", "model.dropout_rate")],
    ("data.tokens_per_batch", DECODING),
    ("a_users_own_field", FIXED),
    # how it computes: free for decoding commands only
    ("model.dtype", DECODING),
    ("model.attention", DECODING),
    ("data.max_len", DECODING),
    # the length and cadence of training, the optimizer
    *[
      (f, RESUME)
      for f in (
        "num_train_steps",
        "max_train_minutes",
        "eval_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "early_stopping_patience",
        "optim.lr_scale",
        "optim.ema_decay",
      )
    ],
    # decoding, which test set, evaluation batch sizes
    ("decode.beam_size", FREE),
    ("decode.batch_size", FREE),
    ("eval.dev_bleu_sentences", FREE),
    ("data.test_prefix", FREE),
    ("data.test_split", FREE),
    ("compile_cache", FREE),
  ],
)
def test_kinds(path, kind):
  assert run_config.kind(path) == kind


def test_what_each_mode_may_change():
  assert not run_config.may_change("model.num_heads", "eval")
  assert not run_config.may_change("model.num_heads", "train")
  assert run_config.may_change("model.dtype", "translate")
  assert not run_config.may_change("model.dtype", "train")
  assert run_config.may_change("num_train_steps", "train")
  assert run_config.may_change("decode.alpha", "train")


@pytest.mark.parametrize("spec", SPECS)
def test_from_json_gives_back_the_config_with_its_types(spec):
  config = loading.load(spec)
  loaded = run_config.from_json(config.to_json_best_effort(indent=2))
  assert loaded.to_json_best_effort(indent=2) == config.to_json_best_effort(indent=2)
  for path, value in run_config.flatten(config).items():
    assert type(run_config.flatten(loaded)[path]) is type(value), path  # 1.0 stays a float


def test_from_json_keeps_a_users_own_fields_and_fills_fields_added_since():
  saved = json.loads(loading.load("demo").to_json_best_effort())
  saved["my_note"] = "run 7"
  del saved["model"]["d_k"]  # a run saved before the field existed
  loaded = run_config.from_json(json.dumps(saved))
  assert loaded.my_note == "run 7" and loaded.model.d_k == 0


@pytest.mark.parametrize(
  "text,message", [("{", "not JSON"), ("[1]", "not a saved flaxformer_nmt config")]
)
def test_from_json_names_the_file(text, message):
  with pytest.raises(errors.ConfigError, match=f"runs/x/config.json: {message}"):
    run_config.from_json(text, "runs/x/config.json")


def test_reconcile_takes_what_the_mode_may_change_and_refuses_the_rest():
  saved = loading.load("demo")
  saved.model.dtype = "float32"  # resolved when it trained
  given = loading.load("demo")
  given.decode.beam_size, given.num_train_steps = 8, 900
  for mode in ("eval", "train"):
    out = run_config.reconcile(given, saved, mode, "w/config.json")
    assert (out.decode.beam_size, out.num_train_steps, out.model.dtype) == (8, 900, "float32")
  given.model.dtype = "bfloat16"
  assert run_config.reconcile(given, saved, "translate", "w").model.dtype == "bfloat16"
  with pytest.raises(errors.ConfigError, match="a resumed run keeps how it computes"):
    run_config.reconcile(given, saved, "train", "w")
  given = loading.load("demo")
  given.model.num_heads = 2
  message = r"config.model.num_heads=2 disagrees with the run: w/config.json has 4"
  for mode in ("eval", "translate", "train", "average", "serve"):
    with pytest.raises(errors.ConfigError, match=message):
      run_config.reconcile(given, saved, mode, "w/config.json")


def test_the_attention_default_auto_keeps_an_older_runs_own_choice():
  """Runs saved when "ours" was the default resume and decode with ours under today's "auto";
  a run saved with "auto" keeps choosing per machine; "ours" given to an "auto" run is a change a
  resumed run refuses and a decoding command may make; a run saved with "cudnn" resumes with it
  and is decoded with "auto" (cuDNN's kernel is refused on a CPU)."""
  saved, given = loading.load("demo"), loading.load("demo")
  assert given.model.attention == "auto"
  saved.model.attention = "ours"
  for mode in ("train", "eval", "translate"):
    assert run_config.reconcile(given, saved, mode, "w").model.attention == "ours"
  saved.model.attention, given.model.attention = "auto", "ours"
  assert run_config.reconcile(given, saved, "eval", "w").model.attention == "ours"
  with pytest.raises(errors.ConfigError, match="config.model.attention='ours' disagrees"):
    run_config.reconcile(given, saved, "train", "w")
  # A run trained with cuDNN's kernel: resumed with it, decoded by whatever this machine has.
  saved.model.attention, given.model.attention = "cudnn", "auto"
  assert run_config.reconcile(given, saved, "train", "w").model.attention == "cudnn"
  for mode in ("eval", "translate"):
    assert run_config.reconcile(given, saved, mode, "w").model.attention == "auto"


def test_resolve_dtype_records_what_auto_meant():
  config = loading.load("demo")
  run_config.resolve_dtype(config, "bfloat16", resuming=False)
  assert config.model.dtype == "bfloat16"
  run_config.resolve_dtype(config, "float32", resuming=True)  # a resolved dtype stays
  assert config.model.dtype == "bfloat16"


@pytest.mark.parametrize(
  ("resolved", "resuming", "expected"),
  [
    ("float16", False, "float16"),  # a new run on a T4 or V100
    ("float16", True, "float32"),  # a run from before dtypes were recorded: it trained in float32
    ("bfloat16", True, "bfloat16"),  # what "auto" meant before float16 existed too
    ("float32", True, "float32"),
  ],
)
def test_auto_never_switches_a_resumed_run_to_float16(resolved, resuming, expected):
  config = loading.load("demo")
  assert config.model.dtype == "auto"
  run_config.resolve_dtype(config, resolved, resuming=resuming)
  assert config.model.dtype == expected


def test_a_trained_run_needs_no_config_and_refuses_a_conflict_untouched(saved_run):
  """The committed trained run: eval with the workdir alone gives the figures eval gives with
  its own config; another num_heads (same parameter shapes) or another experiment's config is one
  line, and the run's config.json and eval/ stay byte for byte as they were."""
  config, work = saved_run
  mine = api.evaluate(None, str(work), checkpoint="latest")
  assert mine == api.evaluate(config, str(work), checkpoint="latest")
  before = helpers.snapshot(work)
  wrong_heads = api.load_config("demo", {**helpers.saved_run_overrides(), "model.num_heads": 4})
  with pytest.raises(errors.ConfigError, match="config.model.num_heads=4 disagrees with the run"):
    api.evaluate(wrong_heads, str(work))
  with pytest.raises(errors.ConfigError, match="config.model.num_heads=4 disagrees with the run"):
    api.train(wrong_heads, str(work))
  with pytest.raises(errors.ConfigError, match="disagrees with the run"):
    api.translate(api.load_config("demo"), str(work), ["one"])
  assert helpers.snapshot(work) == before


def test_the_api_loads_a_runs_config_with_overrides(saved_run, tmp_path):
  config, work = saved_run
  loaded = api.load_run_config(str(work), {"decode.beam_size": 3})
  assert loaded.decode.beam_size == 3 and loaded.model.num_heads == config.model.num_heads
  assert api.evaluate(loaded, str(work), checkpoint="latest")["test_sentences"] == 8
  # Issue 62: the API has no --config, so its messages do not ask for one.
  with pytest.raises(errors.ConfigError, match="has no config.json: no run was trained or"):
    api.load_run_config(str(tmp_path))
  with pytest.raises(errors.ConfigError, match=r"^\S+/missing: no such folder \(a trained or"):
    api.load(str(tmp_path / "missing"))
