"""Label-smoothed cross entropy (Sec. 5.4), as a sum plus a denominator.

Returning (sum, count) rather than a mean lets the pmapped step psum both across devices and divide
once, so the loss of a global batch is exact whatever the number of devices or padding per shard.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

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
