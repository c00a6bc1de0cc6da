"""Multi-head attention (Sec. 3.2) with its incremental-decoding caches, and the masks it takes.

Kept apart from layers.py because the decode caches are most of it: self-attention keys/values grow
one step at a time in the `cache` collection, in the layouts the per-step products read; cross-
attention keys/values are projected from the encoder output once, before the search loop, into the
`cross_cache` collection, one row per sentence, which the K beams of that sentence share.

Einsum letters and shape comments are layers.py's (B batch, T query and S key/value positions, N
heads, H one head's width, D d_model, L a decode cache's length).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flaxformer_nmt.model import attention_choice
from flaxformer_nmt.model.layers import Module, dropout, einsum_f32, lora_dropout_term

Array = jax.Array
Dtype = Any


def mask_value(dtype: Dtype) -> Array:
  """The most negative finite value of `dtype`: a "minus infinity" that stays finite.

  A fully masked row (a padding query) then gets a uniform softmax instead of NaNs, and its output
  is ignored downstream by the loss mask. A fixed constant would not do: -1e9 is -inf in float16.
  """
  return jnp.asarray(jnp.finfo(dtype).min, dtype)


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
  softmax runs in float32: bfloat16 loses the small probabilities that long inputs rely on. The
  probabilities are then rounded to the values' dtype for the product with V. The gradient is
  written by hand (`_attention_bwd`).
  """
  rate = 0.0 if deterministic or dropout_rng is None else float(dropout_rate)
  return _attention(query, key, value, mask, dropout_rng if rate else None, rate, dropout_kind)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(query, key, value, mask, rng, rate: float, kind: str) -> Array:
  return _attention_fwd(query, key, value, mask, rng, rate, kind)[0]


def _attention_fwd(query, key, value, mask, rng, rate: float, kind: str):
  probs = attention_weights(query, key, mask).astype(value.dtype)  # [B, N, T, S]
  kept = dropout(probs, rate, rng, kind) if rate else probs
  out = jnp.einsum("BNTS,BSNH->BTNH", kept, value)  # [B, T, N, H]
  return out, (query, key, value, mask, rng, probs, out)


def _attention_bwd(rate: float, kind: str, residuals, d_out: Array):
  """The backward of softmax attention, keeping HBM traffic on [B, N, T, S] arrays low.

  Autodiff kept float32 scores and wrote several float32 [B, N, T, S] intermediates for the
  softmax's gradient: on a TPU, attention was over half of the base train step, nearly all of it
  memory traffic on those arrays (benchmarks/train_step.py --target=tpu:v5p). Here only the
  probabilities (in the values' dtype) are kept, the dropout mask is drawn again from its key,
  and the softmax gradient dS = P (dP - rowsum(dP P)) takes its row sums from the [B, T, N, H]
  arrays instead (rowsum(dP P) = dO . O, as FlashAttention does), so dS is one fused pass.
  """
  query, key, value, mask, rng, probs, out = residuals
  kept = dropout(probs, rate, rng, kind) if rate else probs  # [B, N, T, S]
  d_kept = einsum_f32("BTNH,BSNH->BNTS", d_out, value)  # [B, N, T, S] float32
  d_value = jnp.einsum("BNTS,BTNH->BSNH", kept, d_out.astype(kept.dtype))
  d_probs = dropout(d_kept, rate, rng, kind) if rate else d_kept  # the same mask and scale
  row = jnp.einsum(
    "BTNH,BTNH->BNT", d_out.astype(jnp.float32), out.astype(jnp.float32)
  )  # [B, N, T]: rowsum(dP * P)
  d_logits = probs.astype(jnp.float32) * (d_probs - row[..., None])
  if mask is not None:
    d_logits = jnp.where(mask, d_logits, 0.0)
  d_logits = (d_logits / np.float32(np.sqrt(query.shape[-1]))).astype(query.dtype)
  d_query = jnp.einsum("BNTS,BSNH->BTNH", d_logits, key.astype(query.dtype))
  d_key = jnp.einsum("BNTS,BTNH->BSNH", d_logits, query).astype(key.dtype)
  return d_query, d_key, d_value.astype(value.dtype), None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


class MultiHeadAttention(Module):
  """Multi-head attention (Sec. 3.2.2) with an incremental-decoding cache.

  Projections are bias-free matrices, as the paper writes them (W^Q, W^K, W^V, W^O), stored as
  separate parameters: W^Q and W^K [D, N * d_k], W^V [D, N * d_v], W^O [N * d_v, D], with
  d_v = D / N and d_k = D / N unless `d_k` says otherwise (Table 3 row B). They are concatenated
  at use, so self-attention runs one product for Q, K and V and cross-attention one for K and V
  (one wide product instead of narrow ones), and the checkpoint layout does not change.

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
  dropout_kind: str = "threefry16"  # choices.DROPOUT_RNGS
  implementation: str = "auto"  # choices.ATTENTIONS: model/attention_choice.py
  d_k: int = 0  # one head's query/key width; 0 = d_model / num_heads, as d_v always is
  # Biases on the four projections (`<name>_bias`, zeros at init): the paper has none; Marian and
  # BART models have them (transformers' MarianAttention: nn.Linear(..., bias=True)).
  use_bias: bool = False
  lora_dropout: float = 0.0  # a LoRA run's adapter-input dropout (layers.lora_dropout_term)

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
    d_qk = n * (self.d_k or d // n)  # the width of all heads' queries (and keys) together
    # Xavier over (fan_in, fan_out) of each unsplit matrix, as the paper's W's.
    shapes = {"query": (d, d_qk), "key": (d, d_qk), "value": (d, d), "out": (d, d)}
    w = {name: self.param(name, self.kernel_init, shapes[name]) for name in _PROJECTIONS}
    w_o = w["out"].astype(self.dtype)
    biases: dict[str, Array] = {}
    b_o = None
    if self.use_bias:
      zeros = nn.initializers.zeros
      for name in _PROJECTIONS[:3]:
        biases[name] = self.param(f"{name}_bias", zeros, (shapes[name][1],))
      b_o = self.param("out_bias", zeros, (d,))

    def lora_term(name: str, x: Array) -> Array | None:
      return lora_dropout_term(
        self, name, x, self.lora_dropout, self.dropout_kind, deterministic or decode
      )

    # The residual stream is float32; the products run in self.dtype (e.g. bfloat16).
    def project(x: Array, *names: str) -> list[Array]:
      # x: [B, S, D] -> one [B, S, N, H] array per weight (H its width / N), from one product.
      weights = [w[name] for name in names]
      joined = jnp.concatenate(weights, axis=1).astype(self.dtype)  # [D, sum of the widths]
      out = jnp.einsum("BSD,DE->BSE", x.astype(self.dtype), joined)  # [B, S, sum of the widths]
      if biases:
        out = out + jnp.concatenate([biases[name] for name in names]).astype(out.dtype)
      ends = np.cumsum([weight.shape[1] for weight in weights])[:-1]
      parts = jnp.split(out, ends, axis=-1)  # [B, S, width] each
      for i, name in enumerate(names):
        if (term := lora_term(name, x)) is not None:
          parts[i] = parts[i] + term.astype(out.dtype)
      return [p.reshape(*x.shape[:2], n, -1) for p in parts]

    def output(heads: Array) -> Array:
      # [B, T, D] (heads concatenated) -> [B, T, D]
      out = heads @ w_o
      if (term := lora_term("out", heads)) is not None:
        out = out + term.astype(out.dtype)
      return out if b_o is None else out + b_o.astype(out.dtype)

    if inputs_kv is inputs_q and not cross:
      query, key, value = project(inputs_q, "query", "key", "value")
    else:
      (query,) = project(inputs_q, "query")
      key = value = None  # projected below, except where the cache already holds them

    if decode and cross:
      key, value = self._cached_cross_kv(inputs_kv, lambda kv: tuple(project(kv, "key", "value")))
    elif key is None:
      key, value = project(inputs_kv, "key", "value")  # [B, S, N, H]
    if decode and not cross and self.has_variable("cache", "cached_key"):
      out = self._cached_self_attention(query, key, value, mask)  # [B, 1, N, H]
      return output(out.reshape(query.shape[0], -1, d))
    if decode and not cross:
      self._init_self_cache(key, value)  # `init` with the full target length: shapes only

    if not decode and self.is_mutable_collection("intermediates"):
      # For pictures (decoding/attention_pictures.py): the probabilities again, only when asked for;
      # the product below is untouched. Sown as [B, N, T, S] under this module's name.
      self.sow("intermediates", "attention_weights", attention_weights(query, key, mask))
    return output(self._attend(query, key, value, mask, deterministic, step=decode))

  def _attend(
    self,
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None,
    deterministic: bool,
    step: bool = False,
  ) -> Array:
    """query [B, T, N, H], key/value [B(/K), S, N, H] -> the heads concatenated, [B, T, N * H].

    The full-pass product (training, scoring, the encoder, cross-attention in the search), by the
    configured implementation; a self-attention step of the search reads its cache instead.
    """
    dropout_rng = None
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    rows, n = query.shape[0], self.num_heads
    beams = rows // key.shape[0]  # 1, except for cross-attention in beam decoding
    if beams > 1:
      # [B * K, 1, N, H] -> [B, K, N, H]: a sentence's beams become its query positions.
      query = query.reshape(key.shape[0], beams * query.shape[1], n, query.shape[-1])
    # Which kernel (model/attention_choice.py): "auto" tries cuDNN's on a recent NVIDIA GPU in
    # half precision without attention dropout, and computes with ours what it refuses.
    auto = self.implementation == "auto"
    if auto:
      narrow = query.shape[-1] != value.shape[-1]
      has_dropout = self.dropout_rate > 0.0  # (not `dropout`: layers.dropout is used above)
      kind = attention_choice.auto(self.dtype, has_dropout, narrow, step, not deterministic)
    else:
      kind = attention_choice.explicit(self.implementation, step)
    out = None
    if kind != attention_choice.OURS:
      out = attention_choice.fused(query, key, value, mask, kind, fallback=auto)  # [B, T, N, H]
    if out is None:
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
    return out.reshape(rows, -1, n * value.shape[-1])  # heads concatenated, beams back to rows

  def _init_self_cache(self, key: Array, value: Array) -> None:
    """Makes the self-attention cache for [B, L, N, H] keys/values, in the decode layouts.

    Keys are kept as [B, N, H, L] and values as [B, N, L, H]: the layouts the two per-step products
    (scores = q . K over H, output = weights . V over L) read directly. Kept as [B, L, N, H], XLA
    transposed the whole cache twice per layer and step, a third of beam-search time on CPU.
    (H is d_k for keys and d_v for values.)
    """
    b, length, n, h_k = key.shape
    h_v = value.shape[-1]
    self.variable("cache", "cached_key", jnp.zeros, (b, n, h_k, length), key.dtype)
    self.variable("cache", "cached_value", jnp.zeros, (b, n, length, h_v), value.dtype)
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
    (decoding/model_step.py); the loop's steps read it as a constant. Being outside the loop's
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
