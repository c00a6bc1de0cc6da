"""benchmarking/kernels.py: a profiler trace's kernels named from the HLO, and summed by kind.

The HLO text and traces here are written by hand in the shapes XLA and jax.profiler give them
(XLA:GPU's fusion and cuBLAS names, a device process's stream and derived threads, XLA:CPU's
thunk events); tests/e2e/test_scripts.py profiles a real step on the CPU.
"""

from __future__ import annotations

import gzip
import json

import pytest

from flaxformer_nmt.benchmarking import kernels

HLO = """\
HloModule pmap_train_step, is_scheduled=true

%fused_add (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %add.1 = f32[8]{0} add(%param_0, %param_0), metadata={op_name="pmap(step)/encoder_0/add"}
}

%fused_dot (param_0.1: bf16[8,8], param_1.1: bf16[8,8]) -> bf16[8,8] {
  %param_0.1 = bf16[8,8]{1,0} parameter(0)
  %param_1.1 = bf16[8,8]{1,0} parameter(1)
  %dot.3 = bf16[8,8]{1,0} dot(%param_0.1, %param_1.1), lhs_contracting_dims={1}, \
rhs_contracting_dims={0}, metadata={op_name="pmap(step)/decoder_1/ffn/wi/dot_general"}
  ROOT %convert.2 = bf16[8,8]{1,0} convert(%dot.3), metadata={op_name="pmap(step)/convert"}
}

ENTRY %main.9 (a: f32[8], x: bf16[8,8]) -> (f32[8], f32[]) {
  %a = f32[8]{0} parameter(0)
  %x = bf16[8,8]{1,0} parameter(1)
  %loop_add_fusion = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused_add
  %input_reduce_fusion.2 = f32[] fusion(%loop_add_fusion), kind=kInput, calls=%fused_reduce, \
metadata={op_name="pmap(step)/losses/reduce_max"}
  %gemm_fusion_dot.4 = bf16[8,8]{1,0} fusion(%x, %x), kind=kCustom, calls=%fused_dot, \
backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %custom-call.5 = (bf16[8,8]{1,0}, s8[4]{0}) custom-call(%x, %x), \
custom_call_target="__cublas$lt$matmul", metadata={op_name="pmap(step)/_logits/dot_general"}
  %loop_xor_fusion = u32[8]{0} fusion(%a), kind=kLoop, calls=%fused_xor
  %copy.6 = f32[8]{0} copy(%loop_add_fusion)
  ROOT %tuple.7 = (f32[8]{0}, f32[]) tuple(%copy.6, %input_reduce_fusion.2)
}
"""


def _meta(pid: int, name: str, tid: int | None = None) -> dict:
  if tid is None:
    return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}
  return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def _x(pid: int, tid: int, name: str, dur: float, **args) -> dict:
  return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": 0, "dur": dur, "args": args}


def _gpu_trace(steps: int) -> dict:
  events = [
    _meta(1, "/host:CPU"),
    _meta(1, "python", 1),
    _meta(2, "/device:GPU:0"),
    _meta(2, "Stream #13(Compute)", 10),
    _meta(2, "XLA Ops", 11),  # a derived line: the same kernels again, not to be counted twice
  ]
  per_step = [
    ("loop_add_fusion", 100.0, {}),
    ("loop_add_fusion", 100.0, {}),
    ("nvjet_sm90_tst_128x256_h_bz_NNT", 300.0, {"hlo_op": "custom-call.5"}),
    ("input_reduce_fusion_2", 50.0, {}),
    ("gemm_fusion_dot_4", 200.0, {}),
    ("loop_xor_fusion", 20.0, {}),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7", 80.0, {}),
    ("copy_6", 10.0, {}),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40.0, {}),
  ]
  for _ in range(steps):
    for name, dur, args in per_step:
      events.append(_x(2, 10, name, dur, **args))
      events.append(_x(2, 11, name, dur, **args))
    events.append(_x(1, 1, "PjitFunction(pmap_train_step)", 5000.0))
  return {"traceEvents": events}


def test_the_hlo_index_names_fusions_by_their_products_and_roots():
  hlo = kernels.hlo_index(HLO)
  add = hlo["loop_add_fusion"]
  assert (add.opcode, add.fusion_kind) == ("fusion", "kLoop")
  assert add.op_name == "pmap(step)/encoder_0/add"  # the body's root: the fusion has none
  gemm = hlo[kernels.normalize("gemm_fusion_dot.4")]
  assert gemm.fusion_kind == "kCustom" and gemm.target == "__triton_gemm"
  # The product, not the convert at the body's root, names a fusion that holds one.
  assert gemm.op_name == "pmap(step)/decoder_1/ffn/wi/dot_general"
  cublas = hlo[kernels.normalize("custom-call.5")]
  assert (cublas.opcode, cublas.target) == ("custom-call", "__cublas$lt$matmul")
  assert hlo["input_reduce_fusion_2"].op_name == "pmap(step)/losses/reduce_max"
  assert hlo["copy_6"].opcode == "copy" and hlo["copy_6"].op_name == ""


@pytest.mark.parametrize(
  "kernel, key, kind",
  [
    ("loop_add_fusion", "loop_add_fusion", "elementwise"),
    ("nvjet_sm90_tst_128x256_h_bz_NNT", "custom_call_5", "matmul"),
    ("gemm_fusion_dot_4", "gemm_fusion_dot_4", "matmul"),
    ("input_reduce_fusion_2", "input_reduce_fusion_2", "reduction"),
    ("loop_xor_fusion", "loop_xor_fusion", "rng"),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7", "", "attention"),
    ("copy_6", "copy_6", "copy"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "", "collective"),
    ("ynn_fusion.3", "", "matmul"),  # XLA:CPU's dot fusions
    ("redzone_checker", "", "other"),
  ],
)
def test_each_kernel_gets_its_kind(kernel, key, kind):
  hlo = kernels.hlo_index(HLO)
  assert kernels.kind_of(kernel, hlo.get(key)) == kind


def test_random_bits_fused_into_a_loop_are_found_by_their_operation():
  hlo = kernels.hlo_index(
    HLO.replace(
      "%loop_xor_fusion = u32[8]{0} fusion(%a), kind=kLoop, calls=%fused_xor",
      "%loop_add_fusion.9 = u32[8]{0} fusion(%a), kind=kLoop, calls=%fused_xor, "
      'metadata={op_name="pmap(step)/dropout/threefry2x32"}',
    )
  )
  assert kernels.kind_of("loop_add_fusion_9", hlo["loop_add_fusion_9"]) == "rng"
  assert kernels.kind_of("loop_add_fusion", hlo["loop_add_fusion"]) == "elementwise"


def test_one_library_kernel_name_for_two_products_stays_two_entries():
  """cuBLAS runs many products under one kernel name: each is its own entry, by instruction."""
  hlo = kernels.hlo_index(HLO)
  events = [
    ("nvjet_sm90_tst", 300.0, "custom_call_5"),
    ("nvjet_sm90_tst", 100.0, "gemm_fusion_dot_4"),
  ]
  top = kernels.summarize(events, hlo, steps=1)["top"]
  assert [(t["hlo"], t["ms_per_step"]) for t in top] == [
    ("custom-call.5", 0.3),
    ("gemm_fusion_dot.4", 0.1),
  ]
  assert top[1]["op_name"] == "pmap(step)/decoder_1/ffn/wi/dot_general"


def test_an_instruction_is_named_by_its_costliest_kernel_not_its_first():
  """On the H200 each cuBLAS and cuDNN call came with a "Memset" first, and the record named every
  product and attention "Memset 3" (profile_step_h200_base_cudnn.json)."""
  hlo = kernels.hlo_index(HLO)
  events = [
    ("Memset 3", 1.0, "custom_call_5"),
    ("nvjet_sm90_tst", 300.0, "custom_call_5"),
    ("Memset 3", 1.0, "custom_call_5"),
    ("nvjet_sm90_tst", 300.0, "custom_call_5"),
  ]
  (top,) = kernels.summarize(events, hlo, steps=2)["top"]
  assert (top["kernel"], top["hlo"], top["ms_per_step"]) == (
    "nvjet_sm90_tst",
    "custom-call.5",
    0.301,
  )
  assert top["kind"] == "matmul"
  assert top["calls_per_step"] == 2.0  # kernels launched, the helpers counted


def test_a_gpu_trace_counts_stream_kernels_once_per_step(tmp_path):
  steps = 3
  path = tmp_path / "plugins" / "profile" / "run" / "host.trace.json.gz"
  path.parent.mkdir(parents=True)
  with gzip.open(path, "wt", encoding="utf-8") as f:
    json.dump(_gpu_trace(steps), f)
  assert kernels.find_trace(str(tmp_path)) == str(path)
  hlo = kernels.hlo_index(HLO)
  events = kernels.kernel_events(kernels.read_trace(str(path)), hlo)
  assert len(events) == 9 * steps  # the stream's kernels; not the derived line, not the host
  summary = kernels.summarize(events, hlo, steps, top=3)
  assert summary["kernel_ms_per_step"] == pytest.approx(0.9)
  assert summary["kernels_per_step"] == 9
  assert summary["by_kind_ms_per_step"] == {
    "matmul": 0.5,
    "attention": 0.08,
    "elementwise": 0.2,
    "reduction": 0.05,
    "rng": 0.02,
    "copy": 0.01,
    "collective": 0.04,
  }
  assert sum(summary["by_kind_fraction"].values()) == pytest.approx(1.0, abs=1e-3)
  top = summary["top"]
  assert [t["kernel"] for t in top] == [
    "nvjet_sm90_tst_128x256_h_bz_NNT",
    "loop_add_fusion",
    "gemm_fusion_dot_4",
  ]
  # cuBLAS's kernel is named by the instruction its event points at (args.hlo_op).
  assert top[0]["op_name"] == "pmap(step)/_logits/dot_general" and top[0]["hlo"] == "custom-call.5"
  assert top[1]["calls_per_step"] == 2 and top[1]["ms_per_step"] == pytest.approx(0.2)
  assert top[1]["fraction"] == pytest.approx(0.2 / 0.9, abs=1e-4)


def test_a_cpu_trace_counts_the_thunks_that_name_instructions():
  trace = {
    "traceEvents": [
      _meta(7, "/host:CPU"),
      _meta(7, "tf_XLAPjRtCpuClient/123", 2),
      _meta(7, "python", 3),
      _x(7, 2, "loop_add_fusion", 30.0),
      _x(7, 2, "end: loop_add_fusion", 1.0),
      _x(7, 2, "ThreadpoolListener::Record", 2.0),
      _x(7, 2, "copy.6", 4.0),
      _x(7, 3, "PjitFunction(step)", 100.0),
    ]
  }
  hlo = kernels.hlo_index(HLO)
  events = kernels.kernel_events(trace, hlo)
  assert [(name, us) for name, us, _ in events] == [("loop_add_fusion", 30.0), ("copy.6", 4.0)]
  summary = kernels.summarize(events, hlo, steps=1)
  assert summary["by_kind_fraction"] == {
    "elementwise": pytest.approx(30 / 34, abs=1e-4),
    "copy": pytest.approx(4 / 34, abs=1e-4),
  }


def test_libtpus_megascale_track_does_not_hide_a_cpu_traces_thunks():
  """Where libtpu is installed, a CPU trace also holds a "/device:CUSTOM:Megascale Trace"
  process: counted as a device, it left no kernel and profile_step.py stopped (2026-11-28)."""
  trace = {
    "traceEvents": [
      _meta(1, "/device:CUSTOM:Megascale Trace"),
      _meta(7, "/host:CPU"),
      _meta(7, "tf_XLAPjRtCpuClient/123", 2),
      _x(7, 2, "loop_add_fusion", 30.0),
    ]
  }
  events = kernels.kernel_events(trace, kernels.hlo_index(HLO))
  assert [(name, us) for name, us, _ in events] == [("loop_add_fusion", 30.0)]


def test_device_threads_not_named_streams_count_the_events_that_name_instructions():
  """Should a profiler name its stream threads otherwise, a device's kernels are still found: those
  named after an instruction of the program (cuBLAS's own names are then missed, and say so by a
  lower kernel total)."""
  trace = _gpu_trace(steps=1)
  for e in trace["traceEvents"]:
    if e.get("name") == "thread_name" and e["pid"] == 2:
      e["args"]["name"] = f"Queue {e['tid']}"
  trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("tid") != 11]
  hlo = kernels.hlo_index(HLO)
  names = [name for name, _, _ in kernels.kernel_events(trace, hlo)]
  assert names == [
    "loop_add_fusion",
    "loop_add_fusion",
    "nvjet_sm90_tst_128x256_h_bz_NNT",  # its event names custom-call.5 (args.hlo_op)
    "input_reduce_fusion_2",
    "gemm_fusion_dot_4",
    "loop_xor_fusion",
    "copy_6",
  ]


def test_a_folder_without_a_trace_says_so(tmp_path):
  with pytest.raises(FileNotFoundError, match="no \\*.trace.json.gz"):
    kernels.find_trace(str(tmp_path))


def test_the_dumped_module_is_a_second_source_of_names(tmp_path):
  """profile_step.py compiles with xla_dump_to and uses the dumped optimized module where it names
  more of the kernel time than compiled.as_text() (which named none on the H200, 2026-11-28)."""
  assert kernels.dumped_module_text(str(tmp_path)) == ""
  (tmp_path / "module_0001.jit_small.gpu_after_optimizations.txt").write_text("HloModule small\n")
  (tmp_path / "module_0002.jit_step.gpu_after_optimizations.txt").write_text(HLO)
  (tmp_path / "module_0002.jit_step.gpu_after_optimizations-buffer-assignment.txt").write_text(
    HLO * 3
  )
  dumped = kernels.hlo_index(kernels.dumped_module_text(str(tmp_path)))
  events = [("loop_add_fusion", 30.0, "loop_add_fusion"), ("fusion_9999", 10.0, "fusion_9999")]
  assert kernels.found_fraction(events, dumped) == pytest.approx(0.75)
  assert kernels.found_fraction(events, {}) == 0.0 and kernels.found_fraction([], dumped) == 0.0
