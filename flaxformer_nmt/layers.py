"""Building blocks of the Transformer: positional encodings, masks, attention, feed-forward.

Everything here is pure Flax linen: parameters in, activations out. Attention keeps its decode cache
in the `cache` collection (self-attention keys/values grow one step at a time; cross-attention
keys/values are projected from the encoder output once, at the first step, and reused).

Einsum letters and shape comments mean the same in this file and model.py (gemma's style):

  B  batch (rows)                      D  d_model
  T  query positions (the target, or   N  heads (h)
     the source in the encoder)        H  one head's width (d_k = d_v = D / N)
  S  key/value positions               F  d_ff
  L  a decode cache's length           V  vocabulary
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Dtype = Any


def _upcast_on_cpu(*xs: Array) -> tuple[Array, ...]:
  # XLA:CPU of JAX < 0.8 has no bfloat16 x bfloat16 -> float32 product (UNIMPLEMENTED at run time);
  # there the inputs are widened first, which gives the same float32 result.
  if jax.default_backend() == "cpu":
    return tuple(x.astype(jnp.float32) for x in xs)
  return xs


def einsum_f32(subscripts: str, a: Array, b: Array) -> Array:
  """A product of `a` and `b` in their dtype (e.g. bfloat16), accumulated and returned in float32.

  For attention scores and logits: rounding those to bfloat16 would coarsen the softmax and loss.
  """
  a, b = _upcast_on_cpu(a, b)
  return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)


def dot_general_f32(
  lhs: Array,
  rhs: Array,
  dimension_numbers: Any,
  precision: Any = None,
  preferred_element_type: Any = None,
) -> Array:
  """`lax.dot_general` returning float32, as `einsum_f32` (for nn.Dense's `dot_general`)."""
  del preferred_element_type  # always float32
  lhs, rhs = _upcast_on_cpu(lhs, rhs)
  return jax.lax.dot_general(
    lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=jnp.float32
  )


def mask_value(dtype: Dtype) -> Array:
  """The most negative finite value of `dtype`: a "minus infinity" that stays finite.

  A fully masked row (a padding query) then gets a uniform softmax instead of NaNs, and its output
  is ignored downstream by the loss mask. A fixed constant would not do: -1e9 is -inf in float16.
  """
  return jnp.asarray(jnp.finfo(dtype).min, dtype)


# ----------------------------------------------------------------------------------------------
# Positional encodings.


def sinusoidal_encoding(positions: Array, d_model: int) -> Array:
  """The paper's fixed encoding (Sec. 3.5), evaluated at integer `positions`.

  PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
  Sines and cosines interleave over the feature axis exactly as the formula indexes them.

  Args:
    positions: [..., length] integer positions (per segment when sequences are packed).
    d_model: feature size (even).

  Returns:
    [..., length, d_model] float32.
  """
  i = np.arange(d_model // 2, dtype=np.float32)  # [d_model / 2]
  inv_freq = jnp.asarray(1.0 / (10000.0 ** (2.0 * i / d_model)))  # [d_model / 2]
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., length, d_model / 2]
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., length, d_model / 2, 2]
  return pe.reshape(*positions.shape, d_model)


class PositionalEncoding(nn.Module):
  """Adds sinusoidal (the paper) or learned (Table 3, row E) position encodings.

  In decode mode the position is the number of tokens fed so far, kept in the cache, so the
  incremental decoder sees the same encodings as the full forward pass.
  """

  d_model: int
  max_len: int
  kind: str = "sinusoidal"  # "sinusoidal" | "learned"

  @nn.compact
  def __call__(self, x: Array, positions: Array | None = None, decode: bool = False) -> Array:
    # x: [B, T, D]
    length = x.shape[1]
    if decode:
      index = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
      positions = jnp.broadcast_to(index.value, x.shape[:2])  # [B, 1]
      if not self.is_initializing():
        index.value = index.value + length
    elif positions is None:
      positions = jnp.broadcast_to(jnp.arange(length), x.shape[:2])  # [B, T]
    if self.kind == "sinusoidal":
      pe = sinusoidal_encoding(positions, self.d_model)
    else:  # "learned" (config_lib.validate allows no other)
      table = self.param(
        "pos_embedding", nn.initializers.normal(stddev=0.02), (self.max_len, self.d_model)
      )
      pe = jnp.take(table, positions, axis=0)
    return x + pe.astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Masks. Shapes are [B, 1, T, S] (broadcast over heads); True = may attend.


def padding_mask(query_tokens: Array, key_tokens: Array) -> Array:
  """Attention allowed only between non-padding (id != 0) positions."""
  # query_tokens: [B, T], key_tokens: [B, S] -> [B, 1, T, S]
  return (query_tokens > 0)[:, None, :, None] & (key_tokens > 0)[:, None, None, :]


def causal_mask(length: int) -> Array:
  """Position i may attend to positions <= i. [1, 1, length, length]."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def segment_mask(query_segments: Array, key_segments: Array) -> Array:
  """Packed rows: a token attends only within its own sentence pair. [B, 1, T, S]."""
  return query_segments[:, None, :, None] == key_segments[:, None, None, :]


# ----------------------------------------------------------------------------------------------
# Attention.


def dot_product_attention(
  query: Array,
  key: Array,
  value: Array,
  mask: Array | None,
  *,
  dropout_rate: float = 0.0,
  dropout_rng: Array | None = None,
  deterministic: bool = True,
) -> Array:
  """softmax(Q K^T / sqrt(d_k)) V, per head (Eq. 1 of the paper).

  Args:
    query: [B, T, N, H]
    key: [B, S, N, H]
    value: [B, S, N, H]
    mask: boolean, broadcastable to [B, N, T, S]; True = may attend.

  Returns:
    [B, T, N, H]

  The scores Q K^T are accumulated and kept in float32 whatever the inputs' dtype, and the
  softmax runs in float32: bfloat16 loses the small probabilities that long inputs rely on.
  """
  d_k = query.shape[-1]
  logits = einsum_f32("BTNH,BSNH->BNTS", query, key)
  logits = logits / np.float32(np.sqrt(d_k))  # [B, N, T, S] float32
  if mask is not None:
    logits = jnp.where(mask, logits, mask_value(logits.dtype))
  weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
  if not deterministic and dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0).astype(value.dtype)
  return jnp.einsum("BNTS,BSNH->BTNH", weights, value)


class MultiHeadAttention(nn.Module):
  """Multi-head attention (Sec. 3.2.2) with an incremental-decoding cache.

  Projections are bias-free matrices, as the paper writes them (W^Q, W^K, W^V, W^O).

  Decode mode:
    - self-attention (`cross=False`): keys/values of each new token are written into a
      [B, L, N, H] cache at `cache_index`; queries see positions <= index.
    - cross-attention (`cross=True`): keys/values of the encoder output are projected at the
      first step and kept in the cache; later steps reuse them instead of recomputing.
  """

  num_heads: int
  d_model: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  kernel_init: Callable[..., Array] = nn.initializers.xavier_uniform()

  def _kernel(self, name: str, shape: tuple[int, ...]) -> Array:
    # Xavier over (fan_in, fan_out) of the unsplit d_model x d_model matrix.
    flat = self.param(name, self.kernel_init, (shape[0], int(np.prod(shape[1:]))))
    return flat.reshape(shape).astype(self.dtype)

  @nn.compact
  def __call__(
    self,
    inputs_q: Array,
    inputs_kv: Array,
    mask: Array | None,
    *,
    deterministic: bool = True,
    decode: bool = False,
    cross: bool = False,
  ) -> Array:
    # inputs_q: [B, T, D]; inputs_kv: [B, S, D]
    head_dim = self.d_model // self.num_heads
    w_q = self._kernel("query", (self.d_model, self.num_heads, head_dim))
    w_k = self._kernel("key", (self.d_model, self.num_heads, head_dim))
    w_v = self._kernel("value", (self.d_model, self.num_heads, head_dim))
    w_o = self.param("out", self.kernel_init, (self.d_model, self.d_model)).astype(self.dtype)

    # The residual stream is float32; the products run in self.dtype (e.g. bfloat16).
    query = jnp.einsum("BTD,DNH->BTNH", inputs_q.astype(self.dtype), w_q)

    def project_kv(kv: Array) -> tuple[Array, Array]:
      # kv: [B, S, D] -> keys, values: [B, S, N, H]
      kv = kv.astype(self.dtype)
      return jnp.einsum("BSD,DNH->BSNH", kv, w_k), jnp.einsum("BSD,DNH->BSNH", kv, w_v)

    if decode and cross:
      key, value = self._cached_cross_kv(inputs_kv, project_kv)
    elif decode:
      key, value = project_kv(inputs_kv)  # [B, 1, N, H]
      key, value, mask = self._update_self_cache(key, value, mask)
    else:
      key, value = project_kv(inputs_kv)  # [B, S, N, H]

    dropout_rng = None
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    out = dot_product_attention(
      query,
      key,
      value,
      mask,
      dropout_rate=self.dropout_rate,
      dropout_rng=dropout_rng,
      deterministic=deterministic,
    )  # [B, T, N, H]
    out = out.reshape(*out.shape[:2], self.d_model)  # heads concatenated: [B, T, D]
    return out @ w_o

  def _update_self_cache(
    self, key: Array, value: Array, mask: Array | None
  ) -> tuple[Array, Array, Array]:
    """Writes this step's key/value at the cache index; returns the full cache and its mask."""
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      # `init` is called with the full target length: only the cache's shape is made here.
      return key, value, mask
    batch, max_len, heads, head_dim = cached_key.value.shape
    if key.shape != (batch, 1, heads, head_dim):
      raise ValueError(f"decode expects one token per step, got keys of shape {key.shape}.")
    i = index.value
    key = jax.lax.dynamic_update_slice(cached_key.value, key, (0, i, 0, 0))
    value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, i, 0, 0))
    cached_key.value, cached_value.value, index.value = key, value, i + 1
    # The new query (at position i) sees cache positions 0..i: causal masking, incrementally.
    step_mask = (jnp.arange(max_len) <= i)[None, None, None, :]  # [1, 1, 1, L]
    mask = step_mask if mask is None else mask & step_mask
    return key, value, mask

  def _cached_cross_kv(
    self, inputs_kv: Array, project_kv: Callable[[Array], tuple[Array, Array]]
  ) -> tuple[Array, Array]:
    """Encoder keys/values, projected at the first decode step only."""
    batch, src_len, _ = inputs_kv.shape
    head_dim = self.d_model // self.num_heads
    shape = (batch, src_len, self.num_heads, head_dim)
    ready = self.variable("cache", "cross_ready", lambda: jnp.array(False))
    cached_key = self.variable("cache", "cross_key", jnp.zeros, shape, self.dtype)
    cached_value = self.variable("cache", "cross_value", jnp.zeros, shape, self.dtype)
    if self.is_initializing():
      return project_kv(inputs_kv)
    # lax.cond runs one branch: after step 0 the projection is skipped, not masked out.
    old_key, old_value = cached_key.value, cached_value.value
    key, value = jax.lax.cond(ready.value, lambda kv: (old_key, old_value), project_kv, inputs_kv)
    cached_key.value, cached_value.value, ready.value = key, value, jnp.array(True)
    return key, value


class FeedForward(nn.Module):
  """Position-wise FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. 2)."""

  d_model: int
  d_ff: int
  relu_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool = True) -> Array:
    # x: [B, T, D]
    init = nn.initializers.xavier_uniform()
    h = nn.Dense(self.d_ff, dtype=self.dtype, kernel_init=init, name="wi")(x)
    h = nn.relu(h)  # [B, T, F]
    h = nn.Dropout(self.relu_dropout_rate)(h, deterministic=deterministic)
    return nn.Dense(self.d_model, dtype=self.dtype, kernel_init=init, name="wo")(h)
