"""Building blocks of the Transformer: float32-accumulating products, tied logits, dropout,
positional encodings, feed-forward. Attention, with its decode caches and masks, is in
attention.py.

Everything here is pure Flax linen: parameters in, activations out.

Einsum letters and shape comments mean the same in this file, attention.py and transformer.py
(gemma's style):

  B  batch (rows)                      D  d_model
  T  query positions (the target, or   N  heads (h)
     the source in the encoder)        H  one head's width (d_k = d_v = D / N)
  S  key/value positions               F  d_ff
  L  a decode cache's length           V  vocabulary
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta

from flaxformer_nmt.config import choices

Array = jax.Array
Dtype = Any


class StoredParams:
  """A mixin for linen modules: `param` returns a stored parameter without tracing its initializer.

  Linen's `param` checks a stored parameter's shape against `jax.eval_shape` of its initializer at
  every `apply`: 99 traced initializers per decoder trace of the demo model, about a second of a
  two-line `--mode=translate` (a fifth of it once compilation is cached), and of every batch shape
  a server compiles. The shapes are checked anyway where they come from: a restore reads into the
  template of `init` (`Components.abstract_params`), and the run's architecture is reconciled
  with its `config.json` before that. Values, names and the tree are linen's own.
  """

  @nn.nowrap
  def param(self, name: str, init_fn: Any, *init_args: Any, unbox: bool = True, **init_kwargs: Any):
    scope = self.scope  # type: ignore[attr-defined]
    if scope is not None and scope.has_variable("params", name):
      scope.reserve(name, "params")
      value = scope.get_variable("params", name)
      return meta.unbox(value) if unbox else value
    return super().param(name, init_fn, *init_args, unbox=unbox, **init_kwargs)  # type: ignore[misc]


class Dense(StoredParams, nn.Dense):
  """`nn.Dense` (same parameters and arithmetic) without the per-apply initializer trace."""


class Embed(StoredParams, nn.Embed):
  """`nn.Embed` (same parameters and arithmetic) without the per-apply initializer trace."""


class LayerNorm(StoredParams, nn.LayerNorm):
  """`nn.LayerNorm` (same parameters and arithmetic) without the per-apply initializer trace."""


class Module(StoredParams, nn.Module):
  """The base of this package's modules that own parameters (see `StoredParams`)."""


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

  A `table` wider than `y` (float32 parameters, bfloat16 products) is cast to y's dtype for the
  products, and its gradient is returned in float32 unrounded: the blocked loss
  (losses.blocked_output_loss) sums the gradients of many blocks so.
  """
  return einsum_f32("BTD,VD->BTV", y, table.astype(y.dtype))


def _tied_logits_fwd(y: Array, table: Array) -> tuple[Array, tuple[Array, Array]]:
  return tied_logits(y, table), (y, table)


def _tied_logits_bwd(residuals: tuple[Array, Array], d_logits: Array) -> tuple[Array, Array]:
  y, table = residuals  # [B, T, D], [V, D]
  d_logits = d_logits.astype(y.dtype)  # [B, T, V]
  d_y = einsum_f32("BTV,VD->BTD", d_logits, table.astype(y.dtype))
  y_t = y.reshape(-1, y.shape[-1]).T  # [D, B*T]: a small copy, instead of one of d_logits
  d_table_t = einsum_f32("DN,NV->DV", y_t, d_logits.reshape(-1, d_logits.shape[-1]))  # [D, V]
  return d_y.astype(y.dtype), d_table_t.T.astype(table.dtype)  # [B, T, D], [V, D]


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


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
# The names are choices.DROPOUT_RNGS.


def dropout_keep_mask(rng: Array, rate: float, shape: tuple[int, ...], kind: str) -> Array:
  """A boolean mask of `shape`, True with probability 1 - rate, from the raw threefry key `rng`."""
  if kind == "threefry":
    return jax.random.bernoulli(rng, 1.0 - rate, shape)
  if kind == "rbg":
    rbg_key = jax.random.wrap_key_data(jax.random.bits(rng, (4,), jnp.uint32), impl="rbg")
    return jax.random.bernoulli(rbg_key, 1.0 - rate, shape)
  if kind != "threefry16":
    raise ValueError(f"Unknown dropout rng {kind!r}; choose one of {choices.DROPOUT_RNGS}.")
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
  """nn.Dropout with a choice of mask generator (`dropout_keep_mask`); keys from "dropout"."""

  rate: float
  rng_kind: str = "threefry16"

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    return dropout(x, self.rate, self.make_rng("dropout"), self.rng_kind)


# The collection a LoRA run's train step passes when `optim.lora_dropout` > 0 (training/lora.py
# `dropout_inputs`): per adapted kernel {"a": A [d_in, r], "b": s * B [r, d_out]}, nested as the
# params (a Dense child's under its "kernel").
LORA_COLLECTION = "lora"


def lora_dropout_term(
  module: nn.Module, name: str, x: Array, rate: float, kind: str, deterministic: bool
) -> Array | None:
  """PEFT's `lora_dropout` on a merged kernel: what to add to x @ W for the kernel `name`.

  A LoRA run keeps each adapted kernel merged, W = W0 + s A B (training/lora.py), so the model
  needs no adapter path of its own. PEFT drops out the adapter path's input only:
  x W0 + s drop(x) A B, which is x W + s (drop(x) - x) A B. This returns that second term
  ([..., d_out], float32), drawn from the module's "dropout" keys, or None where there is none
  to add: in evaluation and decoding, at rate 0, or for a kernel without adapters. The gradient
  reaches A and B through both terms, so it is PEFT's.
  """
  if deterministic or rate == 0.0 or not module.has_variable(LORA_COLLECTION, name):
    return None
  adapter = module.get_variable(LORA_COLLECTION, name)
  adapter = adapter.get("kernel", adapter)  # a Dense child's adapters sit under its kernel
  dropped = dropout(x, rate, module.make_rng("dropout"), kind) - x  # [..., d_in]
  low = jnp.einsum("...i,ir->...r", dropped.astype(jnp.float32), adapter["a"])  # [..., r]
  return jnp.einsum("...r,ro->...o", low, adapter["b"])  # [..., d_out]


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


# M2M100's positions start after fairseq's padding index (1): the first token's is 2
# (modeling_m2m_100.py create_position_ids_from_input_ids: the non-pad mask's cumsum + padding_idx).
M2M100_OFFSET = 2


def m2m100_encoding(positions: Array, d_model: int) -> Array:
  """transformers' M2M100SinusoidalPositionalEmbedding (also NLLB-200's), at our 0-based
  `positions`: row `position + 2` of its table, whose features are all the sines, then all the
  cosines, of frequencies exp(-k log(10000) / (d_model / 2 - 1)) (`get_embedding`: tensor2tensor's
  spacing, not the paper's 10000^(-2k / d_model)).

  Args:
    positions: [..., length] integer positions from 0 (per segment when packed).
    d_model: feature size (even; checks.py refuses odd).

  Returns:
    [..., length, d_model] float32.
  """
  half = d_model // 2
  inv_freq = np.exp(np.arange(half, dtype=np.float32) * -(np.log(10000.0) / (half - 1)))
  angles = (positions[..., None] + M2M100_OFFSET).astype(jnp.float32) * jnp.asarray(inv_freq)
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., length, d_model]


class PositionalEncoding(Module):
  """Adds sinusoidal (the paper), learned (Table 3, row E) or M2M100's position encodings.

  In decode mode the position is the number of tokens fed so far, kept in the cache, so the
  incremental decoder sees the same encodings as the full forward pass.
  """

  d_model: int
  max_len: int
  kind: str = "sinusoidal"  # choices.POSITIONALS: "sinusoidal" | "learned" | "m2m100"

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
    elif self.kind == "m2m100":
      pe = m2m100_encoding(positions, self.d_model)
    else:  # "learned" (config.checks allows no other)
      table = self.param(
        "pos_embedding", nn.initializers.normal(stddev=0.02), (self.max_len, self.d_model)
      )
      pe = jnp.take(table, positions, axis=0)
    return x + pe.astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Feed-forward.


# The feed-forward's activation (config.model.activation, choices.ACTIVATIONS): the paper's ReLU,
# or those of pretrained models. transformers' ACT2FN names them the same: "swish" and "silu" are
# x * sigmoid(x) (OPUS-MT's configs say "swish"), "gelu" is the exact (erf) GELU,
# "gelu_new" its tanh approximation.
ACTIVATIONS = {
  "relu": nn.relu,
  "swish": nn.silu,
  "silu": nn.silu,
  "gelu": lambda x: nn.gelu(x, approximate=False),
  "gelu_new": lambda x: nn.gelu(x, approximate=True),
}


class FeedForward(Module):
  """Position-wise FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. 2); another activation than max(0, .)
  for a pretrained model that has one (`ACTIVATIONS`)."""

  d_model: int
  d_ff: int
  relu_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  dropout_kind: str = "threefry16"  # choices.DROPOUT_RNGS
  activation: str = "relu"  # a key of ACTIVATIONS
  lora_dropout: float = 0.0  # a LoRA run's adapter-input dropout (`lora_dropout_term`)

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool = True) -> Array:
    # x: [B, T, D]
    init = nn.initializers.xavier_uniform()

    def dense(width: int, name: str, inputs: Array) -> Array:
      out = Dense(width, dtype=self.dtype, kernel_init=init, name=name)(inputs)
      term = lora_dropout_term(
        self, name, inputs, self.lora_dropout, self.dropout_kind, deterministic
      )
      return out if term is None else out + term.astype(out.dtype)

    h = ACTIVATIONS[self.activation](dense(self.d_ff, "wi", x))  # [B, T, F]
    h = Dropout(self.relu_dropout_rate, self.dropout_kind)(h, deterministic=deterministic)
    return dense(self.d_model, "wo", h)
