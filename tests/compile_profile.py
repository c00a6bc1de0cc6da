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
import heapq
import json
import os
from typing import Any

import pytest

# JAX's event names (jax/_src/dispatch.py, compilation_cache.py), the same from 0.7 to 0.12.
_COMPILE = "/jax/core/compile/backend_compile_duration"  # includes a persistent-cache read
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_HITS, _MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"
# Collection and imports. (A module or session fixture's teardown runs inside the protocol of
# the last test that needed it, and counts to that test.)
_OUTSIDE = "<outside a test>"
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
    if _xdist_controller(config):
      return  # its workers run the tests; it needs no JAX (importing it would cost seconds)
    import jax  # pylint: disable=g-import-not-at-top  (after tests/conftest.py set XLA_FLAGS)

    jax.monitoring.register_event_duration_secs_listener(self._duration)
    jax.monitoring.register_event_listener(self._event)

  def pytest_unconfigure(self, config: pytest.Config) -> None:
    """Stops listening: a second `pytest.main` in this process must not count twice."""
    if _xdist_controller(config):
      return
    import jax  # pylint: disable=g-import-not-at-top

    for public, private, listener in (
      (
        "unregister_event_duration_listener",
        "_unregister_event_duration_listener_by_callback",
        self._duration,
      ),
      ("unregister_event_listener", "_unregister_event_listener_by_callback", self._event),
    ):  # public from JAX 0.8 on; Colab's 0.7 has the private one
      remove = getattr(jax.monitoring, public, None) or getattr(jax.monitoring, private, None)
      if remove is not None:
        remove(listener)

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

  def _event(self, event: str, **kwargs: Any) -> None:  # noqa: ARG002  (no program name)
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
      "compiles": heapq.nlargest(_KEPT, self.compiles),
    }

  # ---- writing (the controller, or the one process without xdist) ----------------------------
  @pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown to pytest without it
  def pytest_testnodedown(self, node: Any, error: Any) -> None:  # noqa: ARG002
    received = getattr(node, "workeroutput", {}).get("compile_profile")
    if received:
      self.from_workers.append(json.loads(received))

  def pytest_sessionfinish(self, session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes
      workeroutput["compile_profile"] = json.dumps(self._counts())
      return
    workers = self.from_workers if _xdist_controller(session.config) else None
    summary = summarize(workers if workers is not None else [self._counts()])
    if workers is not None:  # a worker that crashed sent nothing: the figures say so
      summary["workers_reported"] = len(workers)
    with open(self.path, "w") as f:
      json.dump(summary, f, indent=1)
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

  def rounded(counts: collections.Counter, keys: tuple[str, ...] = fields) -> dict[str, float]:
    return {k: round(counts[k], 1) if k.endswith("_s") else counts[k] for k in keys}

  by_cost = lambda item: -(item[1]["compile_s"] + item[1]["trace_s"] + item[1]["lower_s"])
  return {
    "total": rounded(total),
    "files": {k: rounded(v) for k, v in sorted(files.items(), key=by_cost)},
    # Cache hits and misses are JAX events without a program's name: counted per file only.
    "costliest_programs": {
      k: rounded(v, fields[:4]) for k, v in sorted(names.items(), key=by_cost)[:_KEPT]
    },
    "costliest_compiles": [
      [round(s, 2), name, test] for s, name, test in sorted(compiles, reverse=True)[:_KEPT]
    ],
  }


def _xdist_controller(config: pytest.Config) -> bool:
  """Whether this process hands the tests to xdist workers (`-n N`, N > 0) and runs none."""
  workers = getattr(config.option, "numprocesses", None)
  return not hasattr(config, "workerinput") and bool(workers)


def _bare(name: str) -> str:
  """`jit(f)` and `f` as one name: a compile event names the program, a trace the function."""
  return name[4:-1] if name.startswith("jit(") and name.endswith(")") else name


def register(config: pytest.Config, path: str) -> None:
  """Adds the plugin to this process (tests/conftest.py, when --compile-profile is given)."""
  config.pluginmanager.register(CompileProfile(os.path.abspath(path)), "compile_profile")
