"""Label-smoothed cross entropy (Sec. 5.4), as a sum plus a denominator.

Returning (sum, count) rather than a mean lets the pmapped step psum both across devices and divide
once, so the loss of a global batch is exact whatever the number of devices or padding per shard.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def smoothed_targets(targets: Array, vocab_size: int, label_smoothing: float) -> Array:
  """q(k) = (1 - eps) * [k == y] + eps / (V - 1) * [k != y]: the mass eps spread over the others.

  This is tensor2tensor's form (the one the paper's numbers come from): the true class keeps
  exactly 1 - eps.
  """
  # targets: [batch, length] -> [batch, length, vocab]
  off = label_smoothing / (vocab_size - 1)
  return jax.nn.one_hot(targets, vocab_size) * (1.0 - label_smoothing - off) + off


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
  vocab = logits.shape[-1]
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  q = smoothed_targets(targets, vocab, label_smoothing)
  # Subtracting q's entropy makes a perfect prediction score 0, so the loss is comparable
  # across eps; it does not change gradients.
  loss = -jnp.sum(q * log_probs, axis=-1) - _entropy(label_smoothing, vocab)  # [batch, length]
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(weights)


def _entropy(label_smoothing: float, vocab_size: int) -> float:
  """Entropy of the smoothed target distribution: the smallest value the loss can take."""
  eps = label_smoothing
  off = eps / (vocab_size - 1)

  def xlogx(p: float) -> float:
    return p * math.log(p) if p > 0 else 0.0

  return -(xlogx(1.0 - eps) + (vocab_size - 1) * xlogx(off))
