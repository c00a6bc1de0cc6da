"""Where a test run's time goes in JAX: programs traced, lowered and compiled, per test.

`python -m pytest ... --compile-profile=FILE` (tests/conftest.py) writes FILE as JSON: the run's
totals (programs compiled, seconds in XLA's backend compile, in tracing, in lowering to MLIR,
persistent-cache hits and misses), the same per test file and per function traced (jit's and
pmap's programs by name, costliest first), and the costliest single compiles with the test that
paid for them. A trace's seconds include those of the traces nested in it (a jitted function
called inside another). benchmarks/test_times.py puts it in its record for every run it times.

Why: the unit tier is mostly JAX compiling small programs (docs/developing.md), so "which test is
slow" is answered by "which programs it compiles and how often", which pytest's durations cannot
show. The figures come from JAX's own monitoring events (`jax.monitoring`: the compile-time
events JAX records for every jit, pmap and op-by-op program, named by function), so nothing in
JAX is patched. Under pytest-xdist each worker counts its own tests and hands its counts to the
controller, which writes the one file.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import pytest

# JAX's event names (jax/_src/dispatch.py, compilation_cache.py), the same from 0.7 to 0.12.
_COMPILE = "/jax/core/compile/backend_compile_duration"  # includes a persistent-cache read
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_HITS, _MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"
_OUTSIDE = "<outside a test>"  # collection, fixtures' teardown after the last test
_KEPT = 30  # the costliest programs and compiles kept in the file


class CompileProfile:
  """A pytest plugin that counts JAX's compile events per test (module docstring)."""

  def __init__(self, path: str) -> None:
    self.path = path
    self.test = _OUTSIDE
    # {test id: Counter of programs, compile/trace/lower seconds, cache hits and misses}
    self.tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    self.compiles: list[tuple[float, str, str]] = []  # (seconds, program, test)
    # {program name: Counter of programs and seconds}: names as JAX gives them (`jit(f)`; a
    # trace's is the bare function's name)
    self.names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    self.from_workers: list[dict[str, Any]] = []

  # ---- counting (in every process that runs tests) -------------------------------------------
  def pytest_configure(self, config: pytest.Config) -> None:
    import jax  # pylint: disable=g-import-not-at-top  (after tests/conftest.py set XLA_FLAGS)

    jax.monitoring.register_event_duration_secs_listener(self._duration)
    jax.monitoring.register_event_listener(self._event)

  def _duration(self, event: str, seconds: float, **kwargs: Any) -> None:
    field = {_COMPILE: "compile_s", _TRACE: "trace_s", _LOWER: "lower_s"}.get(event)
    if field is None:
      return
    name = _bare(str(kwargs.get("fun_name", "?")))
    self.tests[self.test][field] += seconds
    self.names[name][field] += seconds
    if event == _COMPILE:
      self.tests[self.test]["programs"] += 1
      self.names[name]["programs"] += 1
      self.compiles.append((seconds, name, self.test))

  def _event(self, event: str, **kwargs: Any) -> None:  # noqa: ARG002
    if event in (_HITS, _MISSES):
      self.tests[self.test]["cache_hits" if event == _HITS else "cache_misses"] += 1

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any):  # noqa: ARG002
    self.test = item.nodeid
    yield
    self.test = _OUTSIDE

  def _counts(self) -> dict[str, Any]:
    return {
      "tests": {k: dict(v) for k, v in self.tests.items()},
      "names": {k: dict(v) for k, v in self.names.items()},
      "compiles": self.compiles,
    }

  # ---- writing (the controller, or the one process without xdist) ----------------------------
  def pytest_testnodedown(self, node: Any, error: Any) -> None:  # noqa: ARG002  (xdist's hook)
    received = getattr(node, "workeroutput", {}).get("compile_profile")
    if received:
      self.from_workers.append(json.loads(received))

  def pytest_sessionfinish(self, session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes
      workeroutput["compile_profile"] = json.dumps(self._counts())
      return
    parts = self.from_workers or [self._counts()]
    with open(self.path, "w") as f:
      json.dump(summarize(parts), f, indent=1)
      f.write("\n")


def summarize(parts: list[dict[str, Any]]) -> dict[str, Any]:
  """One summary of the counts of every process (`CompileProfile._counts`)."""
  fields = ("programs", "compile_s", "trace_s", "lower_s", "cache_hits", "cache_misses")
  total: collections.Counter = collections.Counter()
  files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  compiles: list[tuple[float, str, str]] = []
  for part in parts:
    for test, counts in part["tests"].items():
      total.update(counts)
      files[test.split("::")[0]].update(counts)
    for name, counts in part["names"].items():
      names[name].update(counts)
    compiles += [tuple(c) for c in part["compiles"]]

  def rounded(counts: collections.Counter) -> dict[str, float]:
    return {k: round(counts[k], 1) if k.endswith("_s") else counts[k] for k in fields}

  by_cost = lambda item: -(item[1]["compile_s"] + item[1]["trace_s"] + item[1]["lower_s"])
  return {
    "total": rounded(total),
    "files": {k: rounded(v) for k, v in sorted(files.items(), key=by_cost)},
    "costliest_programs": {k: rounded(v) for k, v in sorted(names.items(), key=by_cost)[:_KEPT]},
    "costliest_compiles": [
      [round(s, 2), name, test] for s, name, test in sorted(compiles, reverse=True)[:_KEPT]
    ],
  }


def _bare(name: str) -> str:
  """`jit(f)` and `f` as one name: a compile event names the program, a trace the function."""
  return name[4:-1] if name.startswith("jit(") and name.endswith(")") else name


def register(config: pytest.Config, path: str) -> None:
  """Adds the plugin to this process (tests/conftest.py, when --compile-profile is given)."""
  config.pluginmanager.register(CompileProfile(os.path.abspath(path)), "compile_profile")
