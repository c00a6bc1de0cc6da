"""The paper's optimiser (Sec. 5.3): Adam(0.9, 0.98, 1e-9) with warmup and inverse-sqrt decay."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), steps counted from 1.

  optax passes the number of updates already applied (0 for the first), hence `count + 1`.
  """

  def schedule(count: jax.Array) -> jax.Array:
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

  return schedule


def constant_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """The paper's warmup, then its peak rate held: scale * d_model^-0.5 * warmup^-0.5 from step
  `warmup_steps` on (for fine-tuning at a small rate, `lr_scale` well below 1)."""

  def schedule(count: jax.Array) -> jax.Array:
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model**-0.5 * warmup_steps**-0.5 * jnp.minimum(step / warmup_steps, 1.0)

  return schedule


SCHEDULES = {"paper": paper_schedule, "constant": constant_schedule}


def make_optimizer(
  optim: ml_collections.ConfigDict, d_model: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Adam with the paper's hyper-parameters and `optim.schedule` (the paper's, or its warmup then
  a constant rate); returns (optimizer, schedule)."""
  make = SCHEDULES[optim.get("schedule", "paper")]
  schedule = make(d_model, optim.warmup_steps, optim.lr_scale)
  tx = optax.adam(learning_rate=schedule, b1=optim.beta1, b2=optim.beta2, eps=optim.eps)
  return tx, schedule
