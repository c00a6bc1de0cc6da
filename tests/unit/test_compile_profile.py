"""tests/compile_profile.py: JAX's compile events counted per test and summed per file and per
program (what benchmarks/test_times.py records as `jax`). Its path through pytest-xdist (workers
handing their counts to the controller) runs in the README's benchmark chain
(tests/e2e/test_readme.py checks the record)."""

from __future__ import annotations

import json

import compile_profile


def _events(profile: compile_profile.CompileProfile, test: str, program: str, seconds: float):
  """What JAX reports for one jitted program traced, lowered and compiled from an empty cache."""
  profile.test = test
  profile._duration(compile_profile._TRACE, seconds / 4, fun_name=program)
  profile._duration(compile_profile._LOWER, seconds / 4, fun_name=f"jit({program})")
  profile._event(compile_profile._MISSES)
  profile._duration(compile_profile._COMPILE, seconds, fun_name=f"jit({program})")
  profile.test = compile_profile._OUTSIDE


def test_counts_go_to_the_test_file_and_program_that_paid(tmp_path):
  worker_a = compile_profile.CompileProfile(str(tmp_path / "unused"))
  _events(worker_a, "tests/unit/test_x.py::test_one", "init_params", 2.0)
  _events(worker_a, "tests/unit/test_x.py::test_two", "init_params", 1.0)
  worker_a._duration("/jax/some/other_event", 9.0)  # not a compile event: not counted
  worker_b = compile_profile.CompileProfile(str(tmp_path / "unused"))
  _events(worker_b, "tests/unit/test_y.py::test_three[a]", "loss", 4.0)
  worker_b._event(compile_profile._HITS)  # a read from the cache, outside any test

  # As the controller receives them from two xdist workers (through JSON).
  got = compile_profile.summarize(
    [json.loads(json.dumps(w._counts())) for w in (worker_a, worker_b)]
  )
  assert got["total"] == {
    "programs": 3,
    "compile_s": 7.0,
    "trace_s": 1.8,  # 1.75, rounded to a tenth
    "lower_s": 1.8,
    "cache_hits": 1,
    "cache_misses": 3,
  }
  assert list(got["files"]) == ["tests/unit/test_y.py", "tests/unit/test_x.py", "<outside a test>"]
  assert got["files"]["tests/unit/test_x.py"]["programs"] == 2
  assert got["files"]["tests/unit/test_x.py"]["compile_s"] == 3.0
  # A trace names the function, a compile the program: one name.
  assert got["costliest_programs"]["init_params"] == {
    "programs": 2,
    "compile_s": 3.0,
    "trace_s": 0.8,
    "lower_s": 0.8,
  }
  assert got["costliest_compiles"][0] == [4.0, "loss", "tests/unit/test_y.py::test_three[a]"]
  assert [c[0] for c in got["costliest_compiles"]] == [4.0, 2.0, 1.0]


def test_the_event_names_are_jaxs():
  """The names counted are the ones this JAX records (they have been the same from 0.7 to 0.12)."""
  from jax._src import dispatch  # pylint: disable=g-import-not-at-top

  assert compile_profile._COMPILE == dispatch.BACKEND_COMPILE_EVENT
  assert compile_profile._TRACE == dispatch.JAXPR_TRACE_EVENT
  assert compile_profile._LOWER == dispatch.JAXPR_TO_MLIR_MODULE_EVENT
