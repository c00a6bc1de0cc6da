"""Per-device pure training and evaluation steps.

These functions see one device's shard of the batch and talk to the other devices only through
collectives on `parallel.AXIS`; `runtime/parallel.py` turns them into pmapped programs. Metrics are
returned as psum'd (sum, count) pairs so the host divides once and the result does not depend on how
the global batch was split.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from flaxformer_nmt.model import losses
from flaxformer_nmt.model.layers import LORA_COLLECTION
from flaxformer_nmt.model.transformer import Transformer, tied_output_layer
from flaxformer_nmt.training import lora as lora_lib
from flaxformer_nmt.training import loss_scale as loss_scale_lib

Array = jax.Array
Batch = dict[str, Array]  # inputs, targets, *_position, *_segmentation: [rows, length] int32


@flax.struct.dataclass
class TrainState:
  """Everything that determines the rest of a training run (saved in each checkpoint)."""

  step: Array  # int32 scalar: updates applied so far
  params: Any  # the model's parameters (a LoRA run's merged: W0 + s * A @ B where adapted)
  opt_state: Any  # of `trainable(state)`: the params, or a LoRA run's adapters only
  rng: Array  # base dropout key; step t on device d uses fold_in(fold_in(rng, t), d)
  # float16 runs only (training/loss_scale.py); None otherwise, and then not in checkpoints.
  loss_scale: loss_scale_lib.LossScale | None = None
  # LoRA runs only (training/lora.py: the frozen W0 and the adapters); None otherwise.
  lora: lora_lib.LoraState | None = None


def create_train_state(
  params: Any,
  tx: optax.GradientTransformation,
  rng: Array,
  loss_scale: loss_scale_lib.LossScale | None = None,
  lora: lora_lib.LoraState | None = None,
) -> TrainState:
  state = TrainState(jnp.array(0, jnp.int32), params, None, rng, loss_scale, lora)
  return state.replace(opt_state=tx.init(trainable(state)))


def trainable(state: TrainState) -> Any:
  """What the optimizer updates: the parameters, or a LoRA run's adapters alone."""
  return state.params if state.lora is None else state.lora.adapters


def _with_trainable(state: TrainState, new: Any, lora_scale: float) -> TrainState:
  """`state` with `new` as its trainable part; a LoRA run's params re-merged from it."""
  if state.lora is None:
    return state.replace(params=new)
  lora = state.lora.replace(adapters=new)
  return state.replace(params=lora_lib.merged(state.params, lora, lora_scale), lora=lora)


def _forward(
  model: Transformer,
  params: Any,
  batch: Batch,
  train: bool,
  rngs=None,
  lora: Any = None,
  logits: bool = True,
) -> Array:
  variables = {"params": params} if lora is None else {"params": params, LORA_COLLECTION: lora}
  return model.apply(
    variables,
    batch["inputs"],
    batch["targets"],
    batch.get("inputs_position"),
    batch.get("targets_position"),
    batch.get("inputs_segmentation"),
    batch.get("targets_segmentation"),
    train=train,
    rngs=rngs,
    logits=logits,
  )  # [rows, tgt_len, vocab] (logits=False: [rows, tgt_len, d_model])


def _train_loss(
  model: Transformer,
  params: Any,
  micro: Batch,
  weights: Array,
  label_smoothing: float,
  rngs: dict[str, Array],
  lora: Any,
) -> tuple[Array, Array]:
  """(loss sum, nll sum) of a training micro-batch: the output layer and the loss over the whole
  batch, or in blocks of `model.cfg.loss_block_tokens` positions (losses.blocked_output_loss)."""
  block = model.cfg.loss_block_tokens
  if not block:
    logits = _forward(model, params, micro, train=True, rngs=rngs, lora=lora)
    loss_sum, nll_sum, _ = losses.label_smoothed_cross_entropy(
      logits, micro["targets"], weights, label_smoothing
    )
    return loss_sum, nll_sum
  if not model.cfg.share_embeddings:  # config.checks refuses it; a hand-built config too
    raise ValueError(
      f"loss_block_tokens={block} computes the tied output layer in blocks, but this model's "
      "output layer is its own (share_embeddings=False)."
    )
  features = _forward(model, params, micro, train=True, rngs=rngs, lora=lora, logits=False)
  table, bias = tied_output_layer(params)
  loss_sum, nll_sum, _ = losses.blocked_output_loss(
    features,
    table,
    bias,
    micro["targets"],
    weights,
    label_smoothing,
    block,
    model.cfg.dtype,
  )
  return loss_sum, nll_sum


def applied_count(state: TrainState) -> Array:
  """The number of updates the optimizer has applied: what its schedule is evaluated at.

  It equals `state.step` unless `skip_nonfinite` skipped updates (the step still advances to
  move the data and dropout keys on, optax's count does not), so the learning rate of an update
  is `schedule(applied_count(state))`, not `schedule(state.step)`. An optimizer that keeps no count
  (plain SGD in tests) has no schedule to follow: then the step.
  """
  counts = optax.tree_utils.tree_get_all_with_path(state.opt_state, "count")
  return counts[0][1] if counts else state.step


def _global_norm(tree: Any) -> Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def _micro_batches(batch: Batch, k: int) -> Batch:
  """[rows, length] -> [k, rows / k, length]: consecutive row blocks, one per micro-batch."""

  def split(x: Array) -> Array:
    if x.shape[0] % k:
      raise ValueError(
        f"{x.shape[0]} rows per device do not split into optim.accumulate_steps={k} micro-batches."
      )
    return x.reshape(k, x.shape[0] // k, *x.shape[1:])

  return jax.tree.map(split, batch)


def train_step(
  state: TrainState,
  batch: Batch,
  *,
  model: Transformer,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  label_smoothing: float,
  axis_name: str,
  accumulate_steps: int = 1,
  skip_nonfinite: bool = False,
  loss_scale_period: int = 2000,
  lora_scale: float = 1.0,
) -> tuple[TrainState, dict[str, Array]]:
  """One update on the global batch, of which this device holds a shard.

  The gradient is that of the global per-token mean loss: each device differentiates its loss
  *sum* divided by the global token count, and the gradients are summed across devices. This equals
  a pmean of per-device means only when every shard has the same number of real tokens; packing
  gives shards slightly different counts, and the sum form keeps 1 and 8 devices identical.

  With `accumulate_steps = k > 1` the shard's rows are split into k micro-batches that run one
  after another inside this compiled step (`lax.scan`), adding their gradients; activations are
  held for one micro-batch only, so a k-times-larger batch fits. Because every micro-batch's loss
  sum is divided by the same global token count, micro-batches are weighted by their tokens and
  the update equals that of one step on the whole batch (up to float rounding; dropout masks
  differ, as micro-batch i draws them from fold_in(key, i)).

  A float16 run (`state.loss_scale` set) differentiates the loss times the scale, divides the
  summed gradient by it, and on a non-finite summed gradient skips the update whatever
  `skip_nonfinite` says (training/loss_scale.py); `loss_scale_period` finite steps double it.

  A LoRA run (`state.lora` set) differentiates with respect to the adapters only, through the
  merged kernels W0 + lora_scale * A @ B (training/lora.py); grad_norm is then the adapters'. A
  model built with `lora_dropout` > 0 also gets the adapters themselves, for their dropout.
  """
  scaling = state.loss_scale
  weights = (batch["targets"] > 0).astype(jnp.float32)  # [rows, tgt_len]
  global_tokens = jax.lax.psum(jnp.sum(weights), axis_name)
  dropout_rng = jax.random.fold_in(
    jax.random.fold_in(state.rng, state.step), jax.lax.axis_index(axis_name)
  )

  def grads_of(micro: Batch, rng: Array) -> tuple[Any, tuple[Array, Array]]:
    """Gradient of micro-batch loss sum / global tokens; (loss sum, nll sum) as aux."""
    micro_weights = (micro["targets"] > 0).astype(jnp.float32)

    def loss_fn(trained):  # the params, or a LoRA run's adapters
      params, adapters = trained, None
      if state.lora is not None:
        params = lora_lib.merged(state.params, state.lora.replace(adapters=trained), lora_scale)
        if model.cfg.lora_dropout > 0.0:  # the adapters' own path, for its dropout
          adapters = lora_lib.dropout_inputs(trained, lora_scale)
      loss_sum, nll_sum = _train_loss(
        model, params, micro, micro_weights, label_smoothing, {"dropout": rng}, adapters
      )
      loss = loss_sum / jnp.maximum(global_tokens, 1.0)
      if scaling is not None:
        loss = loss * scaling.scale
      return loss, (loss_sum, nll_sum)

    return jax.grad(loss_fn, has_aux=True)(trainable(state))

  if accumulate_steps == 1:
    grads, (loss_sum, nll_sum) = grads_of(batch, dropout_rng)
  else:

    def accumulate(carry, xs):
      grads, loss_sum, nll_sum = carry
      index, micro = xs
      g, (micro_loss, micro_nll) = grads_of(micro, jax.random.fold_in(dropout_rng, index))
      return (jax.tree.map(jnp.add, grads, g), loss_sum + micro_loss, nll_sum + micro_nll), None

    zeros = jax.tree.map(jnp.zeros_like, trainable(state))
    (grads, loss_sum, nll_sum), _ = jax.lax.scan(
      accumulate,
      (zeros, jnp.zeros([], jnp.float32), jnp.zeros([], jnp.float32)),
      (jnp.arange(accumulate_steps), _micro_batches(batch, accumulate_steps)),
    )
  grads = jax.lax.psum(grads, axis_name)
  if scaling is not None:
    grads = loss_scale_lib.unscale(grads, scaling)
  grad_norm = _global_norm(grads)
  updates, new_opt_state = tx.update(grads, state.opt_state, trainable(state))
  updated = _with_trainable(
    state, optax.apply_updates(trainable(state), updates), lora_scale
  ).replace(opt_state=new_opt_state)

  loss_finite = jnp.isfinite(jax.lax.psum(loss_sum, axis_name))
  finite = loss_finite & jnp.isfinite(grad_norm)
  if skip_nonfinite or scaling is not None:
    # Keep the old parameters and moments (a LoRA run's adapters too); the step counter still
    # advances so the data and the dropout keys move on past the bad batch.
    updated = updated.replace(
      params=jax.tree.map(lambda n, o: jnp.where(finite, n, o), updated.params, state.params),
      opt_state=jax.tree.map(
        lambda n, o: jnp.where(finite, n, o), updated.opt_state, state.opt_state
      ),
      lora=jax.tree.map(lambda n, o: jnp.where(finite, n, o), updated.lora, state.lora),
    )
  new_state = updated.replace(step=state.step + 1)
  overflow = jnp.zeros([], bool)
  if scaling is not None:
    overflow = loss_scale_lib.overflowed(scaling, loss_finite, jnp.isfinite(grad_norm))
    new_state = new_state.replace(
      loss_scale=loss_scale_lib.next_state(scaling, finite, overflow, loss_scale_period)
    )
  # An overflow is the scale's business; any other non-finite step is the trainer's.
  nonfinite = (~finite & ~overflow).astype(jnp.float32)

  metrics = {
    "loss_sum": loss_sum,
    "nll_sum": nll_sum,
    "tokens": jnp.sum(weights),
    "source_tokens": jnp.sum((batch["inputs"] > 0).astype(jnp.float32)),
  }
  metrics = jax.lax.psum(metrics, axis_name)
  metrics.update(
    grad_norm=grad_norm,
    param_norm=_global_norm(new_state.params),
    learning_rate=schedule(applied_count(state)),  # the rate this update applied
    nonfinite=nonfinite,
  )
  if scaling is not None:
    metrics.update(
      overflow=overflow.astype(jnp.float32),
      loss_scale=scaling.scale,  # the scale this step ran with
      skipped_steps_total=new_state.loss_scale.skipped_steps,
    )
  return new_state, metrics


def eval_step(
  params: Any, batch: Batch, *, model: Transformer, label_smoothing: float, axis_name: str
) -> dict[str, Array]:
  """Summed dev metrics for this shard, psum'd across devices."""
  weights = (batch["targets"] > 0).astype(jnp.float32)
  logits = _forward(model, params, batch, train=False)
  loss_sum, nll_sum, tokens = losses.label_smoothed_cross_entropy(
    logits, batch["targets"], weights, label_smoothing
  )
  correct = jnp.sum((jnp.argmax(logits, -1) == batch["targets"]) * weights)
  return jax.lax.psum(
    {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": tokens, "correct": correct}, axis_name
  )
