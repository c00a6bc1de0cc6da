"""Translating a batch with the Transformer: its cached decoder as a step function, the length
rule, and the jitted entry point `decode_batch` (encoder once, then the search, in one program).

The search itself (greedy and beam search, search.py) sees only a step function, so the model side
lives here: projecting the cross-attention keys and values once, sizing the decode caches, and
each sentence's maximum output length, input length + 50 as in the paper (Sec. 6.1).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from flaxformer_nmt import search as search_lib
from flaxformer_nmt.config_lib import BEAM_STYLES
from flaxformer_nmt.model import Transformer, init_decode_cache
from flaxformer_nmt.tokenizer import PAD_ID

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """Static settings of one search (hashable: jit compiles one program per distinct value).

  Attributes:
    beam_size: hypotheses per sentence; 1 = greedy.
    alpha: length-penalty exponent; 0 ranks by plain log-probability.
    max_len_offset: a sentence's output has at most (its source length + this) tokens, EOS
      included, and never more than the model's `max_len`.
    style: "shrinking" or "t2t" (search.py's module docstring).
  """

  beam_size: int = 4
  alpha: float = 0.6
  max_len_offset: int = 50
  style: str = "shrinking"

  def __post_init__(self) -> None:
    if self.style not in BEAM_STYLES:
      raise ValueError(f"Unknown beam style {self.style!r}; choose one of {list(BEAM_STYLES)}.")

  @classmethod
  def from_config(
    cls, decode: ml_collections.ConfigDict, beam_size: int | None = None
  ) -> SearchConfig:
    """From `config.decode`; `beam_size` overrides it (e.g. greedy dev BLEU during training)."""
    return cls(
      beam_size=int(decode.beam_size if beam_size is None else beam_size),
      alpha=float(decode.alpha),
      max_len_offset=int(decode.max_len_offset),
      style=str(decode.get("beam_style", "shrinking")),
    )


# ------------------------------------------------------------------------------------------------
# The length rule.


def source_lengths(inputs: Array) -> Array:
  """Non-padding tokens per row (EOS included). inputs: [batch, src_len] -> [batch]."""
  return jnp.sum(inputs != PAD_ID, axis=-1).astype(jnp.int32)


def max_output_lengths(inputs: Array, max_len_offset: int, max_decode_len: int) -> Array:
  """Each sentence's own cap: its source length + offset, at most `max_decode_len`.

  A row that is all padding (a filler row completing a batch) gets 0: it is finished before the
  first step, so it never keeps the loop running.
  """
  src_len = source_lengths(inputs)  # [batch]
  return jnp.where(src_len > 0, jnp.minimum(src_len + max_len_offset, max_decode_len), 0)


def decode_length_bound(src_len: int, max_len_offset: int, model_max_len: int | None) -> int:
  """Static length of output buffers and caches for a batch padded to `src_len`."""
  bound = src_len + max_len_offset
  return bound if model_max_len is None else min(bound, model_max_len)


# ------------------------------------------------------------------------------------------------
# The Transformer as a step function, and the jitted entry point.


def model_step_fn(
  model: Transformer, params: Any, encoded: Array, inputs: Array
) -> search_lib.StepFn:
  """The cached decoder as a step function over rows of (`encoded`, `inputs`).

  encoded: [batch, src_len, d_model]; inputs: [batch, src_len] (for the cross-attention mask).
  The step may run on K rows per sentence (beam search: row b * K + j is beam j of sentence b);
  the cross-attention then keeps one copy of each sentence's keys and values for its K rows.

  The cross-attention keys and values of every decoder layer are projected here, once, by one
  decoder step on a throwaway one-position cache with `cross_cache` mutable; each step then reads
  them as constants.
  """
  batch, src_len = inputs.shape
  _, projected = model.apply(
    {"params": params, "cache": init_decode_cache(model, batch, 1, src_len)},
    encoded,
    inputs,
    jnp.zeros((batch, 1), jnp.int32),
    decode=True,
    method=Transformer.decode,
    mutable=["cache", "cross_cache"],
  )
  cross_cache = projected["cross_cache"]  # leaves [batch, src_len, heads, head_dim]

  def step(cache: search_lib.Cache, ids: Array) -> tuple[Array, search_lib.Cache]:
    logits, mutated = model.apply(
      {"params": params, "cache": cache, "cross_cache": cross_cache},
      encoded,
      inputs,
      ids,
      decode=True,
      method=Transformer.decode,
      mutable=["cache"],
    )  # logits: [rows, 1, vocab]
    return logits[:, 0, :], mutated["cache"]

  return step


def decode_batch(
  model: Transformer,
  params: Any,
  inputs: Array,
  search: SearchConfig,
  greedy: bool = False,
) -> search_lib.SearchResult:
  """Translates a batch: encoder once, then the cached search, all in one compiled program.

  Args:
    model: the Transformer (hashable; one compilation per model config, settings and input shape).
    params: its parameters.
    inputs: [batch, src_len] source ids ending in EOS, 0-padded; all-padding rows are skipped.
    search: beam size, style, alpha, length rule. Beam size 1 runs the shrinking beam search with
      one slot, which is greedy search (tests check it token for token), or, for style "t2t",
      greedy search itself.
    greedy: run greedy search (search.py) instead (the reference beam 1 is checked against).

  Returns:
    The best hypothesis per sentence; tokens are [batch, min(src_len + offset, model max_len)].
  """
  if search.beam_size == 1 and search.style == "t2t":
    greedy = True  # t2t's beam 1 searches past greedy's EOS; beam size 1 means greedy here
  if greedy:
    # Greedy ignores the beam size and style: one compiled program serves every beam setting.
    search = dataclasses.replace(search, beam_size=1, style="shrinking")
  return _decode_batch(model, params, inputs, search, greedy)


@functools.partial(jax.jit, static_argnames=("model", "search", "greedy"))
def _decode_batch(
  model: Transformer, params: Any, inputs: Array, search: SearchConfig, greedy: bool
) -> search_lib.SearchResult:
  step_fn, max_lengths, max_decode_len = prepare_search(model, params, inputs, search)
  return run_search(model, step_fn, max_lengths, inputs.shape, max_decode_len, search, greedy)


def prepare_search(
  model: Transformer, params: Any, inputs: Array, search: SearchConfig
) -> tuple[search_lib.StepFn, Array, int]:
  """(the model's step function over the encoded `inputs`, each sentence's output length limit
  [batch], the decode buffer length): what a search needs. Traceable (inside `jax.jit`)."""
  _, src_len = inputs.shape
  max_decode_len = decode_length_bound(src_len, search.max_len_offset, model.cfg.max_len)
  max_lengths = max_output_lengths(inputs, search.max_len_offset, max_decode_len)  # [batch]
  encoded = model.apply({"params": params}, inputs, method=Transformer.encode)  # [B, S, D]
  return model_step_fn(model, params, encoded, inputs), max_lengths, max_decode_len


def run_search(
  model: Transformer,
  step_fn: search_lib.StepFn,
  max_lengths: Array,
  input_shape: tuple[int, int],
  max_decode_len: int,
  search: SearchConfig,
  greedy: bool,
) -> search_lib.SearchResult:
  """Greedy or beam search over `step_fn` (the model's, or one built on it) with a fresh cache."""
  batch, src_len = input_shape
  if greedy:
    cache = init_decode_cache(model, batch, max_decode_len, src_len)
    return search_lib.greedy_search(
      step_fn, cache, max_lengths, max_decode_len=max_decode_len, alpha=search.alpha
    )
  k = search.beam_size
  # Decoder rows are sentence-major, row b * K + j is beam j of sentence b; the encoder output
  # stays one row per sentence (MultiHeadAttention's cross-attention maps beams onto it).
  cache = init_decode_cache(model, batch * k, max_decode_len, src_len, num_sentences=batch)
  return search_lib.beam_search(
    step_fn,
    cache,
    max_lengths,
    beam_size=k,
    alpha=search.alpha,
    max_decode_len=max_decode_len,
    style=search.style,
  )
