r"""Train-step throughput and memory for a model size at a fixed token budget per step.

  python benchmarks/train_step.py --size=base
  python benchmarks/train_step.py --size=base --steps=3 --remat      # peak host memory with remat
  python benchmarks/train_step.py --size=tiny --tokens_per_step=4096 --steps=20
  python benchmarks/train_step.py --size=base --dtype=bfloat16 --accumulate_steps=4

Times the real pmapped train step (steps.train_step over all local devices) on a packed random
batch of `tokens_per_step` target tokens (and as many source tokens), after a compile warm-up.
FLOPs per step come from XLA's cost analysis of the compiled program; MFU is reported when the
device's peak is known (or given with --peak_tflops). Memory: XLA's compiled memory analysis of
the step (per device) and, on Linux, the process's peak resident memory while the timed steps ran
(the high-water mark is reset after the warm-up, so compilation does not count). Last line: JSON.
"""

from __future__ import annotations

import json
import time

import jax
import numpy as np
from absl import app, flags

from flaxformer_nmt import config_lib, optim, parallel, steps
from flaxformer_nmt.model import Transformer, TransformerConfig, count_params, init_params

flags.DEFINE_enum("size", "base", sorted(config_lib.SIZES), "Model size from the size table.")
flags.DEFINE_integer("tokens_per_step", 4096, "Target (and source) tokens per global step.")
flags.DEFINE_integer("max_len", 64, "Row length of the packed batch.")
flags.DEFINE_integer("vocab_size", 37_000, "Shared vocabulary size.")
flags.DEFINE_integer("steps", 10, "Timed steps (after one warm-up step).")
flags.DEFINE_enum(
  "dtype",
  "auto",
  ["auto", "float32", "bfloat16"],
  "Matrix-product dtype (auto: bfloat16 on TPUs and Ampere+ GPUs, else float32).",
)
flags.DEFINE_bool("remat", False, "Rematerialise each layer in the backward pass (model.remat).")
flags.DEFINE_integer("accumulate_steps", 1, "Micro-batches per step (optim.accumulate_steps).")
flags.DEFINE_float("peak_tflops", 0.0, "Device peak TFLOP/s for MFU (0 = look up, else none).")
FLAGS = flags.FLAGS

# Dense bf16 peaks (TFLOP/s per device) for MFU; CPUs have no meaningful single figure.
_PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "TPU v4": 275.0, "TPU v5p": 459.0}


def _peak_tflops() -> float | None:
  if FLAGS.peak_tflops:
    return FLAGS.peak_tflops
  kind = jax.devices()[0].device_kind
  return next((v for k, v in _PEAKS.items() if k in kind), None)


def _reset_peak_rss() -> bool:
  """Resets this process's resident-memory high-water mark (Linux); False where unsupported."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def _peak_rss_gib() -> float | None:
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 2**20  # kB -> GiB
  except OSError:
    pass
  return None


def _batch(rows: int, length: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
  """Fully packed rows of 4 sentences each, so every token is real (what packing approaches)."""
  rs = np.random.RandomState(seed)
  seg = np.repeat(np.arange(1, 5), length // 4)[None].repeat(rows, 0).astype(np.int32)
  pos = np.tile(np.arange(length // 4), 4)[None].repeat(rows, 0).astype(np.int32)

  def ids() -> np.ndarray:
    return rs.randint(3, vocab, (rows, length)).astype(np.int32)

  return dict(
    inputs=ids(),
    targets=ids(),
    inputs_segmentation=seg,
    targets_segmentation=seg,
    inputs_position=pos,
    targets_position=pos,
  )


def main(argv: list[str]) -> None:
  del argv
  c = config_lib.base_config(FLAGS.size)
  c.model.dtype, c.model.remat = FLAGS.dtype, FLAGS.remat
  cfg = TransformerConfig.from_config(c.model, FLAGS.vocab_size, auto_dtype=parallel.auto_dtype())
  model = Transformer(cfg)
  tx, schedule = optim.make_optimizer(c.optim, cfg.d_model)
  n_dev = jax.local_device_count()
  k = FLAGS.accumulate_steps
  rows = max(FLAGS.tokens_per_step // FLAGS.max_len // (n_dev * k), 1) * n_dev * k
  params = jax.jit(lambda r: init_params(cfg, r))(jax.random.PRNGKey(0))
  state = parallel.replicate(
    jax.device_get(steps.create_train_state(params, tx, jax.random.PRNGKey(1)))
  )
  p_step = parallel.pmap_train_step(
    steps.train_step,
    model=model,
    tx=tx,
    schedule=schedule,
    label_smoothing=c.label_smoothing,
    accumulate_steps=k,
  )
  batches = [
    parallel.shard(_batch(rows, FLAGS.max_len, FLAGS.vocab_size, s), n_dev) for s in range(2)
  ]

  start = time.perf_counter()
  state, metrics = p_step(state, batches[0])
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - start
  flops = memory = None
  try:
    compiled = p_step.lower(state, batches[0]).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    # Per device. XLA counts a loop body once, whatever its trip count, so with micro-batches
    # (a scan) the figure would be about 1/k of the step's: not reported then.
    flops = (float(cost.get("flops", 0.0)) or None) if k == 1 else None
    memory = compiled.memory_analysis()
  except Exception:  # cost and memory analysis are best effort: not every backend reports them
    pass

  rss_reset = _reset_peak_rss()
  start = time.perf_counter()
  for i in range(FLAGS.steps):
    state, metrics = p_step(state, batches[i % 2])
  jax.block_until_ready(metrics)
  seconds = (time.perf_counter() - start) / FLAGS.steps
  peak_rss = _peak_rss_gib() if rss_reset else None

  tokens = rows * FLAGS.max_len
  result = {
    "size": FLAGS.size,
    "params": count_params(params),
    "devices": n_dev,
    "device_kind": jax.devices()[0].device_kind,
    "dtype": np.dtype(cfg.dtype).name,
    "remat": FLAGS.remat,
    "accumulate_steps": k,
    "rows": rows,
    "max_len": FLAGS.max_len,
    "target_tokens_per_step": tokens,
    "step_s": round(seconds, 4),
    "compile_s": round(compile_s, 1),
    "tokens_per_s": round(tokens / seconds, 1),
  }
  if peak_rss is not None:
    result["peak_host_rss_gib_during_steps"] = round(peak_rss, 3)
  if memory is not None:
    result["xla_temp_gib_per_device"] = round(memory.temp_size_in_bytes / 2**30, 3)
    result["xla_argument_gib_per_device"] = round(memory.argument_size_in_bytes / 2**30, 3)
  if flops:
    result["tflops_per_s_per_device"] = round(flops / seconds / 1e12, 4)
    peak = _peak_tflops()
    result["mfu"] = round(flops / seconds / 1e12 / peak, 4) if peak else None
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
