r"""Train-step throughput and memory for a model size at a fixed token budget per step.

  python benchmarks/train_step.py --size=base --dtype=bfloat16 --target=tpu:v5p   # TPU estimate
  python benchmarks/train_step.py --size=base
  python benchmarks/train_step.py --size=base --steps=3 --remat      # peak host memory with remat
  python benchmarks/train_step.py --size=tiny --tokens_per_step=4096 --steps=20
  python benchmarks/train_step.py --size=base --dtype=bfloat16 --accumulate_steps=4

Times the real pmapped train step (steps.train_step over all local devices) on a packed random
batch of `tokens_per_step` target tokens (and as many source tokens), after a compile warm-up.

MFU: the step's FLOPs are counted analytically (flaxformer_nmt/benchmarking/flops.py: every matrix
product, backward = 2x forward) and checked against XLA's cost analysis of the compiled step
(reported as `xla_to_analytic_flops`; XLA also counts element-wise work, so it comes out a little
higher). The peak is *measured in the same process*: the best of several large square matrix
products in the step's dtype (float32 on CPUs, bfloat16 on accelerators), so `mfu` says how much of
what this machine actually delivers the step uses. `mfu_nominal` divides by the vendor's dense bf16
peak where the device is known (or --peak_tflops).

Memory: XLA's compiled memory analysis of the step (per device) and, on Linux, the process's peak
resident memory while the timed steps ran (the high-water mark is reset after the warm-up, so
compilation does not count). Last line: JSON.

`--target=tpu:v4|v5e|v5p|v6e` runs nothing: it compiles the step for one chip of that TPU (libtpu:
`pip install "jax[tpu]==<jax version>"`, no TPU needed) and reports the TPU compiler's own time
estimate (`est_step_ms`, `est_tokens_per_s`, `est_mfu` = analytic FLOPs / (estimate x the chip's
bf16 peak)), with the step broken into separately compiled pieces (benchmarks/step_estimate.py;
`--nopieces` for the step alone). Defaults there: 25,000 target tokens per chip in rows of 256.
"""

from __future__ import annotations

import ast
import json
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import step_estimate
from absl import app, flags

from flaxformer_nmt.benchmarking import flops as flop_count
from flaxformer_nmt.benchmarking import record
from flaxformer_nmt.benchmarking import tpu_estimate as te
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.model.transformer import (
  Transformer,
  TransformerConfig,
  count_params,
  init_params,
)
from flaxformer_nmt.runtime import parallel
from flaxformer_nmt.training import loss_scale, optim, steps

flags.DEFINE_enum("size", "base", sorted(config_lib.SIZES), "Model size from the size table.")
flags.DEFINE_integer("tokens_per_step", 4096, "Target (and source) tokens per global step.")
flags.DEFINE_integer("max_len", 64, "Row length of the packed batch.")
flags.DEFINE_integer("vocab_size", 37_000, "Shared vocabulary size.")
flags.DEFINE_integer("steps", 10, "Timed steps (after one warm-up step).")
flags.DEFINE_enum(
  "dtype",
  "auto",
  ["auto", "float32", "bfloat16", "float16"],
  "Matrix-product dtype (auto: bfloat16 on TPUs and Ampere+ GPUs, float16 on older GPUs, float32 "
  "on CPUs). float16 steps carry the dynamic loss scale, as training does.",
)
flags.DEFINE_bool("remat", False, "Rematerialise each layer in the backward pass (model.remat).")
flags.DEFINE_integer("accumulate_steps", 1, "Micro-batches per step (optim.accumulate_steps).")
flags.DEFINE_float(
  "peak_tflops", 0.0, "Nominal device peak TFLOP/s for mfu_nominal (0 = look up, else none)."
)
flags.DEFINE_integer("peak_n", 2048, "Side of the square matrix product that measures the peak.")
flags.DEFINE_integer("dropout_percent", -1, "Override the size's dropout (percent; -1 = keep).")
flags.DEFINE_string("target", "host", "host (run it here), or tpu:<chip> (compile and estimate).")
flags.DEFINE_bool("pieces", True, "With a TPU target: estimate the step's parts too.")
flags.DEFINE_string("hlo_dir", "", "With a TPU target: write each piece's compiled HLO here.")
flags.DEFINE_multi_string(
  "set", [], "Config overrides, e.g. model.dropout_rng=rbg or optim.ema_decay=0.999."
)
FLAGS = flags.FLAGS

# Dense bf16 peaks (TFLOP/s per device) for MFU; CPUs have no meaningful single figure.
_PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "TPU v4": 275.0, "TPU v5p": 459.0}


def _peak_tflops() -> float | None:
  if FLAGS.peak_tflops:
    return FLAGS.peak_tflops
  kind = jax.devices()[0].device_kind
  return next((v for k, v in _PEAKS.items() if k in kind), None)


def measured_peak_tflops(dtype: jnp.dtype, n: int, repeats: int = 5) -> float:
  """Best TFLOP/s of an n x n x n matrix product in `dtype` on the first device.

  A chain of 8 products per call amortises dispatch; the best of `repeats` calls is the machine's
  practical matrix peak, the yardstick the step is measured against.
  """
  device = jax.devices()[0]
  a = jax.device_put(jnp.ones((n, n), dtype) / n, device)
  b = jax.device_put(jnp.eye(n, dtype=dtype), device)

  @jax.jit
  def chain(x: jax.Array, w: jax.Array) -> jax.Array:
    for _ in range(8):
      x = jnp.dot(x, w, preferred_element_type=jnp.float32).astype(dtype)
    return x

  jax.block_until_ready(chain(a, b))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(chain(a, b))
    best = min(best, time.perf_counter() - start)
  return 8 * 2.0 * n**3 / best / 1e12


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


RESULT_EXTRAS: dict[
  str, Any
] = {}  # added to the last JSON line (estimate_variants.py: the variant)


def estimate_main() -> None:
  """--target=tpu:<chip>: the compiler's estimate of the step and its pieces (nothing runs)."""
  try:
    chip = te.chip(FLAGS.target)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  tokens = FLAGS.tokens_per_step if FLAGS["tokens_per_step"].present else 25_000
  max_len = FLAGS.max_len if FLAGS["max_len"].present else 256
  c = config_lib.base_config(FLAGS.size)
  c.model.dtype, c.model.remat, c.model.max_len = FLAGS.dtype, FLAGS.remat, max_len
  if FLAGS.dtype == "auto":
    c.model.dtype = "bfloat16"  # what "auto" is on every TPU
  if FLAGS.dropout_percent >= 0:
    c.model.dropout_rate = FLAGS.dropout_percent / 100
  apply_overrides(c)
  cfg = TransformerConfig.from_config(c.model, FLAGS.vocab_size)
  rows = max(tokens // max_len, 1)
  if FLAGS.hlo_dir:
    os.makedirs(FLAGS.hlo_dir, exist_ok=True)
    step_estimate.HLO_DIR[:] = [FLAGS.hlo_dir]
  try:
    results = step_estimate.estimate_step(c, cfg, rows, max_len, chip, FLAGS.pieces)
  except te.NoTpuCompiler as e:
    raise SystemExit(f"--target={FLAGS.target}: {e}") from e
  for name, r in results.items():
    print(name, json.dumps(r), flush=True)
  out = {
    "target": FLAGS.target,
    "size": FLAGS.size,
    "dtype": c.model.dtype,
    "dropout_rng": cfg.dropout_rng,
    "remat": cfg.remat,
    "overrides": FLAGS.set,
    "rows": rows,
    "max_len": max_len,
    "target_tokens_per_step": rows * max_len,
    "vocab_size": FLAGS.vocab_size,
    **step_estimate.summary(results, rows * max_len),
    "dominant": step_estimate.dominant(results) if FLAGS.pieces else None,
    # Each piece's estimate, MFU, roofline, traffic and custom calls (docs/performance.md).
    "pieces": results,
    "step": results["step"],
    **RESULT_EXTRAS,
  }
  record.report(out)


def apply_overrides(c: Any, overrides: list[str] | None = None) -> None:
  """--set=path=value onto the config (a value starting with a letter is a string)."""
  for override in FLAGS.set if overrides is None else overrides:
    path, _, text = override.partition("=")
    config_lib.set_field(c, path, parse_value(text))


def parse_value(text: str) -> Any:
  """A --set value: a Python literal (`true`/`false` too, as JSON and absl write them), else the
  string itself (`jax`, `FUSION,CUBLAS`)."""
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  try:
    return ast.literal_eval(text) if text[:1] not in "abcdefghijklmnopqrstuvwxyz" else text
  except (ValueError, SyntaxError):
    return text


class Step(NamedTuple):
  """One size's real pmapped train step, its replicated state and packed batches, ready to time."""

  p_step: Any  # jax.pmap(steps.train_step), the state donated
  state: Any  # replicated TrainState
  batches: list[Any]  # sharded host batches, [devices, rows / devices, max_len] each
  cfg: TransformerConfig
  params: Any  # the unreplicated initial parameters
  rows: int
  accumulate_steps: int


def build_step(
  c: Any, vocab_size: int, tokens_per_step: int, max_len: int, accumulate_steps: int, batches: int
) -> Step:
  """The step as training builds it (optim, loss scale, pmap over every local device), on
  `batches` packed random batches of about `tokens_per_step` target tokens; also used by
  ab_step.py and profile_step.py, so all three time the same program."""
  cfg = TransformerConfig.from_config(c.model, vocab_size, auto_dtype=parallel.auto_dtype())
  model = Transformer(cfg)
  tx, schedule = optim.make_optimizer(c.optim, cfg.d_model)
  n_dev = jax.local_device_count()
  k = accumulate_steps
  rows = max(tokens_per_step // max_len // (n_dev * k), 1) * n_dev * k
  params = jax.jit(lambda r: init_params(cfg, r))(jax.random.PRNGKey(0))
  scale = loss_scale.initial(c.optim) if cfg.dtype == jnp.float16 else None
  state = parallel.replicate(
    jax.device_get(steps.create_train_state(params, tx, jax.random.PRNGKey(1), scale))
  )
  p_step = parallel.pmap_train_step(
    steps.train_step,
    model=model,
    tx=tx,
    schedule=schedule,
    label_smoothing=c.label_smoothing,
    accumulate_steps=k,
  )
  host = [parallel.shard(_batch(rows, max_len, vocab_size, s), n_dev) for s in range(batches)]
  return Step(p_step, state, host, cfg, params, rows, k)


def step_flops(
  cfg: TransformerConfig, vocab_size: int, tokens: int, max_len: int, n_dev: int
) -> float:
  """The step's analytic FLOPs per device, like XLA's figure: each device runs rows / n_dev rows."""
  return flop_count.train_step_flops(
    num_layers=cfg.num_layers,
    d_model=cfg.d_model,
    d_ff=cfg.d_ff,
    vocab_size=vocab_size,
    src_tokens=tokens // n_dev,
    tgt_tokens=tokens // n_dev,
    row_len=max_len,
    d_qk=cfg.num_heads * cfg.d_k,
  )


def describe(b: Step, max_len: int) -> dict[str, Any]:
  """What every record of a built step starts with: the model, the machine, the batch."""
  return {
    "size": FLAGS.size,
    "device_kind": jax.devices()[0].device_kind,
    "devices": jax.local_device_count(),
    "dtype": np.dtype(b.cfg.dtype).name,
    "overrides": FLAGS.set,
    "rows": b.rows,
    "max_len": max_len,
    "target_tokens_per_step": b.rows * max_len,
  }


def config_for_flags() -> Any:
  """The size's config with --dtype, --remat, --dropout_percent and --set applied."""
  c = config_lib.base_config(FLAGS.size)
  c.model.dtype, c.model.remat = FLAGS.dtype, FLAGS.remat
  if FLAGS.dropout_percent >= 0:
    c.model.dropout_rate = FLAGS.dropout_percent / 100
  apply_overrides(c)  # e.g. optim.ema_decay=0.999: what the parameter average costs a step
  return c


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.target != "host":
    estimate_main()
    return
  b = build_step(
    config_for_flags(),
    FLAGS.vocab_size,
    FLAGS.tokens_per_step,
    FLAGS.max_len,
    FLAGS.accumulate_steps,
    batches=2,
  )
  p_step, state, batches, cfg, params, rows, k = b
  n_dev = jax.local_device_count()

  start = time.perf_counter()
  state, metrics = p_step(state, batches[0])
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - start
  xla_flops = memory = None
  try:
    compiled = p_step.lower(state, batches[0]).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    # Per device. XLA counts a loop body once, whatever its trip count, so with micro-batches
    # (a scan) the figure would be about 1/k of the step's: not reported then.
    xla_flops = (float(cost.get("flops", 0.0)) or None) if k == 1 else None
    memory = compiled.memory_analysis()
  except Exception:  # cost and memory analysis are best effort: not every backend reports them
    pass
  tokens = rows * FLAGS.max_len
  flops = step_flops(cfg, FLAGS.vocab_size, tokens, FLAGS.max_len, n_dev)

  rss_reset = _reset_peak_rss()
  start = time.perf_counter()
  for i in range(FLAGS.steps):
    state, metrics = p_step(state, batches[i % 2])
  jax.block_until_ready(metrics)
  seconds = (time.perf_counter() - start) / FLAGS.steps
  peak_rss = _peak_rss_gib() if rss_reset else None
  peak = measured_peak_tflops(cfg.dtype, FLAGS.peak_n)
  result = {
    "size": FLAGS.size,
    "params": count_params(params),
    "devices": n_dev,
    "device_kind": jax.devices()[0].device_kind,
    "dtype": np.dtype(cfg.dtype).name,
    "dropout_rate": cfg.dropout_rate,
    "remat": FLAGS.remat,
    "accumulate_steps": k,
    "overrides": FLAGS.set,
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
  achieved = flops / seconds / 1e12
  result["analytic_gflop_per_step_per_device"] = round(flops / 1e9, 2)
  if xla_flops:
    result["xla_to_analytic_flops"] = round(xla_flops / flops, 3)
  result["tflops_per_s_per_device"] = round(achieved, 4)
  result["measured_peak_tflops"] = round(peak, 4)
  result["mfu"] = round(achieved / peak, 4)
  nominal = _peak_tflops()
  result["mfu_nominal"] = round(achieved / nominal, 4) if nominal else None
  record.report({**result, **RESULT_EXTRAS})


if __name__ == "__main__":
  app.run(main)
