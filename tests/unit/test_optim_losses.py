"""The paper's learning-rate schedule and label-smoothed loss, against hand computation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.model import losses
from flaxformer_nmt.training import optim


def test_schedule_matches_formula_at_paper_steps():
  schedule = optim.paper_schedule(d_model=512, warmup_steps=4000)
  for step in (1, 4000, 100_000):
    want = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    # optax counts updates from 0, so the step-th update sees count = step - 1.
    np.testing.assert_allclose(float(schedule(step - 1)), want, rtol=1e-6)
  # The peak is at the warmup step: 512^-0.5 * 4000^-0.5 = 7.0e-4.
  np.testing.assert_allclose(float(schedule(3999)), 6.987712429686844e-4, rtol=1e-6)


def test_optimizer_is_adam_with_paper_betas():
  c = config_lib.base_config("base")
  tx, _ = optim.make_optimizer(c.optim, 512)
  params = {"w": jnp.ones(3)}
  grads = {"w": jnp.array([1.0, -2.0, 0.5])}
  updates, _ = tx.update(grads, tx.init(params), params)
  # First Adam step: m/(sqrt(v)+eps) with bias correction is sign(g) (eps = 1e-9 is negligible).
  lr = 512**-0.5 * 4000**-1.5
  np.testing.assert_allclose(updates["w"], -lr * np.sign([1.0, -2.0, 0.5]), rtol=1e-5)
  ref = optax.adam(lr, b1=0.9, b2=0.98, eps=1e-9)
  ref_updates, _ = ref.update(grads, ref.init(params), params)
  np.testing.assert_allclose(updates["w"], ref_updates["w"], rtol=1e-6)


def test_label_smoothed_loss_equals_hand_computation():
  # One sentence of two real tokens and one padding position; vocabulary of 4.
  logits = jnp.array([[[2.0, 0.5, -1.0, 0.0], [0.0, 1.0, 3.0, -2.0], [9.0, 9.0, 9.0, 9.0]]])
  targets = jnp.array([[0, 2, 0]])
  weights = jnp.array([[1.0, 1.0, 0.0]])
  eps = 0.1
  loss_sum, nll_sum, count = losses.label_smoothed_cross_entropy(logits, targets, weights, eps)

  def log_softmax(row):
    row = np.asarray(row, np.float64)
    return row - math.log(np.exp(row).sum())

  total, nll = 0.0, 0.0
  q_off = eps / 3  # mass spread over the 3 wrong classes
  entropy = -((1 - eps) * math.log(1 - eps) + 3 * q_off * math.log(q_off))
  for pos, y in ((0, 0), (1, 2)):
    lp = log_softmax(logits[0, pos])
    q = np.full(4, q_off)
    q[y] = 1 - eps
    total += -(q * lp).sum() - entropy
    nll += -lp[y]
  np.testing.assert_allclose(float(loss_sum), total, rtol=1e-5)
  np.testing.assert_allclose(float(nll_sum), nll, rtol=1e-5)
  assert float(count) == 2.0


def test_without_smoothing_loss_is_nll():
  logits = jnp.array([[[1.0, 2.0, 0.0]]])
  targets = jnp.array([[1]])
  loss_sum, nll_sum, _ = losses.label_smoothed_cross_entropy(logits, targets, jnp.ones((1, 1)), 0.0)
  np.testing.assert_allclose(float(loss_sum), float(nll_sum), rtol=1e-6)


def _smoothed_targets(targets, vocab_size, eps):
  """q(k) = (1 - eps) * [k == y] + eps / (V - 1) * [k != y]: the mass eps spread over the others.

  tensor2tensor's form (the one the paper's numbers come from): the true class keeps exactly
  1 - eps. targets: [batch, length] -> [batch, length, vocab].
  """
  off = eps / (vocab_size - 1)
  return jax.nn.one_hot(targets, vocab_size) * (1.0 - eps - off) + off


def _reference_losses(logits, targets, weights, eps):
  """The textbook form: explicit smoothed targets q and log-softmax (what the loss avoids)."""
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  q = _smoothed_targets(targets, logits.shape[-1], eps)
  loss = -jnp.sum(q * log_probs, -1) - losses._entropy(eps, logits.shape[-1])
  nll = -jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  return jnp.sum(loss * weights), jnp.sum(nll * weights)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_and_gradients_match_explicit_smoothed_targets(eps):
  rs = np.random.RandomState(0)
  logits = jnp.asarray(rs.randn(3, 5, 11).astype(np.float32) * 3)
  targets = jnp.asarray(rs.randint(0, 11, (3, 5)))
  weights = jnp.asarray((rs.rand(3, 5) > 0.3).astype(np.float32))

  def ours(z):
    loss, nll, _ = losses.label_smoothed_cross_entropy(z, targets, weights, eps)
    return loss, nll

  def ref(z):
    return _reference_losses(z, targets, weights, eps)

  # Everything in one program, as training runs it (eagerly, each operation is one).
  combines = (lambda a, b: a, lambda a, b: b, lambda a, b: 2.0 * a - 0.5 * b)

  @jax.jit
  def both(z):
    """(ours, ref) of the losses, then of their gradients for the loss, the NLL and a mix of
    both (both cotangents nonzero: the hand-written backward)."""
    grads = [
      (jax.grad(lambda z: c(*ours(z)))(z), jax.grad(lambda z: c(*ref(z)))(z)) for c in combines
    ]
    return (ours(z), ref(z)), grads

  (got_losses, want_losses), grads = jax.device_get(both(logits))
  for got, want in zip(got_losses, want_losses, strict=True):
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  for got, want in grads:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("block", [1, 4, 64])
def test_the_blocked_output_loss_equals_the_whole_one(block):
  """losses.blocked_output_loss (the tied output layer and the loss over blocks of positions,
  recomputed in the backward) gives the whole-batch path's losses and gradients: for the
  decoder's output, the table and the logits' bias. 15 positions: the last block is padded."""
  from flaxformer_nmt.model import layers  # pylint: disable=g-import-not-at-top

  rs = np.random.RandomState(1)
  features = jnp.asarray(rs.randn(3, 5, 8).astype(np.float32))
  table = jnp.asarray(rs.randn(11, 8).astype(np.float32))
  bias = jnp.asarray(rs.randn(11).astype(np.float32))
  targets = jnp.asarray(rs.randint(0, 11, (3, 5)))
  weights = jnp.asarray((rs.rand(3, 5) > 0.3).astype(np.float32))

  def whole(f, t, b):
    logits = layers.tied_logits(f, t) + b
    loss, nll, _ = losses.label_smoothed_cross_entropy(logits, targets, weights, 0.1)
    return loss, nll

  def blocked(f, t, b):
    loss, nll, count = losses.blocked_output_loss(
      f, t, b, targets, weights, 0.1, block, jnp.float32
    )
    assert count.shape == ()
    return loss, nll

  @jax.jit
  def both(f, t, b):
    mix = lambda fn: lambda *a: 2.0 * fn(*a)[0] - 0.5 * fn(*a)[1]  # noqa: E731  both cotangents
    return [(fn(f, t, b), jax.grad(mix(fn), argnums=(0, 1, 2))(f, t, b)) for fn in (whole, blocked)]

  (want, want_grads), (got, got_grads) = jax.device_get(both(features, table, bias))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(got_grads, want_grads, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
