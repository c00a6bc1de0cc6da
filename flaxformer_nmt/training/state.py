"""A training run's optimizer and its state at step 0, and the checks before a run resumes.

`TrainSetup` is made once per training command from the command's `Components`: the optimizer
(Adam, the schedule, the EMA), the real initial state of a fresh run, and the state's shapes that
a resume restores into (`abstract_state`, allocating nothing: the real initial state of big is
~2.5 GB of host memory thrown away).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import params as params_lib
from flaxformer_nmt.checkpoints import reader
from flaxformer_nmt.model.transformer import Transformer, init_params
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.training import lora, loss_scale, optim
from flaxformer_nmt.training.steps import TrainState, create_train_state


class TrainSetup:
  """The optimizer, schedule and initial state of one run (config.seed, config.optim)."""

  def __init__(self, components: Components) -> None:
    self.components = components
    self.config = components.config
    self.tx, self.schedule = optim.make_optimizer(self.config.optim, components.model_cfg.d_model)
    # float16 activations need a dynamic loss scale (training/loss_scale.py); others have none.
    self.scales_loss = components.model_cfg.dtype == jnp.float16
    o = self.config.optim
    self.lora_rank = int(o.get("lora_rank", 0))  # 0: every parameter trains
    self.lora_targets = lora.parse_targets(o.lora_targets) if self.lora_rank else ()
    self.lora_scale = lora.scale(self.lora_rank, o.lora_alpha) if self.lora_rank else 1.0
    # The model the train step runs: the Components' own, unless adapter dropout needs the
    # adapters' path (training/lora.py); the same parameters either way.
    self.train_model = components.model
    if self.lora_rank and float(o.get("lora_dropout", 0.0)) > 0.0:
      cfg = dataclasses.replace(components.model_cfg, lora_dropout=float(o.lora_dropout))
      self.train_model = Transformer(cfg)

  def _initial_loss_scale(self) -> loss_scale.LossScale | None:
    return loss_scale.initial(self.config.optim) if self.scales_loss else None

  def _keys(self) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(parameter init, dropout, adapter init) keys, all from config.seed."""
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(self.config.seed))
    return init_rng, dropout_rng, jax.random.fold_in(init_rng, 1)

  def _state_from(self, params: Any, dropout_rng: jax.Array, lora_rng: jax.Array) -> TrainState:
    adapters = None
    if self.lora_rank:
      adapters = lora.init(params, self.lora_rank, self.lora_targets, lora_rng)
    return create_train_state(params, self.tx, dropout_rng, self._initial_loss_scale(), adapters)

  def initial_state(self) -> TrainState:
    """The state at step 0: freshly initialised parameters, Adam's zeros (host arrays)."""
    init_rng, dropout_rng, lora_rng = self._keys()
    params = jax.jit(init_params, static_argnums=0)(self.components.model_cfg, init_rng)
    return jax.device_get(self._state_from(params, dropout_rng, lora_rng))

  def start_from(self, state: TrainState, params: Any) -> TrainState:
    """`state` (step 0) restarted from `params` (config.init_from): fresh Adam moments and a
    parameter average that starts at them, or, for LoRA, W0 = `params` and fresh adapters."""
    _, dropout_rng, lora_rng = self._keys()
    fresh = jax.device_get(self._state_from(params, dropout_rng, lora_rng))
    return state.replace(params=fresh.params, opt_state=fresh.opt_state, lora=fresh.lora)

  def abstract_state(self) -> TrainState:
    """The train state's structure, shapes and dtypes: the template a resume restores into,
    built on the Components' abstract parameters (the model is not traced again)."""
    _, dropout_rng, lora_rng = self._keys()
    return jax.eval_shape(
      lambda params: self._state_from(params, dropout_rng, lora_rng),
      self.components.abstract_params,
    )


def check_resume_fits(
  config: ml_collections.ConfigDict, workdir: Workdir, components: Components
) -> None:
  """CheckpointMismatchError, before any data is read, if the workdir's newest training
  checkpoint holds another model (e.g. trained as base, resumed with the big config), or if the
  run would switch its parameter average on or off: a run keeps one (config.optim.ema_decay > 0)
  or not, as its checkpoints were saved (its config.json says which; the decay may change)."""
  params_lib.check_fits(workdir.checkpoints, components.abstract_params)
  _check_precision_fits(workdir, components)
  saved = workdir.saved_config().get("optim", {})
  if not workdir.training_steps():
    return
  _check_lora_fits(config, saved, workdir)
  if "ema_decay" not in saved:
    return
  was, now = float(saved["ema_decay"]), float(config.optim.ema_decay)
  if bool(was) != bool(now):
    turn = "on" if now else "off"
    raise errors.CheckpointMismatchError(
      f"config.optim.ema_decay={now:g}, but the checkpoints in {workdir.checkpoints} were saved "
      f"with ema_decay={was:g}: a run under way cannot turn its parameter average {turn} (start "
      f"another workdir, with config.init_from={workdir.path} to keep the parameters)."
    )


def _check_lora_fits(
  config: ml_collections.ConfigDict, saved: dict[str, Any], workdir: Workdir
) -> None:
  """CheckpointMismatchError if a run under way would change what it trains: LoRA on or off,
  another rank, alpha (the scale of the merged kernels) or set of targets."""

  def what(o: Any) -> tuple[int, float, frozenset[str]]:
    rank = int(o.get("lora_rank", 0))
    if not rank:
      return 0, 0.0, frozenset()
    targets = frozenset(lora.parse_targets(str(o.get("lora_targets", "q,k,v,o"))))
    return rank, float(o.get("lora_alpha", 16.0)), targets

  now, was = what(config.optim), what(saved)
  if now == was:
    return

  def describe(rank: int, alpha: float, targets: frozenset[str]) -> str:
    if not rank:
      return "lora_rank=0 (no adapters)"
    names = ",".join(t for t in lora.TARGETS if t in targets)
    return f"lora_rank={rank}, lora_alpha={alpha:g}, lora_targets={names!r}"

  raise errors.CheckpointMismatchError(
    f"config.optim: {describe(*now)}, but the checkpoints in {workdir.checkpoints} were saved "
    f"with {describe(*was)}: a run under way keeps what it trains (start another workdir, with "
    f"config.init_from={workdir.path} to keep the parameters)."
  )


def _check_precision_fits(workdir: Workdir, components: Components) -> None:
  """CheckpointMismatchError if the newest training checkpoint was saved in float16 (it holds a
  loss scale) and this run is not, or the other way round: a run keeps its precision. The command
  line refuses such a change earlier (config/run_config.py); this guards the API and the tests,
  which may build a run's config afresh."""
  steps = reader.CheckpointDir(workdir.checkpoints)
  saved = steps.steps()
  if not saved:
    return
  try:
    was_float16 = steps.holds(saved[-1], "loss_scale")
  except reader.Unreadable:
    return  # left to the restore, which falls back past a corrupt step
  now_float16 = components.model_cfg.dtype == jnp.float16
  if was_float16 != now_float16:
    dtype = jnp.dtype(components.model_cfg.dtype).name
    saved_as = "float16 (with a loss scale)" if was_float16 else "float32 or bfloat16"
    raise errors.CheckpointMismatchError(
      f"config.model.dtype={dtype!r}, but the checkpoints in {workdir.checkpoints} were saved in "
      f"{saved_as}: a run under way keeps its precision (start another workdir, with "
      f"config.init_from={workdir.path} to keep the parameters)."
    )
