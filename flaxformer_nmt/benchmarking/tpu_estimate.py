"""A TPU's run time for a program, estimated by the TPU compiler itself, without a TPU.

libtpu (`pip install "jax[tpu]==<jax version>"`) compiles for a TPU topology on any machine
("deviceless" ahead-of-time compilation). The compiled executable's `cost_analysis()` then carries
`optimal_seconds`: XLA's HloCostAnalysis with the chip's own rates, i.e. per instruction the
largest of flops / flop rate, bytes / HBM bandwidth and transcendentals / rate, summed over the
program. It is an estimate of an ideal schedule, not a measurement: it has no model of collectives
over a network, counts a `while` loop's body once, and knows nothing of a custom call, which it
enters as -1 second (inside a fusion the fusion's time is clamped at 0, so there a custom call just
goes uncounted).

`estimate` keeps it honest: it lists every custom call, takes the -1 s entries of those outside
fusions back out, prices those calls separately as memory traffic (reading and writing their
result once at HBM bandwidth, said in `accounted_custom_call_ms`), refuses (returns no estimate)
when the program has loops, and puts a roofline of the same program beside it (max of its flops at
peak and its bytes at HBM bandwidth). Analytic FLOPs (benchmarking/flops.py) over the estimated
time and the chip's peak give the estimated MFU.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip: its single-chip topology name and public peak figures (per chip)."""

  generation: str
  topology: str
  peak_bf16_tflops: float  # dense bf16 matrix units
  hbm_tb_per_s: float  # HBM bandwidth


# Public figures (cloud.google.com/tpu/docs/system-architecture-tpu-vm, per chip).
CHIPS = {
  "v4": Chip("v4", "v4:1x1x1", 275.0, 1.228),
  "v5e": Chip("v5e", "v5e:1x1", 197.0, 0.819),
  "v5p": Chip("v5p", "v5p:1x1x1", 459.0, 2.765),
  "v6e": Chip("v6e", "v6e:1x1", 918.0, 1.640),
}


class NoTpuCompiler(RuntimeError):
  """libtpu is missing or cannot compile for the requested chip (one line)."""


def chip(target: str) -> Chip:
  """'tpu:v5p' -> CHIPS['v5p']; ValueError naming the choices otherwise."""
  platform, _, generation = target.partition(":")
  if platform != "tpu" or generation not in CHIPS:
    raise ValueError(f"--target={target}: use tpu:{{{','.join(CHIPS)}}}.")
  return CHIPS[generation]


def device(c: Chip) -> jax.Device:
  """A device of a one-chip topology of `c`, to compile for (nothing runs on it)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  try:
    topology = topologies.get_topology_desc(
      platform="tpu", topology_name=c.topology, chips_per_host_bounds=(1, 1, 1)
    )
  except Exception as e:  # pylint: disable=broad-except
    cause = " ".join(str(e).split())[:200]
    hint = f'; install libtpu: pip install "jax[tpu]=={jax.__version__}"'
    if "lockfile" in cause:  # another process holds libtpu (its advice, rm, would break that one)
      hint = "; another process holds libtpu: wait for it, or set ALLOW_MULTIPLE_LIBTPU_LOAD=1"
    raise NoTpuCompiler(f"cannot compile for TPU {c.generation} here ({cause}){hint}") from e
  return topology.devices[0]


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2}
_DTYPE_BYTES.update({"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8})
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_FUSION_CALL = re.compile(r"\bfusion\(.*?calls=%?([\w.\-]+)")
_CUSTOM_CALL = re.compile(r'=\s*(\S+)\s+custom-call\(.*custom_call_target="([^"]+)"')
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")


def _array_bytes(shape_text: str) -> int:
  """Bytes of an HLO result type: `f32[512,512]{1,0}` or a tuple `(f32[2], u8[0])`."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape_text):
    size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
    total += size * _DTYPE_BYTES.get(dtype, 4)
  return total


@dataclasses.dataclass
class HloCensus:
  """What of a compiled program the cost model cannot price."""

  custom_calls_outside_fusions: collections.Counter
  custom_calls_inside_fusions: collections.Counter
  custom_call_bytes_outside_fusions: int  # their results, summed
  while_loops: int


def census(hlo_text: str) -> HloCensus:
  """Custom calls (by target, outside and inside fusions) and loops of an optimised HLO module."""
  bodies: dict[str, list[str]] = {}
  name = None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      name = header.group(1)
      bodies[name] = []
    elif name is not None:
      bodies[name].append(line)
  fused = {
    m.group(1)
    for lines in bodies.values()
    for line in lines
    for m in [_FUSION_CALL.search(line)]
    if m
  }
  outside: collections.Counter = collections.Counter()
  inside: collections.Counter = collections.Counter()
  outside_bytes = loops = 0
  for comp, lines in bodies.items():
    for line in lines:
      call = _CUSTOM_CALL.search(line)
      if call:
        if comp in fused:
          inside[call.group(2)] += 1
        else:
          outside[call.group(2)] += 1
          outside_bytes += _array_bytes(call.group(1))
      if comp not in fused and re.search(r"=\s*\S+\s+while\(", line):
        loops += 1
  return HloCensus(outside, inside, outside_bytes, loops)


def estimate(compiled: Any, analytic_flops: float, c: Chip) -> dict[str, Any]:
  """The compiler's time estimate of `compiled` on chip `c`, made honest (module docstring).

  Returns est_ms (None when no honest figure exists, with `why`), est_mfu for `analytic_flops`,
  the roofline beside it, XLA's own flops and bytes, and the census of what it cannot price.
  """
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  seen = census(compiled.as_text())
  unknown = sum(seen.custom_calls_outside_fusions.values())
  xla_flops, xla_bytes = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  # An unpriceable call outside fusions entered -1 s (and -1 flop, -1 byte): take those out.
  xla_flops, xla_bytes = xla_flops + unknown, xla_bytes + unknown
  modelled_s = float(cost.get("optimal_seconds", float("nan"))) + unknown
  accounted_s = 2.0 * seen.custom_call_bytes_outside_fusions / (c.hbm_tb_per_s * 1e12)
  roofline_s = max(xla_flops / (c.peak_bf16_tflops * 1e12), xla_bytes / (c.hbm_tb_per_s * 1e12))
  why = None
  if seen.while_loops:
    why = f"{seen.while_loops} while loop(s): the cost model counts a loop body once"
  elif not modelled_s > 0:
    why = f"optimal_seconds {modelled_s - unknown:.4g} with {unknown} unpriced calls taken out"
  est_s = None if why else modelled_s + accounted_s
  return {
    "chip": c.generation,
    "est_ms": round(est_s * 1e3, 3) if est_s else None,
    "est_mfu": round(analytic_flops / (est_s * c.peak_bf16_tflops * 1e12), 4) if est_s else None,
    "why_no_estimate": why,
    "analytic_tflop": round(analytic_flops / 1e12, 4),
    "xla_tflop": round(xla_flops / 1e12, 4),
    "xla_gb_accessed": round(xla_bytes / 1e9, 3),
    "roofline_ms": round(roofline_s * 1e3, 3),
    "accounted_custom_call_ms": round(accounted_s * 1e3, 3),
    "custom_calls_outside_fusions": dict(seen.custom_calls_outside_fusions),
    "custom_calls_inside_fusions_unpriced": dict(seen.custom_calls_inside_fusions),
  }
