"""Test set-up for both tiers: 8 virtual CPU devices, so pmap code is exercised as on an
8-accelerator host, and one compilation cache per package stack, kept between runs
(tests/jax_caches.py).

XLA reads the flag once, when jax is first imported, so it must be set before any test imports jax.
tests/unit/conftest.py keeps the unit tier in-process and away from the training loop;
tests/e2e/conftest.py builds the trained workdirs the end-to-end tests share, once per run.
"""

import os
import sys

_UNIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit")


def _unit_tier_only(argv: list[str]) -> bool:
  """Whether this run was asked for tests in tests/unit only: every path among the arguments (a
  file, a folder, `file::test`) lies inside it, and there is at least one."""
  paths = [a.split("::")[0] for a in argv[1:] if os.path.exists(a.split("::")[0])]
  paths = [os.path.abspath(p) for p in paths if not p.endswith((".toml", ".ini", ".cfg"))]
  return bool(paths) and all(p == _UNIT or p.startswith(_UNIT + os.sep) for p in paths)


def _jaxlib_before(major: int, minor: int) -> bool:
  """Whether the installed jaxlib is older than major.minor (read without importing it)."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top

  try:
    version = importlib.metadata.version("jaxlib").split(".")
    return (int(version[0]), int(version[1])) < (major, minor)
  except (importlib.metadata.PackageNotFoundError, ValueError, IndexError):
    return False


# The unit tier compiles many small programs and runs each a few times, so XLA:CPU's compile
# time is most of it. Two flags make that cheaper: LLVM -O0 (a quarter off the tier when
# written: 184 -> 140 s on 2 cores), and the loop emitters XLA:CPU had before its fusion
# emitters (a third off what remained: 185.1 -> 121.9 s cold on jax 0.10.2, one run each, about
# 4 s of it another change's; `-m "not slow"` warm 42.4 s without, 44.7 s with;
# docs/developing.md). jaxlib 0.12 no longer knows the second flag (an unknown flag is fatal):
# only jaxlibs before 0.11 get it (checked on Colab's 0.7.2 and on 0.10.2). A run of both tiers
# (the README's, CI's) keeps XLA's defaults, so every unit test passes with and without them.
_UNIT_TIER_XLA_FLAGS = " --xla_backend_optimization_level=0" + (
  " --xla_cpu_use_fusion_emitters=false" if _jaxlib_before(0, 11) else ""
)

if "PYTEST_XDIST_WORKER" not in os.environ:  # xdist's workers inherit what the controller set
  flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  if _unit_tier_only(sys.argv):
    flags += _UNIT_TIER_XLA_FLAGS
  os.environ["XLA_FLAGS"] = flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402


def pytest_addoption(parser):
  parser.addoption(
    "--compile-profile",
    metavar="FILE",
    help="Write where the run's JAX time went (programs compiled, per test file) to FILE as JSON "
    "(tests/compile_profile.py; benchmarks/test_times.py records it).",
  )


def pytest_configure(config):
  # Registered in pyproject.toml too; repeated here so a bare `pytest tests/x.py` knows it.
  config.addinivalue_line("markers", "readme: runs the README's commands (.ci/run: -m readme)")
  config.addinivalue_line("markers", "slow: over 10 s cold; -m 'not slow' leaves them out")
  if config.getoption("compile_profile"):
    import compile_profile  # pylint: disable=g-import-not-at-top

    compile_profile.register(config, config.getoption("compile_profile"))


def pytest_sessionstart(session):
  """Caps the kept compilation caches once per run, in the controller, before a worker writes."""
  import jax_caches  # pylint: disable=g-import-not-at-top

  if not hasattr(session.config, "workerinput") and os.environ.get(jax_caches.ENV) != "cold":
    jax_caches.prune()


@pytest.fixture(scope="session", autouse=True)
def shared_compilation_cache(tmp_path_factory) -> pathlib.Path:
  """The JAX compilation cache of this package stack (tests/jax_caches.py), in-process and in
  subprocesses: kept between test runs, outside the checkout.

  Most of a test's time is XLA compiling the same few tiny-model programs: in each xdist worker,
  in every main.py or multi-process launch, and in every run of the tests. A run that finds the
  programs of an earlier one loads them instead. `FLAXFORMER_NMT_TEST_CACHE=cold` gives a run an
  empty cache of its own (a new machine's, CI's first); docs/developing.md.
  """
  import jax  # pylint: disable=g-import-not-at-top  (after XLA_FLAGS is set)

  import jax_caches  # pylint: disable=g-import-not-at-top

  session = jax_caches.session_of(tmp_path_factory)
  variables = jax_caches.environment(os.environ.get("XLA_FLAGS", ""), session)
  os.environ.update(variables)  # for main.py and multi-process launches
  jax.config.update("jax_compilation_cache_dir", variables["JAX_COMPILATION_CACHE_DIR"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  except AttributeError:  # an older JAX without the option: its default stands
    pass
  return pathlib.Path(variables["JAX_COMPILATION_CACHE_DIR"])


@pytest.fixture
def tiny_config():
  """The shared tiny config: configs/demo.py cut to 60 steps and 40-sentence dev and test sets."""
  import helpers  # pylint: disable=g-import-not-at-top  (after XLA_FLAGS is set)

  return helpers.demo_config()


@pytest.fixture
def old_workdir(tmp_path) -> pathlib.Path:
  """A copy of the workdir commit 97ad9e1 wrote (tests/fixtures/workdir_97ad9e1): a user's
  workdir from before the package was split into stages (tests/*/test_compat.py)."""
  import shutil  # pylint: disable=g-import-not-at-top

  import helpers  # pylint: disable=g-import-not-at-top

  work = tmp_path / "old"
  shutil.copytree(helpers.SAVED_RUN, work)
  return work
