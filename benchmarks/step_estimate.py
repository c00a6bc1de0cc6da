"""The train step's TPU time as the TPU compiler estimates it, whole and by part (no TPU needed).

Used by `benchmarks/train_step.py --target=tpu:<chip>`; the method and its limits are in
flaxformer_nmt/benchmarking/tpu_estimate.py and docs/performance.md. Every piece is compiled from
shapes only (jax.eval_shape), for one chip holding the whole batch:

  step              the real steps.train_step: forward, backward, gradient norm, Adam update
  forward           the training forward pass and the loss (dropout on), no gradient
  forward_backward  the loss and its gradient with respect to every parameter
  optimizer         Adam's update and its application, from a gradient (optim.make_optimizer)
  attention         one encoder self-attention sublayer (projections, scores, softmax, dropout,
                    values, output), forward and backward; the model has 3 x num_layers of them
                    (encoder self, decoder self, cross), so `attention_all` is that times 3L
  attention_core    the part of it without the projections: scores, softmax and the product
                    with the values, forward and backward, from Q, K, V in the model's dtype
  loss              the tied logits and the label-smoothed loss, forward and backward

Each piece carries its estimate and its share of the step's.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flaxformer_nmt.benchmarking import flops
from flaxformer_nmt.benchmarking import tpu_estimate as te
from flaxformer_nmt.model import attention as attention_layers
from flaxformer_nmt.model import layers, losses
from flaxformer_nmt.model import transformer as model
from flaxformer_nmt.training import loss_scale, optim, steps

BATCH_FIELDS = (
  "inputs",
  "targets",
  "inputs_position",
  "targets_position",
  "inputs_segmentation",
  "targets_segmentation",
)


def _mesh(device: jax.Device) -> jax.sharding.Mesh:
  return jax.sharding.Mesh(np.array([device]), ("batch",))


def _compile(fn, args, device: jax.Device, donate: tuple[int, ...] = ()) -> Any:
  """`fn` compiled for `device` from the abstract `args` (a tuple of pytrees of shapes)."""
  sharding = jax.sharding.NamedSharding(_mesh(device), jax.sharding.PartitionSpec())
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), args)
  return jax.jit(fn, donate_argnums=donate).lower(*abstract).compile()


HLO_DIR: list[str] = []  # set by the benchmark's --hlo_dir: each piece's optimised HLO goes there


def _piece(name: str, fn, args, analytic: float, chip: te.Chip, device, donate=()) -> dict:
  start = time.perf_counter()
  compiled = _compile(fn, args, device, donate)
  if HLO_DIR:
    with open(os.path.join(HLO_DIR[0], f"{chip.generation}_{name}.hlo.txt"), "w") as f:
      f.write(compiled.as_text())
  result = te.estimate(compiled, analytic, chip)
  result["compile_s"] = round(time.perf_counter() - start, 1)
  result["piece"] = name
  return result


def estimate_step(
  c: Any, cfg: model.TransformerConfig, rows: int, max_len: int, chip: te.Chip, pieces: bool
) -> dict[str, Any]:
  """Estimates for the step (and, with `pieces`, its parts) of config `c` at rows x max_len."""
  device = te.device(chip)
  transformer = model.Transformer(cfg)
  tx, schedule = optim.make_optimizer(c.optim, cfg.d_model)
  key = jax.random.PRNGKey(0)
  params = jax.eval_shape(lambda r: model.init_params(cfg, r), key)
  scale = loss_scale.initial(c.optim) if cfg.dtype == jnp.float16 else None  # as training
  state = jax.eval_shape(lambda p: steps.create_train_state(p, tx, key, scale), params)
  batch = {n: jax.ShapeDtypeStruct((rows, max_len), jnp.int32) for n in BATCH_FIELDS}
  tokens = rows * max_len
  counts = dict(
    num_layers=cfg.num_layers,
    d_model=cfg.d_model,
    d_ff=cfg.d_ff,
    vocab_size=cfg.vocab_size,
    src_tokens=tokens,
    tgt_tokens=tokens,
    row_len=max_len,
    d_qk=cfg.num_heads * cfg.d_k,
  )
  step_flops = flops.train_step_flops(**counts)

  # The real per-device step, under a one-device mesh for its data-parallel axis name.
  one_device_step = jax.shard_map(
    lambda s, b: steps.train_step(
      s,
      b,
      model=transformer,
      tx=tx,
      schedule=schedule,
      label_smoothing=c.label_smoothing,
      axis_name="batch",
    ),
    mesh=_mesh(device),
    in_specs=jax.sharding.PartitionSpec(),
    out_specs=jax.sharding.PartitionSpec(),
    check_vma=False,
  )

  results = {
    "step": _piece("step", one_device_step, (state, batch), step_flops, chip, device, (0,))
  }
  if not pieces:
    return results

  def loss(p, b, rng):
    weights = (b["targets"] > 0).astype(jnp.float32)
    logits = steps._forward(transformer, p, b, train=True, rngs={"dropout": rng})  # pylint: disable=protected-access
    return losses.label_smoothed_cross_entropy(logits, b["targets"], weights, c.label_smoothing)[0]

  fwd_flops = flops.forward_flops(**counts)
  results["forward"] = _piece("forward", loss, (params, batch, key), fwd_flops, chip, device)
  results["forward_backward"] = _piece(
    "forward_backward", jax.grad(loss), (params, batch, key), step_flops, chip, device
  )

  def adam(p, o, g):
    updates, o = tx.update(g, o, p)
    return optax.apply_updates(p, updates), o

  results["optimizer"] = _piece(
    "optimizer", adam, (params, state.opt_state, params), 0.0, chip, device, (0, 1)
  )

  attention = attention_layers.MultiHeadAttention(
    num_heads=cfg.num_heads,
    d_model=cfg.d_model,
    dropout_rate=cfg.attention_dropout_rate,
    dtype=cfg.dtype,
    dropout_kind=cfg.dropout_rng,
  )
  x = jax.ShapeDtypeStruct((rows, max_len, cfg.d_model), jnp.float32)
  attention_params = jax.eval_shape(lambda r, x_: attention.init(r, x_, x_, None)["params"], key, x)

  def attention_block(p, x_, seg, rng):
    def f(p_, x__):
      mask = attention_layers.segment_mask(seg, seg)
      y = attention.apply(
        {"params": p_}, x__, x__, mask, deterministic=False, rngs={"dropout": rng}
      )
      y = layers.dropout(y, cfg.dropout_rate, jax.random.fold_in(rng, 1), cfg.dropout_rng)
      return jnp.sum(y.astype(jnp.float32) * x__)  # a scalar whose gradient reaches every input

    return jax.grad(f, argnums=(0, 1))(p, x_)

  d, n = float(cfg.d_model), float(tokens)
  attention_flops = 3.0 * n * (8 * d * d + 4 * max_len * d)
  seg = jax.ShapeDtypeStruct((rows, max_len), jnp.int32)
  results["attention"] = _piece(
    "attention", attention_block, (attention_params, x, seg, key), attention_flops, chip, device
  )

  heads = (rows, max_len, cfg.num_heads, cfg.d_model // cfg.num_heads)
  qkv = jax.ShapeDtypeStruct(heads, cfg.dtype)

  def attention_core(q, k, v, seg):
    def f(q_, k_, v_):
      mask = attention_layers.segment_mask(seg, seg)
      out = attention_layers.dot_product_attention(q_, k_, v_, mask)  # [B, T, N, H]
      return jnp.sum(out.astype(jnp.float32) * q_.astype(jnp.float32))

    return jax.grad(f, argnums=(0, 1, 2))(q, k, v)

  results["attention_core"] = _piece(
    "attention_core", attention_core, (qkv, qkv, qkv, seg), 3.0 * n * 4 * max_len * d, chip, device
  )

  table = jax.ShapeDtypeStruct((cfg.vocab_size, cfg.d_model), jnp.float32)
  targets = jax.ShapeDtypeStruct((rows, max_len), jnp.int32)

  def loss_block(y, t, tg):
    def f(y_, t_):
      logits = layers.tied_logits(y_.astype(cfg.dtype), t_.astype(cfg.dtype))
      weights = (tg > 0).astype(jnp.float32)
      return losses.label_smoothed_cross_entropy(logits, tg, weights, c.label_smoothing)[0]

    return jax.grad(f, argnums=(0, 1))(y, t)

  loss_flops = 3.0 * n * 2 * d * cfg.vocab_size
  results["loss"] = _piece("loss", loss_block, (x, table, targets), loss_flops, chip, device)

  whole = results["step"]["est_ms"]
  for r in results.values():
    r["share_of_step"] = round(r["est_ms"] / whole, 3) if whole and r["est_ms"] else None
  if results["attention"]["est_ms"] and whole:
    all_ms = results["attention"]["est_ms"] * 3 * cfg.num_layers
    results["attention_all"] = {
      "est_ms": round(all_ms, 3),
      "share_of_step": round(all_ms / whole, 3),
    }
  return results


def summary(results: dict[str, dict], tokens: int) -> dict[str, Any]:
  """The step's headline figures: est_step_ms, est_tokens_per_s, est_mfu, and the roofline."""
  step = results["step"]
  est_ms = step["est_ms"]
  return {
    "est_step_ms": est_ms,
    "est_tokens_per_s": round(tokens / (est_ms / 1e3)) if est_ms else None,
    "est_mfu": step["est_mfu"],
    "roofline_step_ms": step["roofline_ms"],
    "why_no_estimate": step["why_no_estimate"],
  }


def dominant(results: dict[str, dict]) -> list[str]:
  """Pieces by share of the step, largest first (the breakdown's reading order)."""
  named = [(k, v.get("share_of_step") or 0.0) for k, v in results.items() if k != "step"]
  named = [(k, s) for k, s in named if k not in ("forward_backward", "attention_core")]
  return [f"{k} {s:.0%}" for k, s in sorted(named, key=lambda kv: -kv[1])]
