"""Shapes traced from the Transformer, once per model: its parameters' abstract tree (the
template every restore reads into) and the decode cache's layout (rescaled per batch shape).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from flaxformer_nmt.model.transformer import Transformer, TransformerConfig, init_params
from flaxformer_nmt.runtime import executables


@functools.lru_cache(maxsize=16)
def abstract_params(cfg: TransformerConfig) -> Any:
  """The parameters' tree of jax.ShapeDtypeStruct (`init_params` traced, never run), once per
  config in a process and kept with the compiled programs (`executables.traced`): the template
  restores read into, and the decode cache's layout uses it."""
  return executables.traced(
    f"abstract params {cfg!r}",
    lambda: jax.eval_shape(lambda rng: init_params(cfg, rng), jax.random.PRNGKey(0)),
  )


def init_decode_cache(
  model: Transformer,
  batch_size: int,
  max_decode_len: int,
  src_len: int,
  num_sentences: int | None = None,
) -> Any:
  """An all-zero decode cache for `batch_size` rows and up to `max_decode_len` steps.

  Leaves have the rows as their leading axis, except the scalar step counters (`cache_index`,
  `position`), which are shared by all rows. `num_sentences` (default `batch_size`) is the number
  of source sentences (beam search decodes `batch_size = num_sentences * beam` rows); the
  cross-attention keys and values are not part of this cache but of the `cross_cache`
  collection (`decoding/model_step.model_step_fn`).
  """
  num_sentences = batch_size if num_sentences is None else num_sentences
  sizes = {
    _REF_ROWS: batch_size,
    _REF_SENTENCES: num_sentences,
    _REF_LEN: max_decode_len,
    _REF_SRC: src_len,
  }
  layout = _cache_layout(model) if not set(sizes) & _model_dims(model.cfg) else None
  if layout is None:  # a model dimension equals a reference size: trace this shape itself
    shapes = _traced_cache_shapes(model, batch_size, max_decode_len, src_len, num_sentences)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  return jax.tree.map(lambda s: jnp.zeros(tuple(sizes.get(d, d) for d in s.shape), s.dtype), layout)


# Reference sizes the cache's layout is traced at, once per model (`_cache_layout`): distinct
# sizes no model dimension has (rows a multiple of sentences, as a beam's are), so each leaf's
# axes of rows, sentences, decode length and source length are found by their size and replaced
# by a request's. Tracing `model.init` for the
# layout costs ~0.4 s on a CPU, and every decoding batch shape needed it (a server compiles 56).
_REF_SENTENCES, _REF_LEN, _REF_SRC = 1031, 1039, 1049
_REF_ROWS = 2 * _REF_SENTENCES


def _model_dims(cfg: TransformerConfig) -> set[int]:
  return {v for v in dataclasses.asdict(cfg).values() if isinstance(v, int)}


@functools.lru_cache(maxsize=16)
def _cache_layout(model: Transformer) -> Any:
  return _traced_cache_shapes(model, _REF_ROWS, _REF_LEN, _REF_SRC, _REF_SENTENCES)


def _traced_cache_shapes(
  model: Transformer, batch_size: int, max_decode_len: int, src_len: int, num_sentences: int
) -> Any:
  """The decode cache's tree of jax.ShapeDtypeStruct, from tracing one decoder call that creates
  it (an `apply` on the abstract parameters: no initializer is traced)."""
  dummy_src = jax.ShapeDtypeStruct((num_sentences, src_len), jnp.int32)
  dummy_tgt = jax.ShapeDtypeStruct((batch_size, max_decode_len), jnp.int32)

  def make(params, src, tgt):
    encoded = jnp.zeros((num_sentences, src_len, model.cfg.d_model), jnp.float32)  # as encode()
    _, variables = model.apply(
      {"params": params},
      encoded,
      src,
      tgt,
      decode=True,
      method=Transformer.decode,
      mutable=["cache", "cross_cache"],
    )
    return variables["cache"]

  return jax.eval_shape(make, abstract_params(model.cfg), dummy_src, dummy_tgt)
