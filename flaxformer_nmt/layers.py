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

from flaxformer_nmt import config_lib

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


@jax.custom_vjp
def tied_logits(y: Array, table: Array) -> Array:
  """Logits from the shared embedding: [B, T, D] x [V, D] -> [B, T, V] float32 (`einsum_f32`).

  The backward is written out so that the [B, T, V] logit gradient is read in the layout it is
  produced in by both products (dy = dlogits @ table, and the table's gradient as the transpose
  of y^T @ dlogits). Left to autodiff, XLA:CPU wrote a transposed copy of the whole logit
  gradient ([V, B*T], 131 MB at 4,096 tokens and 8k vocabulary) for the table's gradient: 10% of
  a small model's step.
  """
  return einsum_f32("BTD,VD->BTV", y, table)


def _tied_logits_fwd(y: Array, table: Array) -> tuple[Array, tuple[Array, Array]]:
  return tied_logits(y, table), (y, table)


def _tied_logits_bwd(residuals: tuple[Array, Array], d_logits: Array) -> tuple[Array, Array]:
  y, table = residuals  # [B, T, D], [V, D]
  d_logits = d_logits.astype(y.dtype)  # [B, T, V]
  d_y = einsum_f32("BTV,VD->BTD", d_logits, table)
  y_t = y.reshape(-1, y.shape[-1]).T  # [D, B*T]: a small copy, instead of one of d_logits
  d_table_t = einsum_f32("DN,NV->DV", y_t, d_logits.reshape(-1, d_logits.shape[-1]))  # [D, V]
  return d_y.astype(y.dtype), d_table_t.T.astype(table.dtype)  # [B, T, D], [V, D]


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


def mask_value(dtype: Dtype) -> Array:
  """The most negative finite value of `dtype`: a "minus infinity" that stays finite.

  A fully masked row (a padding query) then gets a uniform softmax instead of NaNs, and its output
  is ignored downstream by the loss mask. A fixed constant would not do: -1e9 is -inf in float16.
  """
  return jnp.asarray(jnp.finfo(dtype).min, dtype)


# ----------------------------------------------------------------------------------------------
# Dropout.

# How dropout masks are drawn (config.model.dropout_rng):
#   "threefry16"  one 32-bit threefry draw gives two masks' worth of 16-bit uniforms: half the
#                 random-number work of "threefry" (on this project's CPU, dropout was 12% of
#                 the small model's step with "threefry", 3% with this). The rate is rounded to
#                 a multiple of 1/65536 (0.1 -> 0.100006).
#   "threefry"    jax.random.bernoulli with the default threefry generator, as flax's nn.Dropout.
#   "rbg"         jax.random.bernoulli on an "rbg" key (XLA's RngBitGenerator): the fast choice
#                 on TPUs; slower than threefry on CPUs (measured: 1.6x slower per mask).
DROPOUT_RNGS = config_lib.DROPOUT_RNGS


def dropout_keep_mask(rng: Array, rate: float, shape: tuple[int, ...], kind: str) -> Array:
  """A boolean mask of `shape`, True with probability 1 - rate, from the raw threefry key `rng`."""
  if kind == "threefry":
    return jax.random.bernoulli(rng, 1.0 - rate, shape)
  if kind == "rbg":
    rbg_key = jax.random.wrap_key_data(jax.random.bits(rng, (4,), jnp.uint32), impl="rbg")
    return jax.random.bernoulli(rbg_key, 1.0 - rate, shape)
  if kind != "threefry16":
    raise ValueError(f"Unknown dropout rng {kind!r}; choose one of {DROPOUT_RNGS}.")
  size = int(np.prod(shape))
  words = jax.random.bits(rng, ((size + 1) // 2,), jnp.uint32)  # [ceil(size / 2)]
  halves = jnp.concatenate([words & 0xFFFF, words >> 16])[:size]  # [size] uniform in [0, 2^16)
  threshold = jnp.uint32(round(rate * 2**16))
  return (halves >= threshold).reshape(shape)


def dropout(x: Array, rate: float, rng: Array | None, kind: str) -> Array:
  """Inverted dropout: zero with probability `rate`, scale the rest by 1 / (1 - rate)."""
  if rng is None or rate == 0.0:
    return x
  keep = dropout_keep_mask(rng, rate, x.shape, kind)
  return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
  """nn.Dropout with a choice of mask generator (`DROPOUT_RNGS`); keys from the "dropout" stream."""

  rate: float
  rng_kind: str = "threefry16"

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    return dropout(x, self.rate, self.make_rng("dropout"), self.rng_kind)


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


def attention_weights(query: Array, key: Array, mask: Array | None) -> Array:
  """softmax(Q K^T / sqrt(d_k)): query [B, T, N, H], key [B, S, N, H] -> [B, N, T, S] float32."""
  d_k = query.shape[-1]
  logits = einsum_f32("BTNH,BSNH->BNTS", query, key)
  logits = logits / np.float32(np.sqrt(d_k))  # [B, N, T, S] float32
  if mask is not None:
    logits = jnp.where(mask, logits, mask_value(logits.dtype))
  return jax.nn.softmax(logits, axis=-1)


def dot_product_attention(
  query: Array,
  key: Array,
  value: Array,
  mask: Array | None,
  *,
  dropout_rate: float = 0.0,
  dropout_rng: Array | None = None,
  deterministic: bool = True,
  dropout_kind: str = "threefry16",
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
  weights = attention_weights(query, key, mask).astype(value.dtype)  # [B, N, T, S]
  if not deterministic:
    weights = dropout(weights, dropout_rate, dropout_rng, dropout_kind)
  return jnp.einsum("BNTS,BSNH->BTNH", weights, value)


class MultiHeadAttention(nn.Module):
  """Multi-head attention (Sec. 3.2.2) with an incremental-decoding cache.

  Projections are bias-free matrices, as the paper writes them (W^Q, W^K, W^V, W^O), stored as
  separate [D, D] parameters. They are concatenated at use, so self-attention runs one [D, 3D]
  product and cross-attention one [D, 2D] product for keys and values (one wide product instead
  of three narrow ones), and the checkpoint layout does not change.

  Decode mode:
    - self-attention (`cross=False`): keys/values of each new token are written into the cache
      at `cache_index` (keys [B, N, H, L], values [B, N, L, H]: see `_init_self_cache`); queries
      see positions <= index.
    - cross-attention (`cross=True`): keys/values of the encoder output are projected once,
      before the search loop, into the separate `cross_cache` collection, one row per
      *sentence*. In beam search the queries come in K rows per sentence (`inputs_q` has K times
      the rows of `inputs_kv`); the K beams of a sentence then act as K query positions against
      the one copy of that sentence's keys, so nothing is repeated or reordered per beam.
  """

  num_heads: int
  d_model: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  kernel_init: Callable[..., Array] = nn.initializers.xavier_uniform()
  dropout_kind: str = "threefry16"  # DROPOUT_RNGS

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
    """inputs_q: [B, T, D]; inputs_kv: [B, S, D] ([B / K, S, D] in beam decoding) -> [B, T, D].

    Passing the same array as `inputs_q` and `inputs_kv` (self-attention) fuses Q, K and V.
    """
    d, n = self.d_model, self.num_heads
    h = d // n
    # Xavier over (fan_in, fan_out) of each unsplit d_model x d_model matrix, as the paper's W's.
    w_q, w_k, w_v, w_o = (self.param(name, self.kernel_init, (d, d)) for name in _PROJECTIONS)
    w_o = w_o.astype(self.dtype)

    # The residual stream is float32; the products run in self.dtype (e.g. bfloat16).
    def project(x: Array, *weights: Array) -> list[Array]:
      # x: [B, S, D] -> len(weights) arrays [B, S, N, H], from one [D, len * D] product.
      w = jnp.concatenate(weights, axis=1).astype(self.dtype)  # [D, len * D]
      out = jnp.einsum("BSD,DE->BSE", x.astype(self.dtype), w)  # [B, S, len * D]
      return [p.reshape(*x.shape[:2], n, h) for p in jnp.split(out, len(weights), axis=-1)]

    if inputs_kv is inputs_q and not cross:
      query, key, value = project(inputs_q, w_q, w_k, w_v)
    else:
      (query,) = project(inputs_q, w_q)
      key = value = None  # projected below, except where the cache already holds them

    if decode and cross:
      key, value = self._cached_cross_kv(inputs_kv, lambda kv: tuple(project(kv, w_k, w_v)))
    elif key is None:
      key, value = project(inputs_kv, w_k, w_v)  # [B, S, N, H]
    if decode and not cross and self.has_variable("cache", "cached_key"):
      out = self._cached_self_attention(query, key, value, mask)  # [B, 1, N, H]
      return out.reshape(query.shape[0], -1, d) @ w_o
    if decode and not cross:
      self._init_self_cache(key, value)  # `init` with the full target length: shapes only

    if not decode and self.is_mutable_collection("intermediates"):
      # For pictures (attention.py): the probabilities again, only when asked for; the product
      # below is untouched. Sown as [B, N, T, S] under this module's name.
      self.sow("intermediates", "attention_weights", attention_weights(query, key, mask))
    dropout_rng = None
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    rows = query.shape[0]
    beams = rows // key.shape[0]  # 1, except for cross-attention in beam decoding
    if beams > 1:
      # [B * K, 1, N, H] -> [B, K, N, H]: a sentence's beams become its query positions.
      query = query.reshape(key.shape[0], beams * query.shape[1], n, h)
    out = dot_product_attention(
      query,
      key,
      value,
      mask,
      dropout_rate=self.dropout_rate,
      dropout_rng=dropout_rng,
      deterministic=deterministic,
      dropout_kind=self.dropout_kind,
    )  # [B, T, N, H]
    out = out.reshape(rows, -1, d)  # heads concatenated (and beams back to rows): [B, T, D]
    return out @ w_o

  def _init_self_cache(self, key: Array, value: Array) -> None:
    """Makes the self-attention cache for [B, L, N, H] keys/values, in the decode layouts.

    Keys are kept as [B, N, H, L] and values as [B, N, L, H]: the layouts the two per-step products
    (scores = q . K over H, output = weights . V over L) read directly. Kept as [B, L, N, H], XLA
    transposed the whole cache twice per layer and step, a third of beam-search time on CPU.
    """
    b, length, n, h = key.shape
    self.variable("cache", "cached_key", jnp.zeros, (b, n, h, length), key.dtype)
    self.variable("cache", "cached_value", jnp.zeros, (b, n, length, h), value.dtype)
    self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))

  def _cached_self_attention(
    self, query: Array, key: Array, value: Array, mask: Array | None
  ) -> Array:
    """One decode step: writes this token's key/value at the cache index, attends to 0..index.

    query, key, value: [B, 1, N, H] -> [B, 1, N, H]. Same arithmetic as `dot_product_attention`.
    """
    cached_key = self.variable("cache", "cached_key")  # [B, N, H, L]
    cached_value = self.variable("cache", "cached_value")  # [B, N, L, H]
    index = self.variable("cache", "cache_index")
    batch, heads, head_dim, max_len = cached_key.value.shape
    if key.shape != (batch, 1, heads, head_dim):
      raise ValueError(f"decode expects one token per step, got keys of shape {key.shape}.")
    i = index.value
    keys = jax.lax.dynamic_update_slice(
      cached_key.value, key.transpose(0, 2, 3, 1), (0, 0, 0, i)
    )  # [B, N, H, L]
    values = jax.lax.dynamic_update_slice(
      cached_value.value, value.transpose(0, 2, 1, 3), (0, 0, i, 0)
    )  # [B, N, L, H]
    cached_key.value, cached_value.value, index.value = keys, values, i + 1
    logits = einsum_f32("BTNH,BNHL->BNTL", query, keys) / np.float32(np.sqrt(head_dim))
    # The new query (at position i) sees cache positions 0..i: causal masking, incrementally.
    step_mask = (jnp.arange(max_len) <= i)[None, None, None, :]  # [1, 1, 1, L]
    mask = step_mask if mask is None else mask & step_mask
    logits = jnp.where(mask, logits, mask_value(logits.dtype))  # [B, N, 1, L]
    weights = jax.nn.softmax(logits, axis=-1).astype(values.dtype)
    return jnp.einsum("BNTL,BNLH->BTNH", weights, values)

  def _cached_cross_kv(
    self, inputs_kv: Array, project_kv: Callable[[Array], tuple[Array, Array]]
  ) -> tuple[Array, Array]:
    """Encoder keys/values, [B, S, N, H] each, from the `cross_cache` collection.

    Projected once per sentence, before the search loop, by a call with `cross_cache` mutable
    (`decode.model_step_fn`); the loop's steps read it as a constant. Being outside the loop's
    carried state, it is neither copied nor reordered with the beams, and no step branches on
    whether it is ready.
    """
    if self.is_initializing() or self.is_mutable_collection("cross_cache"):
      key, value = project_kv(inputs_kv)
      self.put_variable("cross_cache", "key", key)
      self.put_variable("cross_cache", "value", value)
      return key, value
    if not self.has_variable("cross_cache", "key"):
      raise ValueError("decode with cross=True needs the cross_cache collection (model_step_fn).")
    return self.get_variable("cross_cache", "key"), self.get_variable("cross_cache", "value")


# Parameter names of W^Q, W^K, W^V, W^O in a MultiHeadAttention.
_PROJECTIONS = ("query", "key", "value", "out")


class FeedForward(nn.Module):
  """Position-wise FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. 2)."""

  d_model: int
  d_ff: int
  relu_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  dropout_kind: str = "threefry16"  # DROPOUT_RNGS

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool = True) -> Array:
    # x: [B, T, D]
    init = nn.initializers.xavier_uniform()
    h = nn.Dense(self.d_ff, dtype=self.dtype, kernel_init=init, name="wi")(x)
    h = nn.relu(h)  # [B, T, F]
    h = Dropout(self.relu_dropout_rate, self.dropout_kind)(h, deterministic=deterministic)
    return nn.Dense(self.d_model, dtype=self.dtype, kernel_init=init, name="wo")(h)
