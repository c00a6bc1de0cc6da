r"""Accelerator memory of one train step, from XLA's compiled memory analysis; nothing is run.

  python benchmarks/memory.py --sizes=base --dtypes=bfloat16 --tokens_per_device=25000
  python benchmarks/memory.py --sizes=big --dtypes=float32 --remat --target=tpu:v5p
  python benchmarks/memory.py --sizes=base --loss_block_tokens=4096 --target=tpu:v5p --probe_k=0
  python benchmarks/memory.py --sizes=base,big --dtypes=bfloat16,float32 --target=tpu:v5p  # table
  python benchmarks/memory.py --sizes=nllb-600m,nllb-1.3b --lora_ranks=0,16 --target=tpu:v5p \
      --vocab_size=256206 --tokens_per_device=4096 --max_len=128 --probe_k=0  # full vs LoRA

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

Sizes are the size table's (config/builders.py) or the pretrained shapes below (NLLB-200's
distilled 600M and 1.3B, as transformers' configs give them). --lora_ranks compiles each also as
a LoRA fine-tuning step (training/lora.py: adapters of that rank on --lora_targets, the frozen
weights without Adam moments; 0 = every parameter trained).

For each size and dtype the step is compiled with 1 micro-batch and with --probe_k micro-batches
(0: only the first);
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
from flaxformer_nmt.training import lora, loss_scale, optim, steps

flags.DEFINE_list("sizes", ["base"], "Model sizes from the size table.")
flags.DEFINE_list("dtypes", ["bfloat16"], "Matrix-product dtypes: bfloat16, float16, float32.")
flags.DEFINE_integer("tokens_per_device", 25_000, "Target tokens per device per update.")
flags.DEFINE_integer("max_len", 256, "Row length of the packed batch.")
flags.DEFINE_integer("vocab_size", 37_000, "Shared vocabulary size.")
flags.DEFINE_bool("remat", False, "Rematerialise each layer (model.remat).")
flags.DEFINE_integer(
  "loss_block_tokens", 0, "Output layer and loss in blocks of this many positions (0 = whole)."
)
flags.DEFINE_integer("probe_k", 8, "The second compilation's accumulate_steps.")
flags.DEFINE_list("capacities_gb", ["16", "40", "80"], "Device memories to fit (GiB).")
flags.DEFINE_string("target", "host", "host, or tpu:<generation> (v4, v5e, v5p, v6e).")
flags.DEFINE_list("lora_ranks", ["0"], "0: full fine-tuning; r > 0: LoRA adapters of rank r.")
flags.DEFINE_string("lora_targets", "q,k,v,o", "config.optim.lora_targets of the LoRA steps.")
FLAGS = flags.FLAGS

GIB = 2**30
# Pretrained models' shapes on our fields (transformers' M2M100Config of facebook/nllb-200-
# distilled-600M and -1.3B: pre-LN, biased projections, d_model 1024, 16 heads).
PRETRAINED = {
  "nllb-600m": dict(num_layers=12, d_model=1024, d_ff=4096, num_heads=16),
  "nllb-1.3b": dict(num_layers=24, d_model=1024, d_ff=8192, num_heads=16),
}
_M2M100_FIELDS = dict(pre_ln=True, attention_bias=True, layer_norm_epsilon=1e-5, dropout_rate=0.1)


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


def compile_step(
  size: str, dtype: str, k: int, device: jax.Device, lora_rank: int = 0
) -> dict[str, float]:
  """Memory of one device's train step with k micro-batches; sizes in GiB."""
  c = config_lib.base_config(size if size not in PRETRAINED else "base")
  if size in PRETRAINED:
    c.model.update(size=size, **PRETRAINED[size], **_M2M100_FIELDS)
  c.model.dtype, c.model.remat, c.model.max_len = dtype, FLAGS.remat, FLAGS.max_len
  c.model.loss_block_tokens = FLAGS.loss_block_tokens
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
  targets = lora.parse_targets(FLAGS.lora_targets)

  def make_state(p):
    adapters = lora.init(p, lora_rank, targets, jax.random.PRNGKey(2)) if lora_rank else None
    return steps.create_train_state(p, tx, jax.random.PRNGKey(1), scale, adapters)

  state = jax.eval_shape(make_state, params)
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
      lora_scale=2.0,  # any: the program's shapes do not depend on it
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
    "parameters": sum(x.size for x in jax.tree.leaves(params)),
    "trained_parameters": sum(x.size for x in jax.tree.leaves(steps.trainable(state))),
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


def _row(size: str, dtype: str, rank: int, device: jax.Device) -> dict[str, object]:
  """One size, dtype and way of training: compiled at 1 and --probe_k micro-batches."""
  one = compile_step(size, dtype, 1, device, rank)
  row: dict[str, object] = {"size": size, "dtype": dtype, "remat": FLAGS.remat, "lora_rank": rank}
  row["loss_block_tokens"] = FLAGS.loss_block_tokens
  row["k1"] = one
  how = f"{size} {dtype}{' remat' if FLAGS.remat else ''}{f' LoRA r{rank}' if rank else ''}"
  how += f" loss blocks of {FLAGS.loss_block_tokens}" if FLAGS.loss_block_tokens else ""
  line = f"{how}: {one['total_gib']:.2f} GiB at {one['tokens_per_micro_batch']} tokens"
  if FLAGS.probe_k:
    probe = compile_step(size, dtype, FLAGS.probe_k, device, rank)
    fits = {f"k_for_{gb}gb": fitting_k(one, probe, float(gb)) for gb in FLAGS.capacities_gb}
    row.update({f"k{FLAGS.probe_k}": probe, **fits})
    line += f", {probe['total_gib']:.2f} GiB at {probe['tokens_per_micro_batch']}; "
    line += "accumulate_steps " + ", ".join(f"{v} for {k[6:]}" for k, v in fits.items())
  logging.info("%s", row)
  print(line, flush=True)
  return row


def main(argv: list[str]) -> None:
  del argv
  device = _device(FLAGS.target)
  rows = []
  for size in FLAGS.sizes:
    for dtype in FLAGS.dtypes:
      for rank in map(int, FLAGS.lora_ranks):
        rows.append(_row(size, dtype, rank, device))
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
