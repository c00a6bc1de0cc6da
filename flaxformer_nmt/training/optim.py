"""The paper's optimiser (Sec. 5.3): Adam(0.9, 0.98, 1e-9) with warmup and inverse-sqrt decay.

With `optim.ema_decay` > 0 the optimizer also keeps an exponential moving average of the
parameters (Marian's --exponential-smoothing, OpenNMT's average_decay) as the last link of its
chain, so the average lives in the optimizer state: checkpointed, restored and skipped past a
non-finite step exactly as Adam's moments are, with no other code aware of it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

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


class EmaState(NamedTuple):
  """The moving average of the parameters after each update, float32 like them."""

  ema: Any


# When ema_decay > 0, optax.chain(adam, ema) keeps the tuple (adam's state, EmaState), saved as
# {"0": ..., "1": {"ema": ...}}: where checkpoints.params.EMA_PATH reads the average.


def parameter_ema(decay: float) -> optax.GradientTransformation:
  """Leaves the updates alone and tracks ema <- decay * ema + (1 - decay) * (params + updates):
  the average of the parameters each update produces, starting from the initial parameters.

  The last link of a chain, so `updates` are the final ones, applied by optax.apply_updates.
  """

  def init(params: Any) -> EmaState:
    return EmaState(jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params))

  def update(updates: Any, state: EmaState, params: Any = None) -> tuple[Any, EmaState]:
    if params is None:
      raise ValueError("parameter_ema needs the parameters: pass them to tx.update.")
    new_params = optax.apply_updates(params, updates)
    ema = jax.tree.map(
      lambda e, p: decay * e + (1.0 - decay) * p.astype(jnp.float32), state.ema, new_params
    )
    return updates, EmaState(ema)

  return optax.GradientTransformation(init, update)


def ema_of(opt_state: Any) -> Any | None:
  """The parameter average in an optimizer state made by make_optimizer (None if it keeps none)."""
  if isinstance(opt_state, tuple) and len(opt_state) == 2 and isinstance(opt_state[1], EmaState):
    return opt_state[1].ema
  return None


def make_optimizer(
  optim: ml_collections.ConfigDict, d_model: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Adam with the paper's hyper-parameters and `optim.schedule` (the paper's, or its warmup then
  a constant rate), and the parameters' moving average if `optim.ema_decay` > 0; returns
  (optimizer, schedule)."""
  make = SCHEDULES[optim.get("schedule", "paper")]
  schedule = make(d_model, optim.warmup_steps, optim.lr_scale)
  tx = optax.adam(learning_rate=schedule, b1=optim.beta1, b2=optim.beta2, eps=optim.eps)
  decay = float(optim.get("ema_decay", 0.0))
  if decay:
    tx = optax.chain(tx, parameter_ema(decay))
  return tx, schedule
