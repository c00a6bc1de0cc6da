"""One table of model sizes and one builder for every experiment config.

Experiment files in `configs/` are two lines: pick a size, pick the data. Keeping the sizes as data
(not as copied config files) means Table 3 of the paper is readable in one place and a fix to the
shared defaults reaches every experiment.
"""

from __future__ import annotations

import dataclasses

import ml_collections


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
    raise ValueError(f"Unknown model size {size!r}; choose one of {sorted(SIZES)}.")
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
  c.debug_inject_nan_at_step = -1  # tests: make step N's loss NaN to exercise the guard
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
          max_len_offset=50,  # maximum output length = input length + this
          batch_size=64,  # sentences per device in a decoding batch (all devices decode)
      )
  )

  c.eval = ml_collections.ConfigDict(
      dict(
          dev_bleu_sentences=256,  # dev sentences decoded at each eval during training
          dev_bleu_beam_size=1,  # greedy during training to keep evals cheap
      )
  )
  return c


# WMT14 pairs as the paper ran them: TFDS builder, direction, shared word-piece vocabulary size.
WMT14_PAIRS: dict[str, tuple[str, str, str, int]] = {
    "en-de": ("wmt14_translate/de-en", "en", "de", 37_000),
    "en-fr": ("wmt14_translate/fr-en", "en", "fr", 32_000),
}


def wmt14_config(size: str, pair: str) -> ml_collections.ConfigDict:
  """The paper's WMT14 set-up (Sec. 5): TFDS data, the pair's vocabulary, 100k (base) or 300k
  (big) steps, and checkpoints every 10 minutes so the last 5 (base) or 20 (big) can be averaged.
  """
  if pair not in WMT14_PAIRS:
    raise ValueError(f"Unknown WMT14 pair {pair!r}; choose one of {sorted(WMT14_PAIRS)}.")
  tfds_name, src, tgt, vocab = WMT14_PAIRS[pair]
  c = base_config(size)
  c.data.source = "tfds"
  c.data.tfds_name = tfds_name
  c.data.src_lang, c.data.tgt_lang = src, tgt
  c.data.vocab_size = vocab
  c.num_train_steps = 100_000 if size == "base" else 300_000
  c.checkpoint_every_secs = 600
  c.checkpoint_every_steps = 5_000
  return c
