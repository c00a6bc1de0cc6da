r"""Accelerator memory of one train step, from XLA's compiled memory analysis; nothing is run.

  python benchmarks/memory.py --sizes=base --dtypes=bfloat16 --tokens_per_device=25000
  python benchmarks/memory.py --sizes=big --dtypes=float32 --remat --target=tpu:v5p
  python benchmarks/memory.py --sizes=base,big --dtypes=bfloat16,float32 --target=tpu:v5p  # table

Compiles the real per-device train step (steps.train_step: forward, backward, Adam, with k
micro-batches under optim.accumulate_steps) for one device holding `tokens_per_device` target
tokens (and as many source tokens) per update, from shapes only, and reads
`compiled.memory_analysis()`: the state (parameters and Adam moments, float32), the batch, and
XLA's temporary buffers (activations kept for the backward pass, gradients, logits).

`--target=tpu:v5p` (or tpu:v4, tpu:v5e, tpu:v6e) compiles for that TPU without one
("deviceless" AOT compilation; needs libtpu: `pip install "jax[tpu]"` with your jax version).
Choose a chip with more memory than the step needs (v5p: 95 GiB): when a step does not fit, XLA's
TPU compiler rematerialises on its own until it does (on v5e's 16 GiB every large step compiles
to about 14.5 GiB, and runs slower), which hides the step's own footprint. `--target=host`
compiles for this machine's backend; XLA:CPU strips rematerialisation's optimisation barriers
and fuses differently, so only an accelerator target says what remat saves. GPU targets cannot
be compiled without a GPU.

For each size and dtype the step is compiled with 1 micro-batch and with --probe_k micro-batches;
memory is affine in the micro-batch size, so the two points give the smallest accumulate_steps
(a power of two) that fits each capacity in --capacities_gb (90% of it, leaving room for XLA's
runtime and fragmentation). Last line: JSON.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import step_estimate
from absl import app, flags, logging

from flaxformer_nmt.benchmarking import record, tpu_estimate
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig, init_params
from flaxformer_nmt.training import loss_scale, optim, steps

flags.DEFINE_list("sizes", ["base"], "Model sizes from the size table.")
flags.DEFINE_list("dtypes", ["bfloat16"], "Matrix-product dtypes: bfloat16, float16, float32.")
flags.DEFINE_integer("tokens_per_device", 25_000, "Target tokens per device per update.")
flags.DEFINE_integer("max_len", 256, "Row length of the packed batch.")
flags.DEFINE_integer("vocab_size", 37_000, "Shared vocabulary size.")
flags.DEFINE_bool("remat", False, "Rematerialise each layer (model.remat).")
flags.DEFINE_integer("probe_k", 8, "The second compilation's accumulate_steps.")
flags.DEFINE_list("capacities_gb", ["16", "40", "80"], "Device memories to fit (GiB).")
flags.DEFINE_string("target", "host", "host, or tpu:<generation> (v4, v5e, v5p, v6e).")
FLAGS = flags.FLAGS

GIB = 2**30


def _device(target: str) -> jax.Device:
  """One device of the compilation target (a real one for 'host')."""
  if target == "host":
    return jax.devices()[0]
  try:
    return tpu_estimate.device(tpu_estimate.chip(target))
  except ValueError as e:
    raise app.UsageError(f"{e} (or host)") from e
  except tpu_estimate.NoTpuCompiler as e:
    raise SystemExit(f"--target={target}: {e}") from e


def compile_step(size: str, dtype: str, k: int, device: jax.Device) -> dict[str, float]:
  """Memory of one device's train step with k micro-batches; sizes in GiB."""
  c = config_lib.base_config(size)
  c.model.dtype, c.model.remat, c.model.max_len = dtype, FLAGS.remat, FLAGS.max_len
  cfg = TransformerConfig.from_config(c.model, FLAGS.vocab_size)
  model = Transformer(cfg)
  tx, schedule = optim.make_optimizer(c.optim, cfg.d_model)
  rows = max(FLAGS.tokens_per_device // FLAGS.max_len // k, 1) * k  # a multiple of k
  mesh = jax.sharding.Mesh(np.array([device]), ("batch",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def abstract(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)

  params = jax.eval_shape(lambda r: init_params(cfg, r), jax.random.PRNGKey(0))
  scale = loss_scale.initial(c.optim) if dtype == "float16" else None  # as training keeps it
  state = jax.eval_shape(
    lambda p: steps.create_train_state(p, tx, jax.random.PRNGKey(1), scale), params
  )
  state = jax.tree.map(abstract, state)
  batch = {
    name: jax.ShapeDtypeStruct((rows, FLAGS.max_len), jnp.int32, sharding=replicated)
    for name in step_estimate.BATCH_FIELDS
  }
  step = jax.shard_map(
    lambda s, b: steps.train_step(
      s,
      b,
      model=model,
      tx=tx,
      schedule=schedule,
      label_smoothing=0.1,
      axis_name="batch",
      accumulate_steps=k,
    ),
    mesh=mesh,
    in_specs=jax.sharding.PartitionSpec(),
    out_specs=jax.sharding.PartitionSpec(),
    check_vma=False,
  )
  start = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0,)).lower(state, batch).compile()
  m = compiled.memory_analysis()
  total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  total += m.temp_size_in_bytes
  peak = getattr(m, "peak_memory_in_bytes", 0) or total
  return {
    "accumulate_steps": k,
    "tokens_per_micro_batch": rows // k * FLAGS.max_len,
    "state_gib": round(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) / GIB, 3),
    "temp_gib": round(m.temp_size_in_bytes / GIB, 3),
    "total_gib": round(max(peak, total) / GIB, 3),
    "compile_s": round(time.perf_counter() - start, 1),
  }


def fitting_k(one: dict[str, float], probe: dict[str, float], capacity_gib: float) -> int | None:
  """Smallest power-of-two accumulate_steps whose memory (affine in tokens) fits 90% of capacity."""
  t1, tk = one["tokens_per_micro_batch"], probe["tokens_per_micro_batch"]
  slope = (one["total_gib"] - probe["total_gib"]) / max(t1 - tk, 1)
  fixed = one["total_gib"] - slope * t1
  k = 1
  while k <= 256:
    if fixed + slope * t1 / k <= 0.9 * capacity_gib:
      return k
    k *= 2
  return None


def main(argv: list[str]) -> None:
  del argv
  device = _device(FLAGS.target)
  rows = []
  for size in FLAGS.sizes:
    for dtype in FLAGS.dtypes:
      one = compile_step(size, dtype, 1, device)
      probe = compile_step(size, dtype, FLAGS.probe_k, device)
      fits = {f"k_for_{gb}gb": fitting_k(one, probe, float(gb)) for gb in FLAGS.capacities_gb}
      row = {
        "size": size,
        "dtype": dtype,
        "remat": FLAGS.remat,
        "k1": one,
        f"k{FLAGS.probe_k}": probe,
        **fits,
      }
      logging.info("%s", row)
      print(
        f"{size} {dtype}{' remat' if FLAGS.remat else ''}: {one['total_gib']:.2f} GiB at "
        f"{one['tokens_per_micro_batch']} tokens, {probe['total_gib']:.2f} GiB at "
        f"{probe['tokens_per_micro_batch']}; accumulate_steps "
        + ", ".join(f"{v} for {k[6:]}" for k, v in fits.items()),
        flush=True,
      )
      rows.append(row)
  record.report(
    {
      "target": FLAGS.target,
      "device_kind": device.device_kind,
      "tokens_per_device": FLAGS.tokens_per_device,
      "max_len": FLAGS.max_len,
      "vocab_size": FLAGS.vocab_size,
      "rows": rows,
    }
  )


if __name__ == "__main__":
  app.run(main)
