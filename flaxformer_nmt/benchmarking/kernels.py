"""Where a compiled step's time goes: a profiler trace's kernels, summed by kind and named.

`jax.profiler.trace(dir, create_perfetto_trace=True)` writes a Chrome-trace JSON
(`plugins/profile/<run>/*.trace.json.gz`). On a GPU the kernels are the complete events ("ph": "X",
`dur` in microseconds) on the `Stream #N(...)` threads of a `/device:GPU:N` process; on a CPU they
are the thunks XLA runs on its client threads, named after the HLO instructions they execute. No
profiler package beyond JAX's own is needed to read them.

A kernel's name alone says little (`fusion_3500`), so each is looked up in the compiled module's
HLO text (`compiled.as_text()`): its opcode, its fusion kind (kLoop: element-wise, kInput: a
reduction at the root), a custom call's target (cuBLAS, cuDNN) and the JAX operation it came from
(`metadata={op_name=...}`: which layer, forward or backward). The kinds are those a GPU
profile of the step needs: matrix products, fused attention, element-wise fusions, reductions,
random bits, copies and collectives.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re
from collections.abc import Iterable
from typing import Any

KINDS = (
  "matmul",
  "attention",
  "elementwise",
  "reduction",
  "rng",
  "copy",
  "collective",
  "other",
)
# Thunk bookkeeping on XLA:CPU's client threads: not kernels.
_CPU_NOISE = ("end: ", "ThreadpoolListener", "ThunkExecutor", "SlinkyThreadPool")


@dataclasses.dataclass(frozen=True)
class Instruction:
  """What the HLO says of one instruction that may run as a kernel."""

  name: str
  opcode: str
  fusion_kind: str = ""  # kLoop, kInput, kOutput, kCustom; "" unless a fusion
  target: str = ""  # a custom call's target, or a fusion's backend kind (e.g. __triton_gemm)
  op_name: str = ""  # the JAX operation it lowers (metadata op_name), "" where none survives
  calls: tuple[str, ...] = ()  # the computations it calls (a fusion's body)


def normalize(name: str) -> str:
  """fusion.3500, fusion_3500 and %fusion.3500 name the same instruction (kernels use '_')."""
  return re.sub(r"[.\-]", "_", name.lstrip("%"))


_COMP_START = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"(?:^|\s)([a-z][a-z0-9\-]*)\(")


def hlo_index(text: str) -> dict[str, Instruction]:
  """Every instruction of a compiled module's HLO text, by normalized name.

  A fusion that holds a matrix product is named by that product's operation (XLA:CPU's dot
  fusions carry the op_name of the reduction fused after it); any other fusion without op_name
  metadata of its own takes its body's root's, the operation that gives the fusion its shape.
  """
  found: dict[str, Instruction] = {}
  roots: dict[str, str] = {}  # computation -> its root's op_name
  dots: dict[str, str] = {}  # computation -> its first matrix product's op_name
  computation = ""
  for line in text.splitlines():
    m = _INSTR.match(line)
    if m is None:
      start = _COMP_START.match(line)
      if start and "=" not in line.split("{", 1)[0]:
        computation = start.group(1)
      continue
    name, rest = m.groups()
    opcode = _OPCODE.search(rest)
    if opcode is None:
      continue
    fusion_kind = re.search(r"\bkind=(k\w+)", rest)
    target = re.search(r'custom_call_target="([^"]+)"', rest) or re.search(
      r'"kind":"(__[\w$]+)"', rest
    )
    op_name = re.search(r'op_name="([^"]*)"', rest)
    calls = re.search(r"\bcalls=([%\w.\-, ]+)", rest)
    instr = Instruction(
      name=name,
      opcode=opcode.group(1),
      fusion_kind=fusion_kind.group(1) if fusion_kind else "",
      target=target.group(1) if target else "",
      op_name=op_name.group(1) if op_name else "",
      calls=tuple(c.strip().lstrip("%") for c in calls.group(1).split(",")) if calls else (),
    )
    found[normalize(name)] = instr
    if line.lstrip().startswith("ROOT") and computation and instr.op_name:
      roots[computation] = instr.op_name
    if instr.opcode in ("dot", "convolution") and computation and instr.op_name:
      dots.setdefault(computation, instr.op_name)
  for key, instr in found.items():
    if instr.opcode != "fusion":
      continue
    dot = next((dots[c] for c in instr.calls if c in dots), "")
    root = next((roots[c] for c in instr.calls if c in roots), "")
    if dot or (root and not instr.op_name):
      found[key] = dataclasses.replace(instr, op_name=dot or root)
  return found


def kind_of(kernel: str, instr: Instruction | None) -> str:
  """One of KINDS, from the kernel's name and, where it is found, its HLO instruction."""
  text = " ".join(
    [kernel.lower()] + ([instr.opcode, instr.target.lower()] if instr is not None else [])
  )
  opcode = instr.opcode if instr is not None else ""
  op_name = instr.op_name.lower() if instr is not None else ""
  if re.search(r"nccl|all-reduce|all_reduce|allreduce|all-gather|reduce-scatter|collective", text):
    return "collective"
  if re.search(r"fmha|flash|sdpa", text):  # cuDNN's fused attention (not its norms or GEMMs)
    return "attention"
  if re.search(r"nvjet|gemm|cublas|cutlass|xmma|matmul|ynn|(^|[^a-z])dot([^a-z]|$)", text) or (
    opcode in ("dot", "convolution")
  ):
    return "matmul"
  # XLA often fuses the random bits into a plain loop fusion: its op_name still says so.
  if re.search(r"xor|threefry|philox|rng|random_bits", text + " " + op_name):
    return "rng"
  if re.search(r"memcpy|memset|copy|transpose", text) or opcode in ("copy", "transpose"):
    return "copy"
  if "reduce" in text or (instr is not None and instr.fusion_kind == "kInput"):
    return "reduction"
  if "fusion" in text or instr is not None:
    return "elementwise"
  return "other"


def find_trace(directory: str) -> str:
  """The newest Chrome-trace file jax.profiler.trace wrote under `directory`."""
  paths = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"{directory}: no *.trace.json.gz (was the trace perfetto-enabled?)")
  return max(paths, key=os.path.getmtime)


def kernel_events(
  trace: dict[str, Any] | list[Any], hlo: dict[str, Instruction]
) -> list[tuple[str, float, str]]:
  """(name, microseconds, HLO key) of every kernel in the trace.

  GPU: every complete event on a device process's stream threads (where a profiler names them
  otherwise: the device's events that name an HLO instruction). CPU (no device process): the
  client threads' events that name an HLO instruction.
  """
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  processes, threads = {}, {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      processes[e["pid"]] = e.get("args", {}).get("name", "")
    elif e.get("ph") == "M" and e.get("name") == "thread_name":
      threads[(e["pid"], e.get("tid"))] = e.get("args", {}).get("name", "")
  # Not "/device:CUSTOM:..." (libtpu's Megascale track, present wherever libtpu is installed).
  devices = {
    pid for pid, name in processes.items() if "/device:" in name and "/device:CUSTOM" not in name
  }
  streams = {k for k, name in threads.items() if k[0] in devices and "stream" in name.lower()}
  out = []
  for e in events:
    if e.get("ph") != "X" or "dur" not in e:
      continue
    name = str(e.get("name", ""))
    args = e.get("args") or {}
    key = normalize(str(args.get("hlo_op") or name))
    if streams:
      if (e["pid"], e.get("tid")) not in streams:
        continue
    elif devices:  # no thread is named a stream: the device's events that name an instruction
      if e["pid"] not in devices or key not in hlo:
        continue
    elif name.startswith(_CPU_NOISE) or key not in hlo:
      continue
    out.append((name, float(e["dur"]), key))
  return out


def summarize(
  events: Iterable[tuple[str, float, str]],
  hlo: dict[str, Instruction],
  steps: int,
  top: int = 15,
) -> dict[str, Any]:
  """Kernel time per step by kind, and the `top` kernels by time, each with where it came from."""
  by_kind = dict.fromkeys(KINDS, 0.0)
  per_kernel: dict[str, dict[str, Any]] = {}
  total = 0.0
  for name, us, key in events:
    instr = hlo.get(key)
    kind = kind_of(name, instr)
    by_kind[kind] += us
    total += us
    # By instruction where one is found: cuBLAS gives one kernel name to many products.
    k = per_kernel.setdefault(
      key if instr is not None else name,
      {
        "kernel": name,
        "kind": kind,
        "us": 0.0,
        "calls": 0,
        "hlo": instr.name if instr else "",
        "fusion_kind": instr.fusion_kind if instr else "",
        "op_name": instr.op_name if instr else "",
        "by_name": {},  # kernel name: microseconds (popped below)
        "instr": instr,  # popped below
      },
    )
    k["us"] += us
    k["calls"] += 1
    k["by_name"][name] = k["by_name"].get(name, 0.0) + us
  for k in per_kernel.values():
    # An instruction's kernels include a library's helpers (cuBLAS and cuDNN calls come with a
    # "Memset" on the H200): it is named by its costliest kernel, not by whichever ran first.
    k["kernel"] = max(k.pop("by_name").items(), key=lambda item: item[1])[0]
    k["kind"] = kind_of(k["kernel"], k.pop("instr"))
  ranked = sorted(per_kernel.values(), key=lambda k: -k["us"])
  return {
    "kernel_ms_per_step": round(total / steps / 1e3, 3),
    "kernels_per_step": round(sum(k["calls"] for k in ranked) / steps, 1),
    "by_kind_ms_per_step": {k: round(v / steps / 1e3, 3) for k, v in by_kind.items() if v},
    "by_kind_fraction": {k: round(v / total, 4) for k, v in by_kind.items() if v and total},
    "top": [
      {
        **{k: v for k, v in entry.items() if k not in ("us", "calls")},
        "ms_per_step": round(entry["us"] / steps / 1e3, 3),
        "calls_per_step": round(entry["calls"] / steps, 2),
        "fraction": round(entry["us"] / total, 4) if total else 0.0,
      }
      for entry in ranked[:top]
    ],
  }


def found_fraction(events: list[tuple[str, float, str]], hlo: dict[str, Instruction]) -> float:
  """The share of the events' time whose instruction `hlo` holds (0 for no events)."""
  total = sum(us for _, us, _ in events)
  return sum(us for _, us, key in events if key in hlo) / total if total else 0.0


def dumped_module_text(directory: str) -> str:
  """The largest optimized module XLA dumped under `directory` (`xla_dump_to`), "" if none: the
  step's module, where the dump also holds small helper programs."""
  paths = glob.glob(os.path.join(directory, "*after_optimizations.txt"))
  if not paths:
    return ""
  with open(max(paths, key=os.path.getsize), encoding="utf-8") as f:
    return f.read()


def read_trace(path: str) -> dict[str, Any] | list[Any]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return json.load(f)
