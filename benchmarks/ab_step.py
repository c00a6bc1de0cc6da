r"""A/B of the real train step: variants compiled in one process, then timed alternately.

  python benchmarks/ab_step.py --size=base --dtype=bfloat16 --tokens_per_step=25000 \
    --max_len=256 --variant="triton_gemm_on;xla_gpu_enable_triton_gemm=True" \
    --variant="ours;model.attention=ours"

The first variant is always `baseline` (the step as configured: the package's defaults, with
model.attention=auto and, where JAX's CUDA plugin is installed, runtime/xla_flags.py's options).
Each --variant is `name;setting;setting...`, a setting either a config override
(`model.attention=jax`, a dotted path, as train_step.py's --set) or an XLA compiler option
(`xla_...=value`, passed to that variant's `compile(compiler_options=...)` only, so one process
holds every variant). A variant with no setting (`--variant=again`) is the baseline once more:
its `speedup` is the noise floor.

Why one process, alternately: two runs of a step on one accelerator minutes apart differ by a few
percent (clocks, temperature, other tenants), which is the size of the changes being judged. Here
every variant is compiled first, then the timing goes round-robin (`--rounds` rounds of
`--steps_per_round` steps of each variant), and a variant's step time is its median round.

Numerics: before timing, each variant runs the same `--loss_steps` fixed batches from the same
initial state; `max_loss_diff` is the largest |loss - baseline's loss| over those steps, and
`max_grad_norm_rel_diff` the same for the gradient norm, relative (the backward's check: the
warm-up's learning rate is tiny in those steps, so the losses alone hardly see the gradients).
A variant that changes only how XLA compiles should stay within float tolerance of the
baseline (within 1e-3 to be worth keeping); one that changes the random bits
(model.dropout_rng) is not expected to, and model.attention=jax matches only while
model.attention_dropout_rate is 0 (it has no attention dropout).

A variant whose compile fails (an option this XLA does not know, a shape cuDNN does not take) is
reported with its one-line error and the others still run. Last line: JSON (benchmarks/results/
<--record>.json, default ab_step).
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from typing import Any

import jax
import numpy as np
import train_step
from absl import app, flags

from flaxformer_nmt import errors
from flaxformer_nmt.benchmarking import record
from flaxformer_nmt.config import checks

flags.DEFINE_multi_string(
  "variant", [], "name;setting;... with settings model.x=v (config) or xla_x=v (compiler option)."
)
flags.DEFINE_integer("rounds", 5, "Round-robin rounds over the variants.")
flags.DEFINE_integer("steps_per_round", 5, "Steps of one variant per round.")
flags.DEFINE_integer("loss_steps", 20, "Fixed steps from the same state whose losses are compared.")
flags.DEFINE_float(
  "deadline_s", 0.0, "Seconds from the start: compile no variant that would not fit (0 = none)."
)
FLAGS = flags.FLAGS


def parse_variant(text: str) -> tuple[str, list[str], dict[str, Any]]:
  """`name;a.b=v;xla_c=w` -> (name, config overrides, compiler options)."""
  name, *settings = [part.strip() for part in text.split(";")]
  if not name or "=" in name:
    raise app.UsageError(f"--variant={text!r}: starts with a name, e.g. 'cmdbuf_off;xla_...=v'.")
  overrides, options = [], {}
  for setting in filter(None, settings):
    key, eq, value = setting.partition("=")
    if not eq:
      raise app.UsageError(f"--variant={text!r}: {setting!r} is not key=value.")
    if key.startswith("xla_"):
      options[key] = train_step.parse_value(value) if value else ""
    elif "." in key:
      overrides.append(setting)
    else:
      raise app.UsageError(
        f"--variant={text!r}: {key!r} is neither a config path (model.x) nor an xla_ option."
      )
  _check_overrides(text, overrides)
  return name, overrides, options


def _check_overrides(text: str, overrides: list[str]) -> None:
  """UsageError, one line, when a variant's config overrides name no field, give a value the
  field cannot take (`model.atention=jax`, `model.remat=maybe`), or together make a config
  that cannot work (validated once, all applied: d_model and num_heads may change together):
  found when the flag is parsed, not after the variants before it have compiled."""
  if not overrides:
    return
  c = train_step.config_for_flags()
  for setting in overrides:
    try:
      train_step.apply_overrides(c, [setting])
    except (errors.UserError, KeyError, TypeError, ValueError, AttributeError) as e:
      raise app.UsageError(f"--variant={text!r}: {setting!r}: {_one_line(e)}") from None
  try:
    checks.validate(c)
  except errors.UserError as e:
    raise app.UsageError(f"--variant={text!r}: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _prepare(name: str, overrides: list[str], options: dict[str, Any]) -> dict[str, Any]:
  """Builds and compiles one variant; its error instead where that fails."""
  c = train_step.config_for_flags()
  train_step.apply_overrides(c, overrides)
  out: dict[str, Any] = {"name": name, "overrides": overrides, "compiler_options": options}
  try:
    b = train_step.build_step(
      c,
      FLAGS.vocab_size,
      FLAGS.tokens_per_step,
      FLAGS.max_len,
      FLAGS.accumulate_steps,
      batches=max(FLAGS.loss_steps, 2),
    )
    start = time.perf_counter()
    compiled = b.p_step.lower(b.state, b.batches[0]).compile(compiler_options=options or None)
    out["compile_s"] = round(time.perf_counter() - start, 1)
  except Exception as e:  # noqa: BLE001 -- reported, and the other variants still run
    out["error"] = _one_line(e)
    return out
  out.update(step=compiled, build=b, state=b.state, hlo=compiled.as_text())
  return out


def _losses(v: dict[str, Any], n: int) -> tuple[list[float], list[float]]:
  """The variant's losses and gradient norms over the first n fixed batches, from its initial
  state. The gradient norms check the backward pass: in the warm-up's first steps the learning
  rate is tiny, so the losses alone barely see what a variant does to the gradients."""
  losses, norms = [], []
  for i in range(n):
    v["state"], metrics = v["step"](v["state"], v["build"].batches[i])
    m = jax.device_get(metrics)
    losses.append(float(m["loss_sum"][0]) / max(float(m["tokens"][0]), 1.0))  # psummed: [0]
    norms.append(float(m["grad_norm"][0]))
  return losses, norms


def _time_round(v: dict[str, Any], steps: int) -> float:
  """Seconds per step of `steps` steps of one variant, from its current state."""
  batches = v["build"].batches
  jax.block_until_ready(v["state"])
  start = time.perf_counter()
  for i in range(steps):
    v["state"], metrics = v["step"](v["state"], batches[i % len(batches)])
  jax.block_until_ready(metrics)
  return (time.perf_counter() - start) / steps


def _compile_all(specs: list[tuple[str, list[str], dict[str, Any]]], start: float) -> list[dict]:
  """Each variant compiled and run over the fixed batches, in order, within --deadline_s.

  A variant is built only while its build (as long as the slowest so far), the fixed steps and
  the timing rounds of every variant built by then still fit before the deadline; the rest are
  reported as not compiled. On the H200 (2026-11-28) the base variants took 21-41 s each to
  compile (4.6 and 3.7 s for two read from the compilation cache), besides building their
  state and batches, and nine of them outran a 300 s limit before any was timed: no record.
  """
  variants: list[dict[str, Any]] = []
  slowest, step_s = 0.0, 0.0
  for spec in specs:
    if variants and FLAGS.deadline_s:
      runs = FLAGS.loss_steps + FLAGS.rounds * FLAGS.steps_per_round
      need = slowest + (len(variants) + 1) * runs * step_s + 10.0
      if time.perf_counter() - start + need > FLAGS.deadline_s:
        variants.append({"name": spec[0], "overrides": spec[1], "compiler_options": spec[2]})
        variants[-1]["error"] = f"not compiled: it would not fit in --deadline_s={FLAGS.deadline_s}"
        print(spec[0], variants[-1]["error"], flush=True)
        continue
    built = time.perf_counter()
    v = _prepare(*spec)
    print(v["name"], v.get("error") or f"compiled in {v['compile_s']} s", flush=True)
    if "error" not in v:
      # The whole build (initial state, batches, tracing), not only XLA's compile: what the
      # next variant will take, unless this one came from the compilation cache.
      slowest = max(slowest, time.perf_counter() - built)
      try:
        t0 = time.perf_counter()
        v["losses"], v["grad_norms"] = _losses(v, FLAGS.loss_steps)
        step_s = max(step_s, (time.perf_counter() - t0) / max(FLAGS.loss_steps, 1))
      except Exception as e:  # noqa: BLE001 -- a variant that compiles but fails to run
        v["error"] = _one_line(e)
    variants.append(v)
    if "error" in variants[0]:
      raise SystemExit(f"ab_step.py: the baseline did not compile or run: {variants[0]['error']}")
  return variants


def main(argv: list[str]) -> None:
  del argv
  specs = [("baseline", [], {})] + [parse_variant(t) for t in FLAGS.variant]
  names = [s[0] for s in specs]
  if len(set(names)) != len(names):
    raise app.UsageError(f"--variant: names must differ, got {names}.")
  variants = _compile_all(specs, time.perf_counter())
  live = [v for v in variants if "error" not in v]
  base_losses = np.asarray(variants[0]["losses"])
  for v in live:
    v["max_loss_diff"] = float(np.max(np.abs(np.asarray(v["losses"]) - base_losses)))
    base_norms = np.asarray(variants[0]["grad_norms"])
    v["max_grad_norm_rel_diff"] = float(
      np.max(np.abs(np.asarray(v["grad_norms"]) - base_norms) / np.maximum(base_norms, 1e-12))
    )
    v["times"] = []
  for _ in range(FLAGS.rounds):
    for v in live:
      v["times"].append(_time_round(v, FLAGS.steps_per_round))
  b0 = variants[0]["build"]
  tokens = b0.rows * FLAGS.max_len
  n_dev = jax.local_device_count()
  flops = train_step.step_flops(b0.cfg, FLAGS.vocab_size, tokens, FLAGS.max_len, n_dev)
  base_s = statistics.median(variants[0]["times"])
  rows = []
  for v in variants:
    row = {k: copy.deepcopy(v[k]) for k in ("name", "overrides", "compiler_options")}
    if "error" in v:
      row["error"] = v["error"]
    else:
      step_s = statistics.median(v["times"])
      row.update(
        compile_s=v["compile_s"],
        step_s=round(step_s, 5),
        round_step_s=[round(t, 5) for t in v["times"]],
        tokens_per_s=round(tokens / step_s, 1),
        speedup=round(base_s / step_s, 4),
        tflops_per_s_per_device=round(flops / step_s / 1e12, 4),
        max_loss_diff=round(v["max_loss_diff"], 6),
        max_grad_norm_rel_diff=round(v["max_grad_norm_rel_diff"], 6),
        # Whether XLA:GPU put any of the step into command buffers (the cmdbuf variants' check).
        hlo_has_command_buffer="command_buffer" in v["hlo"],
      )
    rows.append(row)
    print(json_line(row), flush=True)
  nominal = train_step._peak_tflops()  # pylint: disable=protected-access
  record.report(
    {
      **train_step.describe(b0, FLAGS.max_len),
      "rounds": FLAGS.rounds,
      "steps_per_round": FLAGS.steps_per_round,
      "loss_steps": FLAGS.loss_steps,
      "baseline_losses": [round(x, 6) for x in base_losses.tolist()],
      "analytic_gflop_per_step_per_device": round(flops / 1e9, 2),
      "nominal_peak_tflops": nominal,
      "mfu_nominal": {
        r["name"]: round(r["tflops_per_s_per_device"] / nominal, 4)
        for r in rows
        if nominal and "error" not in r
      },
      "variants": rows,
    }
  )


def json_line(row: dict[str, Any]) -> str:
  """A variant's row for the log, without its per-round times."""
  return json.dumps({k: v for k, v in row.items() if k != "round_step_s"})


if __name__ == "__main__":
  app.run(main)
