"""One table of model sizes and one builder for every experiment config.

Experiment files in `configs/` are two lines: pick a size, pick the data. Keeping the sizes as data
(not as copied config files) means Table 3 of the paper is readable in one place and a fix to the
shared defaults reaches every experiment.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from flaxformer_nmt import errors


@dataclasses.dataclass(frozen=True)
class Size:
  """Architecture hyper-parameters of one row of the paper's Table 3 (or our small ones)."""

  num_layers: int  # N, for encoder and decoder alike
  d_model: int
  d_ff: int
  num_heads: int  # h; d_k = d_v = d_model / h
  dropout_rate: float  # P_drop


# Table 3 of Vaswani et al. (2017), plus small sizes for CPU runs. "Attention Is All You Need" base
# and big rows are verbatim; d_k = d_v = d_model / h throughout.
SIZES: dict[str, Size] = {
  "base": Size(num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout_rate=0.1),
  "big": Size(num_layers=6, d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3),
  # Multi30k-sized model (29k pairs): see configs/multi30k.py for why.
  "small": Size(num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout_rate=0.3),
  # The offline demo and the tests.
  "tiny": Size(num_layers=2, d_model=128, d_ff=512, num_heads=4, dropout_rate=0.1),
}


def model_config(size: str) -> ml_collections.ConfigDict:
  """The `config.model` block for a named size."""
  if size not in SIZES:
    _fail(f"Unknown model size {size!r}; choose one of {sorted(SIZES)}.")
  s = SIZES[size]
  return ml_collections.ConfigDict(
    dict(
      size=size,
      num_layers=s.num_layers,
      d_model=s.d_model,
      d_ff=s.d_ff,
      num_heads=s.num_heads,
      dropout_rate=s.dropout_rate,
      # The paper applies dropout to sub-layer outputs and embedding sums only.
      attention_dropout_rate=0.0,
      relu_dropout_rate=0.0,
      pre_ln=False,  # The paper is post-LN: LayerNorm(x + Dropout(Sublayer(x))).
      positional="sinusoidal",  # or "learned" (Table 3 row E)
      share_embeddings=True,  # source, target and pre-softmax share one matrix
      max_len=256,  # longest sequence a learned positional table (or decode) supports
      # Matrix products in "bfloat16" or "float32"; "auto": bfloat16 on TPUs and on GPUs from
      # Ampere (A100, H100) on, float32 on CPUs and older GPUs. Parameters, Adam moments,
      # layer norms, softmaxes, logits and the loss are float32 in every case.
      dtype="auto",
      remat=False,  # recompute each layer's activations in the backward pass (saves memory)
      # How dropout masks are drawn: "threefry16" (two 16-bit masks per 32-bit draw: half the
      # random-number work; the rate is rounded to 1/65536), "threefry" (jax.random.bernoulli),
      # "rbg" (XLA's RngBitGenerator: fastest on TPUs, slowest on CPUs). See layers.py.
      dropout_rng="threefry16",
      # Which softmax attention trains and scores: "ours" (attention_layers.py: float32 scores
      # and a hand-written backward) or "jax" (jax.nn.dot_product_attention: cuDNN's fused
      # kernel on GPUs where it supports the shapes, XLA elsewhere; no attention dropout).
      # Incremental decoding always runs ours.
      attention="ours",
    )
  )


def base_config(size: str) -> ml_collections.ConfigDict:
  """Every field with the paper's default; experiment configs override data and schedule."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_train_steps = 100_000  # the paper's base model: 100k steps; big: 300k
  # Also stop (with a checkpoint) after this many minutes of training, counted over the whole run
  # (a resumed run continues the count saved in the checkpoint); 0 = no limit. Evaluation time does
  # not count. For fixed-budget runs such as benchmarks/multi30k.sh.
  c.max_train_minutes = 0.0
  c.log_every_steps = 100
  c.eval_every_steps = 1_000
  c.checkpoint_every_steps = 1_000
  c.checkpoint_every_secs = 0  # >0 also saves every this many seconds (the paper: 600)
  c.keep_checkpoints = 20  # enough to average the last 20, as the paper's big model
  c.skip_nonfinite = False  # True: skip a step whose loss or gradients are not finite
  c.label_smoothing = 0.1  # eps_ls

  c.model = model_config(size)

  c.optim = ml_collections.ConfigDict(
    dict(
      warmup_steps=4_000,
      beta1=0.9,
      beta2=0.98,
      eps=1e-9,
      lr_scale=1.0,  # multiplies the paper's schedule
      # Split each device's share of the batch into this many micro-batches, run one after
      # another inside the step, their gradients summed: the same update with 1/k of the
      # activation memory. data.tokens_per_batch stays the batch of one update.
      accumulate_steps=1,
    )
  )

  c.data = ml_collections.ConfigDict(
    dict(
      source="demo",  # "demo" | "tfds" | "files"
      # TFDS: the builder's name; its supervised keys are (de, en) / (fr, en).
      tfds_name="wmt14_translate/de-en",
      tfds_data_dir="",  # "" = TFDS default
      train_split="train",
      dev_split="validation",  # newstest2013
      test_split="test",  # newstest2014
      src_lang="en",
      tgt_lang="de",
      # Local files: <dir>/<prefix>.<lang>[.gz], or a .tsv via <prefix>.tsv.
      dir="",
      # Where --mode=prepare downloads the files into `dir` from (Multi30k only: its files'
      # checksums are recorded in data/download.py); "" = the files are already there.
      url="",
      # Multi30k test sets fetched besides test_prefix's: comma-separated names of
      # data/download.py's MULTI30K_EXTRA_TEST_SETS, or "all".
      extra_test_sets="",
      train_prefix="train",
      dev_prefix="val",
      test_prefix="test",
      # Vocabulary (SentencePiece, shared by both languages).
      vocab_size=37_000,
      vocab_model_type="bpe",
      vocab_sample_size=1_000_000,  # sentences per language used to train it
      vocab_path="",  # "" = <workdir>/spm.model, trained when absent
      # Batching: a global budget of source tokens and of target tokens per update, over all
      # devices of all processes (and all micro-batches, see optim.accumulate_steps).
      tokens_per_batch=25_000,
      max_len=256,  # pairs with either side longer (in tokens) are dropped and counted
      # Training batches packed ahead in a background thread (data/prefetch.py), while the
      # device computes; 0 = pack each in the training loop.
      prefetch_batches=2,
      # Demo generator sizes.
      demo_train_size=200_000,
      demo_dev_size=500,
      demo_test_size=1_000,
      demo_seed=0,  # the demo corpus's own seed, so runs that differ in `seed` share data
    )
  )

  c.decode = ml_collections.ConfigDict(
    dict(
      beam_size=4,
      alpha=0.6,  # length penalty ((5 + len) / 6) ** alpha
      # "t2t": K live hypotheses from the top 2K plus the K best finished, as tensor2tensor (which
      # gave the paper's BLEU); "shrinking": a finished hypothesis keeps its slot, so the live
      # beam shrinks (beam 1 is then exactly greedy). See search.py.
      beam_style="shrinking",
      max_len_offset=50,  # maximum output length = input length + this
      batch_size=64,  # sentences per device in a decoding batch (all devices decode)
    )
  )

  c.eval = ml_collections.ConfigDict(
    dict(
      dev_bleu_sentences=256,  # dev sentences decoded at each eval during training
      dev_bleu_beam_size=1,  # greedy during training to keep evals cheap
      # Tokenized BLEU's ##AT## compound split (t2t's EN-DE script): "auto" = for German targets
      # only (EN-FR's tokenized BLEU is Moses + multi-bleu without it), "on", "off".
      compound_split="auto",
    )
  )
  return c


# WMT14 pairs as the paper ran them: TFDS builder, direction, shared word-piece vocabulary size.
WMT14_PAIRS: dict[str, tuple[str, str, str, int]] = {
  "en-de": ("wmt14_translate/de-en", "en", "de", 37_000),
  "en-fr": ("wmt14_translate/fr-en", "en", "fr", 32_000),
}
# Where a WMT14 config reads its data: `--config=configs/wmt14_ende_base.py:files`.
WMT14_DATA = ("tfds", "files")
# Steps between the checkpoints that get averaged: the paper saved every 10 minutes, which on its
# 8 P100s was ~1,400 steps of the base model (100k steps in 12 hours) and ~600 of the big one
# (300k steps in 3.5 days). Saving by steps keeps "the last 5 / 20" the paper's window on any
# hardware; by wall clock it would cover several times more steps on a fast machine.
WMT14_CHECKPOINT_EVERY_STEPS = {"base": 1_500, "big": 600}


def wmt14_config(size: str, pair: str, data: str = "tfds") -> ml_collections.ConfigDict:
  """The paper's WMT14 set-up (Sec. 5 and 6.1), as tensor2tensor ran it.

  TFDS data (or, with `data="files"`, the user's text files: `<data.dir>/train.<lang>`, and
  newstest2013 / newstest2014 as dev / test), the pair's shared vocabulary, 25,000 source and
  target tokens per update, 100k (base) or 300k (big) steps, checkpoints every 1,500 (base) or 600
  (big) steps so the last 5 / 20 averaged span the paper's window, and t2t's beam search.
  """
  if pair not in WMT14_PAIRS:
    _fail(f"Unknown WMT14 pair {pair!r}; choose one of {sorted(WMT14_PAIRS)}.")
  if data not in WMT14_DATA:
    _fail(f"Unknown WMT14 data {data!r} (after the config file's ':'); choose one of {WMT14_DATA}.")
  tfds_name, src, tgt, vocab = WMT14_PAIRS[pair]
  c = base_config(size)
  c.data.source = "tfds"
  c.data.tfds_name = tfds_name
  if data == "files":
    c.data.source = "files"
    c.data.dir = ""  # --config.data.dir=DIR: required
    c.data.train_prefix, c.data.dev_prefix, c.data.test_prefix = (
      "train",
      "newstest2013",
      "newstest2014",
    )
  c.data.src_lang, c.data.tgt_lang = src, tgt
  c.data.vocab_size = vocab
  c.num_train_steps = 100_000 if size == "base" else 300_000
  c.checkpoint_every_steps = WMT14_CHECKPOINT_EVERY_STEPS.get(size, 1_500)
  c.checkpoint_every_secs = 0
  c.decode.beam_style = "t2t"
  return c


# Table 3 of the paper: variations of the base model on EN-DE, scored on newstest2013 (dev) with
# beam search and no checkpoint averaging. Each row: the config fields it changes, and the
# parameter count the paper gives (millions; rows (A) and (D) leave the base's 65M). Row (B),
# a key size d_k other than d_model / h, is not expressible here: d_k = d_model / h throughout.
TABLE3: dict[str, tuple[dict[str, object], int]] = {
  "A1": ({"model.num_heads": 1}, 65),  # d_k = d_v = 512
  "A2": ({"model.num_heads": 4}, 65),  # 128
  "A3": ({"model.num_heads": 16}, 65),  # 32
  "A4": ({"model.num_heads": 32}, 65),  # 16
  "C1": ({"model.num_layers": 2}, 36),
  "C2": ({"model.num_layers": 4}, 50),
  "C3": ({"model.num_layers": 8}, 80),
  "C4": ({"model.d_model": 256}, 28),  # d_k = 32
  "C5": ({"model.d_model": 1024}, 168),  # d_k = 128
  "C6": ({"model.d_ff": 1024}, 53),
  "C7": ({"model.d_ff": 4096}, 90),
  "D1": ({"model.dropout_rate": 0.0}, 65),
  "D2": ({"model.dropout_rate": 0.2}, 65),
  "D3": ({"label_smoothing": 0.0}, 65),
  "D4": ({"label_smoothing": 0.2}, 65),
  "E": ({"model.positional": "learned"}, 65),
}


def set_field(config: ml_collections.ConfigDict, path: str, value: object) -> None:
  """config.<path> = value for a dotted path ("model.d_ff"); a ConfigError names a missing field."""
  *groups, field = path.split(".")
  node = config
  for depth, group in enumerate(groups):
    if group not in node:
      _fail(f"config has no group {'.'.join(groups[: depth + 1])!r}.")
    node = node[group]
  if field not in node:
    _fail(f"config has no field {path!r}.")
  node[field] = value


def wmt14_table3_config(row: str, data: str = "tfds") -> ml_collections.ConfigDict:
  """One row of Table 3: the base EN-DE recipe with that row's change, evaluated on newstest2013
  (`--mode=eval` scores the dev split) from the last checkpoint, as the paper's table."""
  if row not in TABLE3:
    _fail(f"Unknown Table 3 row {row!r}; choose one of {sorted(TABLE3)} (row B is not supported).")
  c = wmt14_config("base", "en-de", data)
  for path, value in TABLE3[row][0].items():
    set_field(c, path, value)
  if data == "tfds":
    c.data.test_split = c.data.dev_split  # newstest2013
  else:
    c.data.test_prefix = c.data.dev_prefix
  return c


# ------------------------------------------------------------------------------------------------
# Validation: every rule on a config value, in one place.

DTYPES = ("auto", "float32", "bfloat16")
SOURCES = ("demo", "tfds", "files")
VOCAB_MODEL_TYPES = ("bpe", "unigram", "char", "word")
POSITIONALS = ("sinusoidal", "learned")
DROPOUT_RNGS = ("threefry16", "threefry", "rbg")  # layers.dropout_keep_mask
ATTENTIONS = ("ours", "jax")  # attention_layers.dot_product_attention / jax.nn's
BEAM_STYLES = ("shrinking", "t2t")  # search.py's module docstring
COMPOUND_SPLITS = ("auto", "on", "off")  # evaluate.splits_compounds


def _fail(message: str) -> None:
  raise errors.ConfigError(message)


def _at_least(config: ml_collections.ConfigDict, path: str, low: float) -> None:
  value = _get(config, path)
  if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low:
    _fail(f"config.{path} must be >= {low:g}, got {value!r}.")


def _get(config: ml_collections.ConfigDict, path: str):
  for part in path.split("."):
    config = config[part]
  return config


def _in_unit(config: ml_collections.ConfigDict, path: str) -> None:
  value = _get(config, path)
  if not 0.0 <= value < 1.0:
    _fail(f"config.{path} must be in [0, 1), got {value!r}.")


def _one_of(config: ml_collections.ConfigDict, path: str, choices: tuple[str, ...]) -> None:
  value = _get(config, path)
  if value not in choices:
    _fail(f"config.{path} must be one of {list(choices)}, got {value!r}.")


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises errors.ConfigError, naming the field as `config.x.y`, for any impossible value.

  The one place every config rule lives: main.py calls it before any data is read or program
  compiled, and the rest of the code trusts a validated config.
  """
  for path in ("num_train_steps", "log_every_steps", "eval_every_steps", "keep_checkpoints"):
    _at_least(config, path, 1)
  for path in ("checkpoint_every_steps", "checkpoint_every_secs", "max_train_minutes"):
    _at_least(config, path, 0)  # 0: off
  _in_unit(config, "label_smoothing")

  m = config.model
  for path in ("num_layers", "d_model", "d_ff", "num_heads"):
    _at_least(config, f"model.{path}", 1)
  _at_least(config, "model.max_len", 2)
  if m.d_model % m.num_heads:
    _fail(
      f"config.model.d_model={m.d_model} is not divisible by config.model.num_heads={m.num_heads}."
    )
  for path in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
    _in_unit(config, f"model.{path}")
  _one_of(config, "model.positional", POSITIONALS)
  _one_of(config, "model.dropout_rng", DROPOUT_RNGS)
  _one_of(config, "model.attention", ATTENTIONS)
  if m.attention == "jax" and m.attention_dropout_rate:
    _fail(
      f"config.model.attention='jax' has no attention dropout, but "
      f"config.model.attention_dropout_rate={m.attention_dropout_rate}: set it to 0 or use 'ours'."
    )
  if m.dtype == "float16":
    _fail(
      "config.model.dtype='float16' is not supported: float16 training needs loss scaling, "
      "which this trainer does not do. Use 'bfloat16' (TPU, A100/H100 and newer GPUs) or "
      "'float32' (T4, V100, CPU), or 'auto' to pick between them."
    )
  _one_of(config, "model.dtype", DTYPES)

  _at_least(config, "data.prefetch_batches", 0)
  _at_least(config, "optim.warmup_steps", 1)
  _at_least(config, "optim.accumulate_steps", 1)
  for path in ("beta1", "beta2"):
    _in_unit(config, f"optim.{path}")
  for path in ("eps", "lr_scale"):
    if _get(config, f"optim.{path}") <= 0:
      _fail(f"config.optim.{path} must be > 0, got {_get(config, f'optim.{path}')!r}.")

  d = config.data
  _one_of(config, "data.source", SOURCES)
  _one_of(config, "data.vocab_model_type", VOCAB_MODEL_TYPES)
  _at_least(config, "data.vocab_size", 8)
  _at_least(config, "data.vocab_sample_size", 1)
  _at_least(config, "data.max_len", 2)  # a token and EOS
  if d.tokens_per_batch < d.max_len:
    _fail(
      f"config.data.tokens_per_batch={d.tokens_per_batch} is smaller than "
      f"config.data.max_len={d.max_len}: not even one row fits."
    )
  if d.max_len > m.max_len and m.positional == "learned":
    _fail(
      f"config.data.max_len={d.max_len} exceeds config.model.max_len={m.max_len}, the size "
      "of the learned position table."
    )
  if d.src_lang == d.tgt_lang:
    _fail(f"config.data.src_lang and config.data.tgt_lang are both {d.src_lang!r}.")
  if d.source == "files" and not d.dir:
    _fail(
      "config.data.dir is empty; config.data.source='files' needs the folder of the text files."
    )
  if d.url and d.source != "files":
    _fail(f"config.data.url is set, but config.data.source={d.source!r}; it is for 'files'.")
  if d.source == "demo":
    for split in ("train", "dev", "test"):
      _at_least(config, f"data.demo_{split}_size", 1)

  _at_least(config, "decode.beam_size", 1)
  _one_of(config, "decode.beam_style", BEAM_STYLES)
  _at_least(config, "decode.alpha", 0)
  _at_least(config, "decode.max_len_offset", 1)
  _at_least(config, "decode.batch_size", 1)
  _at_least(config, "eval.dev_bleu_sentences", 0)
  _at_least(config, "eval.dev_bleu_beam_size", 1)
  _one_of(config, "eval.compound_split", COMPOUND_SPLITS)
