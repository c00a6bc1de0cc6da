"""Every rule on a config value, in one place: `validate` (the choices are in choices.py).

Every mode (modes.py) calls `validate` before any data is read or program compiled, and the rest
of the code trusts a validated config. Kept apart from builders.py, which builds configs.
"""

from __future__ import annotations

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions
from flaxformer_nmt.config.choices import (
  ACTIVATIONS,
  ATTENTIONS,
  BEAM_STYLES,
  BEST_METRICS,
  BLEU_PROTOCOLS,
  COMPOUND_SPLITS,
  DECODE_METHODS,
  DECODER_STARTS,
  DROPOUT_RNGS,
  DTYPES,
  LANG_TOKENS,
  LORA_TARGETS,
  POSITIONALS,
  SCHEDULES,
  SEED_LIMIT,
  SOURCES,
  VOCAB_MODEL_TYPES,
)


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


def _seed(config: ml_collections.ConfigDict, path: str) -> None:
  value = _get(config, path)
  if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
    _fail(
      f"config.{path} must be an integer in [0, 2**32), got {value!r}: JAX's random keys hold "
      "32 bits, so other seeds would give the same numbers as one inside that range."
    )


def _in_unit(config: ml_collections.ConfigDict, path: str) -> None:
  value = _get(config, path)
  if not 0.0 <= value < 1.0:
    _fail(f"config.{path} must be in [0, 1), got {value!r}.")


def _one_of(config: ml_collections.ConfigDict, path: str, choices: tuple[str, ...]) -> None:
  value = _get(config, path)
  if value not in choices:
    _fail(f"config.{path} must be one of {list(choices)}, got {value!r}.")


def _multilingual(d: ml_collections.ConfigDict) -> None:
  """data.directions and its companions (config/directions.py parses them, one line each)."""
  trained = directions.parse_directions(str(d.get("directions", "")))
  zero = directions.zero_shot(d)
  _language_tokens(d, bool(trained))
  if not trained:
    for field in ("zero_shot", "corpora"):
      if str(d.get(field, "")).strip():
        _fail(f"config.data.{field} is set, but config.data.directions is empty; it is for them.")
    return
  if d.source not in ("files", "none"):  # "none": an imported multi-target model's
    _fail(
      f"config.data.directions is set, but config.data.source={d.source!r}; many directions "
      "read text files ('files': Multi30k's or a user's own)."
    )
  directions.parse_corpora(str(d.get("corpora", "")), d.train_prefix)
  if not float(d.get("temperature", 5.0)) > 0:
    _fail(f"config.data.temperature must be > 0, got {d.temperature!r}.")
  sources, targets = {t.src for t in trained}, {t.tgt for t in trained}
  for z in zero:
    if z in trained:
      _fail(f"config.data.zero_shot names {z.name}, which config.data.directions trains.")
    if z.src not in sources or z.tgt not in targets:
      _fail(
        f"config.data.zero_shot names {z.name}, but the model trains no direction from "
        f"{z.src!r} or none into {z.tgt!r} (sources trained: {', '.join(sorted(sources))}; "
        f"targets: {', '.join(sorted(targets))})."
      )


def _language_tokens(d: ml_collections.ConfigDict, multilingual: bool) -> None:
  """data.lang_tokens and data.languages: a many-to-many model's (config/directions.py)."""
  style = str(d.get("lang_tokens", ""))
  if style not in LANG_TOKENS:
    _fail(f"config.data.lang_tokens must be one of {list(LANG_TOKENS)}, got {style!r}.")
  langs = directions.many_to_many(d)
  if not style:
    if langs:
      _fail('config.data.languages is set, but config.data.lang_tokens is ""; it is for "m2m100".')
    return
  if multilingual:
    _fail(
      f"config.data.lang_tokens={style!r} names its languages in data.languages, not in "
      "data.directions."
    )
  if not langs:
    _fail(f"config.data.lang_tokens={style!r} needs config.data.languages (comma-separated).")
  for field in ("src_lang", "tgt_lang"):
    if d[field] not in langs:
      _fail(f"config.data.{field}={d[field]!r} is not one of config.data.languages.")


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises errors.ConfigError, naming the field as `config.x.y`, for any impossible value.

  The one place every config rule lives: main.py calls it before any data is read or program
  compiled, and the rest of the code trusts a validated config. The groups are checked in this
  order, so the first impossible field named is always the same.
  """
  for path in ("num_train_steps", "log_every_steps", "eval_every_steps", "keep_checkpoints"):
    _at_least(config, path, 1)
  for path in ("checkpoint_every_steps", "checkpoint_every_secs", "max_train_minutes"):
    _at_least(config, path, 0)  # 0: off
  _in_unit(config, "label_smoothing")
  _seed(config, "seed")
  _check_model(config)
  _check_optim(config)
  _check_data(config)
  _check_decode(config)
  _in_unit(config, "optim.ema_decay")
  _one_of(config, "best_metric", BEST_METRICS)
  _at_least(config, "early_stopping_patience", 0)
  if config.early_stopping_patience and not config.best_metric:
    _fail(
      f"config.early_stopping_patience={config.early_stopping_patience} needs config.best_metric "
      "('dev_bleu' or 'dev_loss'): the figure that must improve."
    )
  if config.best_metric == "dev_bleu" and not config.eval.dev_bleu_sentences:
    _fail(
      "config.best_metric='dev_bleu' needs config.eval.dev_bleu_sentences > 0 (dev BLEU is "
      "computed on that many sentences); it is 0."
    )
  _at_least(config, "eval.dev_bleu_sentences", 0)
  _at_least(config, "eval.max_test_sentences", 0)
  _at_least(config, "eval.dev_bleu_beam_size", 1)
  _one_of(config, "eval.compound_split", COMPOUND_SPLITS)
  _one_of(config, "eval.bleu_protocol", BLEU_PROTOCOLS)


def _check_model(config: ml_collections.ConfigDict) -> None:
  """config.model's fields: sizes, activation, norms, dropout, attention kind, dtype."""
  m = config.model
  for path in ("num_layers", "d_model", "d_ff", "num_heads"):
    _at_least(config, f"model.{path}", 1)
  _at_least(config, "model.max_len", 2)
  if m.d_model % m.num_heads:
    _fail(
      f"config.model.d_model={m.d_model} is not divisible by config.model.num_heads={m.num_heads}."
    )
  _at_least(config, "model.d_k", 0)  # 0: d_model / num_heads
  _at_least(config, "model.num_decoder_layers", 0)  # 0: num_layers
  _one_of(config, "model.activation", ACTIVATIONS)
  if not 0 < m.layer_norm_epsilon < 1:
    _fail(f"config.model.layer_norm_epsilon={m.layer_norm_epsilon} is not in (0, 1).")
  for path in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
    _in_unit(config, f"model.{path}")
  _one_of(config, "model.positional", POSITIONALS)
  _one_of(config, "model.decoder_start", DECODER_STARTS)
  _one_of(config, "model.dropout_rng", DROPOUT_RNGS)
  _one_of(config, "model.attention", ATTENTIONS)
  # "auto" keeps ours wherever cuDNN's would compute something else (model/attention_choice.py).
  if m.attention in ("jax", "cudnn") and m.attention_dropout_rate:
    _fail(
      f"config.model.attention='{m.attention}' has no attention dropout, but "
      f"config.model.attention_dropout_rate={m.attention_dropout_rate}: set it to 0 or use 'ours'."
    )
  if m.attention in ("jax", "cudnn") and m.d_k and m.d_k != m.d_model // m.num_heads:
    _fail(
      f"config.model.attention='{m.attention}' needs keys as wide as values, but "
      f"config.model.d_k={m.d_k} where d_model / num_heads = {m.d_model // m.num_heads}: "
      "use 'ours'."
    )
  _one_of(config, "model.dtype", DTYPES)
  if "loss_block_tokens" in m:  # absent from configs saved before it existed
    _at_least(config, "model.loss_block_tokens", 0)
    if m.loss_block_tokens and not m.share_embeddings:
      _fail(
        f"config.model.loss_block_tokens={m.loss_block_tokens} computes the tied output layer in "
        "blocks, but config.model.share_embeddings=False: set it to 0."
      )
  if m.attention == "cudnn" and m.dtype == "float32":
    _fail(
      "config.model.attention='cudnn' computes in bfloat16 or float16 only, but "
      "config.model.dtype='float32': set it to 'bfloat16' (or 'auto') or use 'ours'."
    )


def _check_optim(config: ml_collections.ConfigDict) -> None:
  """config.optim's fields (and data.prefetch_batches): schedule, Adam, the loss scale."""
  _at_least(config, "data.prefetch_batches", 0)
  _at_least(config, "optim.warmup_steps", 1)
  _one_of(config, "optim.schedule", SCHEDULES)
  _at_least(config, "optim.accumulate_steps", 1)
  if "loss_scale_period" in config.optim:  # absent from configs saved before float16 existed
    _at_least(config, "optim.loss_scale_period", 1)
  if "loss_scale_init" in config.optim:
    _at_least(config, "optim.loss_scale_init", 1)
    if config.optim.loss_scale_init > 2.0**24:
      _fail(
        f"config.optim.loss_scale_init must be <= 2^24 = 16777216 (float16's whole range), got "
        f"{config.optim.loss_scale_init!r}."
      )
  for path in ("beta1", "beta2"):
    _in_unit(config, f"optim.{path}")
  for path in ("eps", "lr_scale"):
    if _get(config, f"optim.{path}") <= 0:
      _fail(f"config.optim.{path} must be > 0, got {_get(config, f'optim.{path}')!r}.")
  if "lora_rank" in config.optim:  # absent from configs saved before LoRA existed
    _check_lora(config)


def _check_lora(config: ml_collections.ConfigDict) -> None:
  """config.optim.lora_*: a rank, a positive alpha, known targets, a dropout rate only with
  adapters, no EMA. (That a new LoRA run
  names a model to adapt is training/loop.py's check: a resumed one needs none.)"""
  o = config.optim
  _at_least(config, "optim.lora_rank", 0)
  lora_dropout = o.get("lora_dropout", 0.0)  # absent from configs saved before it existed
  if "lora_dropout" in o:
    _in_unit(config, "optim.lora_dropout")
  if not o.lora_rank:
    if lora_dropout:
      _fail(
        f"config.optim.lora_dropout={lora_dropout:g} drops out the adapters' inputs, but "
        "config.optim.lora_rank=0 trains none: set lora_rank > 0 (with init_from), or leave it 0."
      )
    return
  if _get(config, "optim.lora_alpha") <= 0:
    _fail(f"config.optim.lora_alpha must be > 0, got {o.lora_alpha!r}.")
  targets = [t.strip() for t in str(o.lora_targets).split(",") if t.strip()]
  unknown = [t for t in targets if t not in LORA_TARGETS] or ([] if targets else [""])
  if unknown:
    _fail(
      f"config.optim.lora_targets={o.lora_targets!r}: {unknown[0]!r} is not a LoRA target; "
      f"choose among {', '.join(LORA_TARGETS)} (comma-separated)."
    )
  if o.ema_decay:
    _fail(
      f"config.optim.lora_rank={o.lora_rank} and config.optim.ema_decay={o.ema_decay:g}: a "
      "parameter average of the adapters is not the average of the merged models; use one."
    )


def _check_data(config: ml_collections.ConfigDict) -> None:
  """config.data's fields against each other and the model: source, vocabulary, lengths,
  languages and directions."""
  m = config.model
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
  _multilingual(d)


def _check_decode(config: ml_collections.ConfigDict) -> None:
  """config.decode's fields: the search, sampling, and the alignment layer the model has."""
  m = config.model
  _at_least(config, "decode.beam_size", 1)
  _one_of(config, "decode.beam_style", BEAM_STYLES)
  _at_least(config, "decode.alpha", 0)
  _at_least(config, "decode.max_len_offset", 1)
  _at_least(config, "decode.batch_size", 1)
  _one_of(config, "decode.method", DECODE_METHODS)
  dc = config.decode
  if not dc.temperature > 0:
    _fail(f"config.decode.temperature must be > 0, got {dc.temperature!r}.")
  _at_least(config, "decode.top_k", 0)
  _seed(config, "decode.seed")
  if not 0 < dc.top_p <= 1:
    _fail(f"config.decode.top_p must be in (0, 1], got {dc.top_p!r}.")
  depth = m.get("num_decoder_layers", 0) or m.num_layers
  if dc.alignment_layer >= depth:
    _fail(
      f"config.decode.alignment_layer={dc.alignment_layer} names no decoder layer of "
      f"the model's {depth} (0 .. {depth - 1}, or -1 for the last)."
    )
