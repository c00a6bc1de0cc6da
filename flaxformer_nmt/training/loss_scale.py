"""Dynamic loss scaling for float16 training (Micikevicius et al., 2018, *Mixed Precision
Training*), as fairseq, Marian and the Flax WMT example do it.

float16 has 5 exponent bits: gradients below 2^-24 flush to zero in the backward pass. The loss is
multiplied by a large scale S before differentiation, so the activations' cotangents are S times
larger and stay representable; the float32 parameter gradients are divided by S again before
Adam sees them. A scale too large overflows to inf: then the update is skipped (parameters,
moments and the parameter average stay as they were) and S is halved; after `period` finite
steps in a row S is doubled, so it hovers just below the overflow point.

The state is part of the train state (`training/steps.TrainState.loss_scale`), checkpointed with
it, so a resumed run continues with the same scale and counts. It exists only when the model
computes in float16 (`TrainState.loss_scale` is None otherwise, and float32 and bfloat16
checkpoints keep the layout they had before float16 existed).

Written here rather than taken from flax (`flax.training.dynamic_scale.DynamicScale`): that
class unscales and tests the gradients on each device before they are summed, and per call, so
with this trainer's psum'd gradients and `lax.scan` accumulation, devices (and micro-batches)
could disagree about a skip. Here the finiteness test reads the *summed* gradient, which every
device of every process holds identically, so all of them skip, or none.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import ml_collections

Array = jax.Array

# The floor of the scale. A gradient that is not finite at this scale is not an overflow the scale
# can cure: the trainer treats it as a non-finite loss.
MIN_SCALE = 1.0
MAX_SCALE = 2.0**24  # float16's whole range: a larger scale would overflow every step anyway


@flax.struct.dataclass
class LossScale:
  """The dynamic loss scale of a float16 run; every field a scalar array."""

  scale: Array  # float32: what the loss is multiplied by this step
  good_steps: Array  # int32: finite steps in a row since the scale last changed
  skipped_steps: Array  # int32: updates skipped over the run for non-finite gradients


def initial(optim: ml_collections.ConfigDict) -> LossScale:
  """The state of a fresh float16 run: `optim.loss_scale_init` (2^15 as flax and fairseq)."""
  return LossScale(
    scale=jnp.asarray(float(optim.get("loss_scale_init", 2.0**15)), jnp.float32),
    good_steps=jnp.zeros([], jnp.int32),
    skipped_steps=jnp.zeros([], jnp.int32),
  )


def unscale(grads: object, state: LossScale) -> object:
  """The gradient of the unscaled loss: every leaf divided by the scale (float32 leaves)."""
  inverse = 1.0 / state.scale
  return jax.tree.map(lambda g: g * inverse.astype(g.dtype), grads)


def overflowed(state: LossScale, loss_finite: Array, grads_finite: Array) -> Array:
  """Whether a step overflowed in a way the scale answers: a finite loss whose scaled gradient is
  not finite, at a scale above the floor. A non-finite loss is not one (the scale does not touch
  the forward pass: bad data or a diverged model), nor is a non-finite gradient at the floor.

  The arguments: boolean scalars every device computed from the same summed loss and gradient.
  """
  return loss_finite & ~grads_finite & (state.scale > MIN_SCALE)


def next_state(state: LossScale, finite: Array, overflow: Array, period: int) -> LossScale:
  """After one step: halve on an `overflow` (not below MIN_SCALE), double after `period` finite
  steps in a row (not above MAX_SCALE), count every update skipped (any step not `finite`).

  A non-finite step that is not an overflow (the trainer's NonFiniteLossError, or a skip under
  config.skip_nonfinite) leaves the scale as it was and restarts the count of finite steps.
  """
  good = state.good_steps + 1
  grow = finite & (good >= period)
  scale = jnp.where(grow, jnp.minimum(state.scale * 2.0, MAX_SCALE), state.scale)
  scale = jnp.where(overflow, jnp.maximum(state.scale * 0.5, MIN_SCALE), scale)
  return LossScale(
    scale=scale.astype(jnp.float32),
    good_steps=jnp.where(finite & ~grow, good, 0).astype(jnp.int32),
    skipped_steps=(state.skipped_steps + jnp.where(finite, 0, 1)).astype(jnp.int32),
  )
