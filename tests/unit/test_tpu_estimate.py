"""tpu_estimate: what the TPU cost model cannot price is found and taken out, on HLO text of the
shape libtpu prints (the real compilations need libtpu: benchmarks/train_step.py --target=tpu:v5p,
whose figures are in docs/performance.md)."""

from __future__ import annotations

import pytest

from flaxformer_nmt.benchmarking import tpu_estimate as te

# Shaped as a TPU-compiled module's text: a fusion body holding one custom call, and an entry
# computation with two custom calls outside fusions (as v5e's ConcatBitcast).
HLO = """HloModule jit_step, entry_computation_layout={(f32[4]{0})->f32[512,512]{1,0}}

%fused_computation.1 (param_0.1: s32[97,256]) -> s32[97,256] {
  %param_0.1 = s32[97,256]{1,0:T(8,128)} parameter(0)
  ROOT %custom-call.9 = s32[97,256]{1,0:T(8,128)} custom-call(%param_0.1), custom_call_target="AssumeGatherIndicesInBound"
}

ENTRY %main.2 (p0: f32[4]) -> f32[512,512] {
  %p0 = f32[4]{0} parameter(0)
  %fusion.3 = s32[97,256]{1,0:T(8,128)} fusion(%p0), kind=kLoop, calls=%fused_computation.1
  %custom-call.1 = f32[512,512]{1,0:T(8,128)S(1)} custom-call(%p0), custom_call_target="ConcatBitcast", backend_config={}
  ROOT %custom-call.2 = bf16[512,512]{1,0:T(8,128)} custom-call(%p0), custom_call_target="ConcatBitcast"
}
"""  # noqa: E501  (HLO lines as printed)


class FakeCompiled:
  """The two methods of a compiled executable that `estimate` reads."""

  def __init__(self, text: str, optimal_seconds: float, flops: float, bytes_: float):
    self._text, self._cost = (
      text,
      {
        "optimal_seconds": optimal_seconds,
        "flops": flops,
        "bytes accessed": bytes_,
      },
    )

  def as_text(self) -> str:
    return self._text

  def cost_analysis(self):
    return [self._cost]  # some jax versions return a list of one


def test_census_separates_calls_outside_fusions_from_those_inside():
  seen = te.census(HLO)
  assert dict(seen.custom_calls_outside_fusions) == {"ConcatBitcast": 2}
  assert dict(seen.custom_calls_inside_fusions) == {"AssumeGatherIndicesInBound": 1}
  assert seen.custom_call_bytes_outside_fusions == 512 * 512 * (4 + 2)
  assert seen.while_loops == 0


def test_estimate_takes_out_the_minus_one_seconds_and_prices_the_calls_as_traffic():
  """Against figures worked out by hand from v5p's published peaks (459 dense bf16 TFLOP/s and
  2,765 GB/s of HBM per chip), not from the module's own formulas: a 50 ms program whose two
  unpriced calls (a 512 x 512 float32 and a bfloat16 result: 1,572,864 bytes, written and read
  again: 3,145,728 bytes of traffic) each entered -1 s."""
  got = te.estimate(FakeCompiled(HLO, -1.95, 4.59e12 - 2, 1.0e11 - 2), 4.59e12, te.CHIPS["v5p"])
  assert got["accounted_custom_call_ms"] == 0.001  # 3,145,728 B / 2.765e12 B/s = 1.138 us
  assert got["est_ms"] == 50.001  # 50 ms + 1.138 us, to the microsecond
  assert got["est_mfu"] == 0.2  # 4.59e12 FLOP / (50.001 ms x 459e12 FLOP/s) = 0.19999
  assert got["xla_tflop"] == 4.59  # the two -1 flop entries taken out
  assert got["roofline_ms"] == 36.166  # max(4.59e12 / 459e12 = 10 ms, 1e11 B / 2.765e12 B/s)
  assert got["why_no_estimate"] is None


def test_no_estimate_for_loops_or_a_time_that_stays_negative():
  looped = HLO.replace(
    "ROOT %custom-call.2", "%w = (s32[]) while(%t), condition=%c, body=%b\n  ROOT %custom-call.2"
  )
  assert te.estimate(FakeCompiled(looped, 0.05, 1e12, 1e9), 1e12, te.CHIPS["v4"])["est_ms"] is None
  # Three -1 s entries where the text shows two unpriced calls: the figure cannot be trusted.
  bad = te.estimate(FakeCompiled(HLO, -2.95, 1e12, 1e9), 1e12, te.CHIPS["v4"])
  assert bad["est_ms"] is None and bad["est_mfu"] is None
  assert "unpriced" in bad["why_no_estimate"]


def test_chip_names_the_choices():
  assert te.chip("tpu:v6e").peak_bf16_tflops == 918.0
  with pytest.raises(ValueError, match=r"tpu:\{v4,v5e,v5p,v6e\}"):
    te.chip("gpu:h100")
