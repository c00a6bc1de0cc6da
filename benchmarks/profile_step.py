r"""The real train step under jax.profiler: kernel time by kind, and the kernels that cost most.

  python benchmarks/profile_step.py --size=base --dtype=bfloat16 --tokens_per_step=25000 \
    --max_len=256                                                      # one GPU, the paper's batch
  python benchmarks/profile_step.py --size=tiny --tokens_per_step=1024 --max_len=32   # any CPU

The step is train_step.py's (the same builder, flags and batches). It is compiled once; that
executable runs the warm-up steps, then `--profile_steps` steps under
`jax.profiler.trace(create_perfetto_trace=True)` (after as many unprofiled, timed for comparison:
`step_s` beside `step_s_profiled`), and its HLO text names the kernels the trace
shows (flaxformer_nmt/benchmarking/kernels.py): each kernel's kind (matrix product, fused
attention, element-wise, reduction, random bits, copy, collective), its time per step, and the JAX
operation it came from. `--compiler_option=xla_...=value` profiles the step compiled with an XLA
option, as ab_step.py's variants are.

The record keeps the breakdown by kind and the `--top` kernels; `--trace_dir` keeps the trace
itself (for Perfetto: ui.perfetto.dev opens the .trace.json.gz). Kernel time is the sum of the
kernels' durations: on a GPU it is close to the step's wall time when the step is device-bound;
on a CPU, XLA runs some thunks in parallel and the sum can exceed it. Last line: JSON
(benchmarks/results/<--record>.json, default profile_step).
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import jax
import train_step
from absl import app, flags

from flaxformer_nmt.benchmarking import kernels, record

flags.DEFINE_integer("profile_steps", 3, "Steps under the profiler (after --warmup_steps).")
flags.DEFINE_integer("warmup_steps", 2, "Steps before the profiled ones (the first compiles).")
flags.DEFINE_integer("top", 15, "Kernels named in the record, the costliest first.")
flags.DEFINE_string("trace_dir", "", "Where the trace is kept ('' = a temporary folder).")
flags.DEFINE_multi_string(
  "compiler_option", [], "xla_...=value: an XLA option for this step's compile (ab_step.py's)."
)
FLAGS = flags.FLAGS


def _options() -> dict[str, Any]:
  options = {}
  for text in FLAGS.compiler_option:
    key, eq, value = text.partition("=")
    if not eq or not key.startswith("xla_"):
      raise app.UsageError(f"--compiler_option={text!r}: expected xla_<option>=<value>.")
    options[key] = train_step.parse_value(value) if value else ""
  return options


def main(argv: list[str]) -> None:
  del argv
  options = _options()
  b = train_step.build_step(
    train_step.config_for_flags(),
    FLAGS.vocab_size,
    FLAGS.tokens_per_step,
    FLAGS.max_len,
    FLAGS.accumulate_steps,
    batches=2,
  )
  start = time.perf_counter()
  # XLA also dumps the optimized module: on the H200 (2026-11-28) compiled.as_text() named none
  # of the kernels, so the dump is the second source of names (whichever names more is used).
  # (compile_s includes writing it.) A --compiler_option=xla_dump_to=DIR of the user's is kept.
  with tempfile.TemporaryDirectory(prefix="profile_step-hlo-") as own_dump:
    dump = {"xla_dump_to": own_dump, "xla_dump_hlo_as_text": True}
    compiled = b.p_step.lower(b.state, b.batches[0]).compile(compiler_options={**dump, **options})
    compile_s = time.perf_counter() - start
    dumped = kernels.hlo_index(
      kernels.dumped_module_text(str(options.get("xla_dump_to", own_dump)))
    )
  hlo = kernels.hlo_index(compiled.as_text() or "")
  state = b.state
  for i in range(FLAGS.warmup_steps):
    state, metrics = compiled(state, b.batches[i % 2])
  jax.block_until_ready(state)
  start = time.perf_counter()  # the same steps unprofiled: what the profiler itself costs
  for i in range(FLAGS.profile_steps):
    state, metrics = compiled(state, b.batches[i % 2])
  jax.block_until_ready(metrics)
  unprofiled = (time.perf_counter() - start) / FLAGS.profile_steps
  trace_dir = FLAGS.trace_dir or tempfile.mkdtemp(prefix="profile_step-")
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    start = time.perf_counter()
    for i in range(FLAGS.profile_steps):
      state, metrics = compiled(state, b.batches[i % 2])
    jax.block_until_ready(metrics)
    seconds = (time.perf_counter() - start) / FLAGS.profile_steps
  path = kernels.find_trace(trace_dir)
  trace = kernels.read_trace(path)
  events = kernels.kernel_events(trace, hlo)
  hlo_source = "as_text"
  from_dump = kernels.kernel_events(trace, dumped)  # events found by name too, off the streams
  if kernels.found_fraction(from_dump, dumped) > kernels.found_fraction(events, hlo):
    hlo, hlo_source, events = dumped, "xla_dump_to", from_dump
  if not events:
    raise SystemExit(f"profile_step.py: no kernel found in {path}: cannot break the step down.")
  summary = kernels.summarize(events, hlo, FLAGS.profile_steps, FLAGS.top)
  # How much kernel time the HLO text names: on the H200 (2026-11-28) no kernel was found in it
  # (fusion_3502 and the like had no op_name), which this records for the next GPU run to fix.
  unnamed = sorted({key for _, _, key in events if key not in hlo})
  hlo_match = {
    "hlo_source": hlo_source,
    "hlo_instructions": len(hlo),
    "kernel_time_found_in_hlo": round(kernels.found_fraction(events, hlo), 4),
    "unfound_examples": unnamed[:8],
    "hlo_fusion_examples": sorted(k for k in hlo if k.startswith("fusion"))[:8],
  }
  tokens = b.rows * FLAGS.max_len
  n_dev = jax.local_device_count()
  flops = train_step.step_flops(b.cfg, FLAGS.vocab_size, tokens, FLAGS.max_len, n_dev)
  for kind, fraction in summary["by_kind_fraction"].items():
    print(f"{kind:12s} {summary['by_kind_ms_per_step'][kind]:10.3f} ms/step  {fraction:6.1%}")
  for k in summary["top"][:5]:
    print(f"{k['ms_per_step']:9.3f} ms  {k['kind']:11s} {k['kernel']}  {k['op_name'][-90:]}")
  record.report(
    {
      **train_step.describe(b, FLAGS.max_len),
      "compiler_options": options,
      "compile_s": round(compile_s, 1),
      "profiled_steps": FLAGS.profile_steps,
      "step_s": round(unprofiled, 5),
      "step_s_profiled": round(seconds, 5),
      "analytic_gflop_per_step_per_device": round(flops / 1e9, 2),
      "trace": path if FLAGS.trace_dir else None,
      **summary,
      "hlo_match": hlo_match,
    }
  )


if __name__ == "__main__":
  app.run(main)
