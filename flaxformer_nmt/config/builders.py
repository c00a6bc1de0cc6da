"""One table of model sizes and one builder for every experiment config.

Experiment files in `configs/` are two lines: pick a size, pick the data. Keeping the sizes as data
(not as copied config files) means Table 3 of the paper is readable in one place and a fix to the
shared defaults reaches every experiment.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config.checks import validate
from flaxformer_nmt.config.groups import data_config, decode_config, eval_config, optim_config

# Experiment files and older code call these through config_lib; `validate` stays reachable here.
__all__ = [
  "SIZES",
  "TABLE3",
  "WMT14_PAIRS",
  "Size",
  "base_config",
  "model_config",
  "set_field",
  "validate",
  "wmt14_config",
  "wmt14_table3_config",
]


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
  # fairseq's transformer_tiny, the Multi30k baseline of Wu et al. (2021): configs/multi30k_tiny.py.
  "tiny4": Size(num_layers=4, d_model=128, d_ff=256, num_heads=4, dropout_rate=0.3),
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
      # One head's query and key width d_k; 0 = d_model / num_heads, the paper's choice (as d_v
      # always is). Table 3 row B shrinks it: `--config=wmt14_table3:B1`.
      d_k=0,
      dropout_rate=s.dropout_rate,
      # The paper applies dropout to sub-layer outputs and embedding sums only.
      attention_dropout_rate=0.0,
      relu_dropout_rate=0.0,
      pre_ln=False,  # The paper is post-LN: LayerNorm(x + Dropout(Sublayer(x))).
      positional="sinusoidal",  # or "learned" (Table 3 row E), "m2m100" (M2M100's table)
      share_embeddings=True,  # source, target and pre-softmax share one matrix
      max_len=256,  # longest sequence a learned positional table (or decode) supports
      # Matrix products in "bfloat16", "float16" (with a dynamic loss scale: optim.loss_scale_*)
      # or "float32"; "auto": bfloat16 on TPUs and on GPUs from Ampere (A100, H100) on, float16
      # on older GPUs (T4, V100), float32 on CPUs. Parameters, Adam moments, layer norms,
      # softmaxes, logits and the loss are float32 in every case.
      dtype="auto",
      remat=False,  # recompute each layer's activations in the backward pass (saves memory)
      # How dropout masks are drawn: "threefry16" (two 16-bit masks per 32-bit draw: half the
      # random-number work; the rate is rounded to 1/65536), "threefry" (jax.random.bernoulli),
      # "rbg" (XLA's RngBitGenerator: fastest on TPUs, slowest on CPUs). See model/layers.py.
      dropout_rng="threefry16",
      # Which softmax attention trains and scores (model/attention_choice.py): "auto" (cuDNN's
      # fused kernel on NVIDIA GPUs from Ampere on in bfloat16/float16 without attention
      # dropout, 1.21x the base step on an H200; ours everywhere else), "ours" (model/attention.py:
      # float32 scores and a hand-written backward), "jax" (jax.nn.dot_product_attention, XLA's)
      # or "cudnn" (cuDNN's, refused elsewhere). Only ours has attention dropout. Incremental
      # decoding's cached self-attention always runs ours.
      attention="auto",
      # Pretrained models' options (docs/pretrained.md); the defaults are the paper's. The FFN's
      # activation: relu, swish/silu, gelu, gelu_new (transformers' names; OPUS-MT: swish).
      activation="relu",
      attention_bias=False,  # biases on the Q, K, V and output projections (Marian has them)
      layer_norm_epsilon=1e-6,  # transformers' Marian: 1e-5
      num_decoder_layers=0,  # the decoder's depth; 0 = num_layers
      logits_bias=False,  # a learned bias on the logits (Marian's final_logits_bias)
      decoder_start="pad",  # the decoder's first input: "pad" (ours), "eos" (M2M100's </s>)
      # Training's output layer and loss in blocks of this many target positions, each block's
      # float32 logits recomputed in the backward, so the [tokens, vocabulary] logits are never
      # held whole (3.7 GB at the paper's batch): less memory for one more product. 0 = whole.
      # Tied embeddings only (share_embeddings).
      loss_block_tokens=0,
    )
  )


def base_config(size: str) -> ml_collections.ConfigDict:
  """Every field with the paper's default; experiment configs override data and schedule."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_train_steps = 100_000  # the paper's base model: 100k steps; big: 300k
  # Also stop (with a checkpoint) after this many minutes of training, counted over the whole run
  # (a resumed run continues the count saved in the checkpoint); 0 = no limit. Evaluation time does
  # not count. For fixed-budget runs such as benchmarks/experiments.py --experiment=multi30k.
  c.max_train_minutes = 0.0
  c.log_every_steps = 100
  c.eval_every_steps = 1_000
  c.checkpoint_every_steps = 1_000
  c.checkpoint_every_secs = 0  # >0 also saves every this many seconds (the paper: 600)
  c.keep_checkpoints = 20  # enough to average the last 20, as the paper's big model
  c.skip_nonfinite = False  # True: skip a step whose loss or gradients are not finite
  c.label_smoothing = 0.1  # eps_ls
  # Fine-tuning: start from the parameters of this trained workdir (or its checkpoints/, averaged/
  # or best/ folder) and reuse its vocabulary; step, Adam moments and data start fresh. "" = no.
  c.init_from = ""
  # After each dev evaluation that improves this figure ("dev_bleu": higher is better, "dev_loss":
  # lower), its parameters go to <workdir>/best/ (--checkpoint=best). "" = off.
  c.best_metric = ""
  # Stop after this many dev evaluations in a row without improving best_metric (0 = never).
  c.early_stopping_patience = 0
  # JAX's persistent compilation cache, so a second command on the same model starts warm:
  # "auto" (a private folder under ~/.cache/flaxformer_nmt), "off", or a folder
  # (runtime/compile_cache.py; clearing it is deleting the folder).
  c.compile_cache = "auto"

  c.model = model_config(size)
  c.optim = optim_config()
  c.data = data_config()
  c.decode = decode_config()
  c.eval = eval_config()
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
# parameter count the paper gives (millions; rows (A) and (D) leave the base's 65M). Row (B)
# narrows queries and keys only: d_v stays d_model / h = 64.
TABLE3: dict[str, tuple[dict[str, object], int]] = {
  "A1": ({"model.num_heads": 1}, 65),  # d_k = d_v = 512
  "A2": ({"model.num_heads": 4}, 65),  # 128
  "A3": ({"model.num_heads": 16}, 65),  # 32
  "A4": ({"model.num_heads": 32}, 65),  # 16
  "B1": ({"model.d_k": 16}, 58),  # d_v = 64
  "B2": ({"model.d_k": 32}, 60),
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


def missing_field(config: ml_collections.ConfigDict, path: str) -> tuple[str, str | None] | None:
  """None if `config` has the dotted `path`; else (what is missing, in words; the closest
  existing path, or None): the one "did you mean" of flags (cli.py) and of overrides given in
  Python (set_field: api.load_config, api.load)."""
  parts = path.split(".")
  node: Any = config
  for depth, key in enumerate(parts):
    if isinstance(node, ml_collections.ConfigDict) and key in node:
      node = node[key]
      continue
    where = ".".join(["config", *parts[:depth]])
    if not isinstance(node, ml_collections.ConfigDict):
      return f"{where} is a value, not a group of fields", None
    close = difflib.get_close_matches(key, list(node.keys()), n=1, cutoff=0.5)
    if close:
      return f"{where} has no field {key!r}", ".".join(
        [*parts[:depth], close[0], *parts[depth + 1 :]]
      )
    return f"{where} has no field {key!r}; its fields: {', '.join(sorted(node))}", None
  return None


def set_field(config: ml_collections.ConfigDict, path: str, value: object) -> None:
  """config.<path> = value for a dotted path ("model.d_ff"); a ConfigError names a missing field
  and the closest one ("did you mean 'decode.beam_size'?")."""
  missing = missing_field(config, path)
  if missing is not None:
    what, close = missing
    _fail(f"{path!r}: {what}" + (f"; did you mean {close!r}?" if close else "."))
  *groups, field = path.split(".")
  node = config
  for group in groups:
    node = node[group]
  node[field] = value


def wmt14_table3_config(row: str, data: str = "tfds") -> ml_collections.ConfigDict:
  """One row of Table 3: the base EN-DE recipe with that row's change, evaluated on newstest2013
  (`--mode=eval` scores the dev split) from the last checkpoint, as the paper's table."""
  if row not in TABLE3:
    _fail(f"Unknown Table 3 row {row!r}; choose one of {sorted(TABLE3)}.")
  c = wmt14_config("base", "en-de", data)
  for path, value in TABLE3[row][0].items():
    set_field(c, path, value)
  if data == "tfds":
    c.data.test_split = c.data.dev_split  # newstest2013
  else:
    c.data.test_prefix = c.data.dev_prefix
  return c


def _fail(message: str) -> None:
  raise errors.ConfigError(message)
