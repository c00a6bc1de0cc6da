"""Label-smoothed cross entropy (Sec. 5.4), as a sum plus a denominator.

Returning (sum, count) rather than a mean lets the pmapped step psum both across devices and divide
once, so the loss of a global batch is exact whatever the number of devices or padding per shard.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from flaxformer_nmt.model import layers

Array = jax.Array


def label_smoothed_cross_entropy(
  logits: Array, targets: Array, weights: Array, label_smoothing: float
) -> tuple[Array, Array, Array]:
  """Cross entropy against smoothed targets, over positions with weight 1 (non-padding).

  Args:
    logits: [batch, length, vocab] float32.
    targets: [batch, length] int ids.
    weights: [batch, length] 1.0 for real tokens, 0.0 for padding.
    label_smoothing: eps_ls in [0, 1).

  Returns:
    (loss_sum, nll_sum, token_count): the smoothed loss summed over real tokens; the plain
    negative log-likelihood summed likewise (what perplexity is computed from); the count.
  """
  loss, nll = _token_losses(logits.astype(jnp.float32), targets, label_smoothing)
  return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(weights)


def blocked_output_loss(
  features: Array,
  table: Array,
  bias: Array | None,
  targets: Array,
  weights: Array,
  label_smoothing: float,
  block_tokens: int,
  dtype: Any,
) -> tuple[Array, Array, Array]:
  """`label_smoothed_cross_entropy` of the tied output layer's logits, computed in blocks.

  The whole-batch path holds the float32 logits of every target position at once ([24,832,
  37,000] at the paper's batch: 3.7 GB), and its loss passes read them three times: on an H200
  the output layer and the loss were 21% of the base step (docs/performance.md). Here the
  positions go through in blocks of `block_tokens` (`lax.scan`), each block's logits made,
  reduced to its loss sums and dropped; `jax.checkpoint` recomputes them in the backward, one
  block at a time, for one more output-layer product. `table` stays float32 and is cast to
  `dtype` inside each product (layers.tied_logits), whose backward returns each block's table
  gradient in float32: the blocks' gradients are summed without rounding each to `dtype`.

  Args:
    features: [B, T, D] float32, the decoder's output (Transformer(..., logits=False)).
    table: [V, D] float32, the shared embedding.
    bias: [V] float32 (Marian's final_logits_bias) or None.
    targets, weights: [B, T], as `label_smoothed_cross_entropy`'s.
    block_tokens: the most positions a block holds. The N positions are split into
      ceil(N / block_tokens) blocks of equal size, padded with fewer weight-0 positions than
      there are blocks (a last block padded to the full size would compute up to a block of
      padding: 15% more at 24,832 positions in blocks of 4,096).
    dtype: the products' dtype (the model's).

  Returns:
    (loss_sum, nll_sum, token_count), as `label_smoothed_cross_entropy`.
  """
  width = features.shape[-1]
  y = features.reshape(-1, width)  # [N, D]
  t, w = targets.reshape(-1), weights.reshape(-1)  # [N]
  blocks = -(-y.shape[0] // block_tokens)
  size = -(-y.shape[0] // blocks)  # <= block_tokens
  pad = blocks * size - y.shape[0]  # < blocks
  y = jnp.pad(y, ((0, pad), (0, 0))).reshape(blocks, size, width)
  t = jnp.pad(t, (0, pad)).reshape(blocks, size)
  w = jnp.pad(w, (0, pad)).reshape(blocks, size)

  # prevent_cse=False: inside lax.scan the recomputation cannot be merged away (JAX's advice).
  @functools.partial(jax.checkpoint, prevent_cse=False)
  def block(table: Array, bias: Array | None, y_b: Array, t_b: Array, w_b: Array):
    # y_b [C, D], t_b and w_b [C] -> the block's (loss sum, nll sum).
    logits = layers.tied_logits(y_b[None].astype(dtype), table)[0]  # [C, V] float32
    if bias is not None:
      logits = logits + bias
    loss, nll = _token_losses(logits, t_b, label_smoothing)
    return jnp.sum(loss * w_b), jnp.sum(nll * w_b)

  def step(sums: tuple[Array, Array], xs: tuple[Array, Array, Array]):
    loss_b, nll_b = block(table, bias, *xs)
    return (sums[0] + loss_b, sums[1] + nll_b), None

  zero = jnp.zeros([], jnp.float32)
  (loss_sum, nll_sum), _ = jax.lax.scan(step, (zero, zero), (y, t, w))
  return loss_sum, nll_sum, jnp.sum(weights)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_losses(logits: Array, targets: Array, label_smoothing: float) -> tuple[Array, Array]:
  """Per-token smoothed loss and NLL without a [tokens, vocab] target or log-probability array.

  With off = eps / (V - 1) and on = 1 - eps - off, q = off + on * onehot(y), so
    -sum_k q_k log p_k = -(off * sum_k z_k - off * V * lse) - on * (z_y - lse),
  where z are the logits and lse their log-sum-exp: a reduction, a sum and a gather, fused by XLA
  into passes over the logits. The gradient is p - q (and p - onehot(y) for the NLL), written by
  hand in `_token_losses_bwd` so autodiff does not keep log-probabilities or scatter into a
  [tokens, vocab] buffer: the logits are the only [tokens, vocab] array kept for the backward.
  Subtracting q's entropy makes a perfect prediction score 0, so the loss is comparable across
  eps; it does not change gradients.

  logits: [..., V] float32; targets: [...] -> (loss, nll), each [...].
  """
  (loss, nll), _ = _token_losses_fwd(logits, targets, label_smoothing)
  return loss, nll


def _token_losses_fwd(logits: Array, targets: Array, label_smoothing: float):
  vocab = logits.shape[-1]
  off = label_smoothing / (vocab - 1)
  on = 1.0 - label_smoothing - off
  lse = jax.nn.logsumexp(logits, axis=-1)  # [...]
  z_y = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [...]
  nll = lse - z_y
  loss = on * nll
  if label_smoothing:
    loss = loss + off * (vocab * lse - jnp.sum(logits, axis=-1))
  loss = loss - _entropy(label_smoothing, vocab)
  return (loss, nll), (logits, targets, lse)


def _token_losses_bwd(label_smoothing: float, residuals, cotangents):
  logits, targets, lse = residuals
  g_loss, g_nll = cotangents  # [...] each
  vocab = logits.shape[-1]
  off = label_smoothing / (vocab - 1)
  on = 1.0 - label_smoothing - off
  probs = jnp.exp(logits - lse[..., None])  # [..., V]
  is_target = jnp.arange(vocab) == targets[..., None]  # [..., V], fused: never stored
  # d loss / dz = p - q = p - off - on * [k == y];  d nll / dz = p - [k == y].
  g_sum = (g_loss + g_nll)[..., None]
  d_logits = probs * g_sum - g_loss[..., None] * off
  d_logits = d_logits - jnp.where(is_target, (g_loss * on + g_nll)[..., None], 0.0)
  return d_logits.astype(logits.dtype), None


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)


def _entropy(label_smoothing: float, vocab_size: int) -> float:
  """Entropy of the smoothed target distribution: the smallest value the loss can take."""
  eps = label_smoothing
  off = eps / (vocab_size - 1)

  def xlogx(p: float) -> float:
    return p * math.log(p) if p > 0 else 0.0

  return -(xlogx(1.0 - eps) + (vocab_size - 1) * xlogx(off))
