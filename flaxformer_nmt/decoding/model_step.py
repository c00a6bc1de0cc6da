"""The Transformer as a step function: what every search runs on.

`model_step_fn` wraps the cached decoder over a batch's encoder output: the cross-attention keys
and values are projected once, each call runs one decoder step on every row (K rows per sentence
in beam search). `ensemble_step_fn` runs several models as one (fairseq's rule: the log of their
mean next-token probability). `source_positions` aligns each output token to a source position
with one decoder layer's cross-attention, for word alignments.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from flaxformer_nmt.decoding import search as search_lib
from flaxformer_nmt.model.ensemble import Ensemble  # noqa: F401  (model_step.Ensemble)
from flaxformer_nmt.model.shapes import init_decode_cache
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.model.transformer import Transformer

Array = jax.Array


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


def ensemble_step_fn(step_fns: list[search_lib.StepFn]) -> search_lib.StepFn:
  """Several models' step functions as one: the cache is the tuple of theirs, and the "logits"
  are the log of the mean of their next-token probabilities (fairseq's ensemble rule), which every
  search then treats as one model's log-probabilities."""

  def step(caches: tuple, ids: Array) -> tuple[Array, tuple]:
    outs = [fn(cache, ids) for fn, cache in zip(step_fns, caches, strict=True)]
    log_probs = jnp.stack(
      [search_lib.log_softmax(logits.astype(jnp.float32)) for logits, _ in outs]
    )
    mean = jax.nn.logsumexp(log_probs, axis=0) - jnp.log(jnp.float32(len(outs)))  # [rows, vocab]
    return mean, tuple(cache for _, cache in outs)

  return step


def source_positions(
  model: Transformer, params: Any, inputs: Array, tokens: Array, layer: int
) -> Array:
  """Hard alignments from one decoder layer's cross-attention, averaged over heads.

  inputs: [batch, S] sources; tokens: [batch, (n,) T] their outputs (EOS, then PAD). The outputs
  are run through the model teacher-forced, which reproduces the attention the search saw when
  it chose each token; output position t is aligned to the source position it attends to most,
  EOS and padding excluded on both sides (as fairseq's --print-alignment). Returns tokens' shape,
  int32 source positions, -1 where there is no alignment.
  """
  rows = tokens.reshape(-1, tokens.shape[-1])  # [batch * n, T]
  sources = jnp.repeat(inputs, rows.shape[0] // inputs.shape[0], axis=0)  # [batch * n, S]
  _, state = model.apply({"params": params}, sources, rows, mutable=["intermediates"])
  (weights,) = state["intermediates"][f"decoder_{layer}"]["cross_attention"]["attention_weights"]
  mean = jnp.mean(weights, axis=1)  # [rows, T, S]
  real_source = (sources != PAD_ID) & (sources != EOS_ID)  # [rows, S]
  mean = jnp.where(real_source[:, None, :], mean, -1.0)
  best = jnp.argmax(mean, axis=-1).astype(jnp.int32)  # [rows, T]
  real_target = (rows != PAD_ID) & (rows != EOS_ID) & jnp.any(real_source, axis=1)[:, None]
  return jnp.where(real_target, best, -1).reshape(tokens.shape)
