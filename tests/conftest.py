"""Test set-up for both tiers: 8 virtual CPU devices, so pmap code is exercised as on an
8-accelerator host, and one compilation cache per test session.

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


if "PYTEST_XDIST_WORKER" not in os.environ:  # xdist's workers inherit what the controller set
  flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  if _unit_tier_only(sys.argv):
    # The unit tier compiles many small programs and runs each a few times: at LLVM -O0, XLA:CPU
    # compiles them fast enough to take a quarter off the tier (184 -> 140 s on 2 cores). A run
    # of both tiers (the README's) keeps the default, so every unit test passes at both levels.
    flags += " --xla_backend_optimization_level=0"
  os.environ["XLA_FLAGS"] = flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402


def pytest_configure(config):
  # Registered in pyproject.toml too; repeated here so a bare `pytest tests/x.py` knows it.
  config.addinivalue_line("markers", "readme: runs the README's commands (.ci/run: -m readme)")


@pytest.fixture(scope="session", autouse=True)
def shared_compilation_cache(tmp_path_factory) -> pathlib.Path:
  """One JAX compilation cache for the whole test session, in-process and in subprocesses.

  Most of a test's time is XLA compiling the same few tiny-model programs again: in each xdist
  worker and in every main.py or multi-process launch. The cache lives in the session's own
  folder (pytest prunes old ones), so every session starts cold, as CI does; nothing carries over.
  """
  import jax  # pylint: disable=g-import-not-at-top  (after XLA_FLAGS is set)

  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the session's folder, shared by its workers
  cache = root / "jax_compilation_cache"
  cache.mkdir(exist_ok=True)
  for name, value in (
    ("jax_compilation_cache_dir", str(cache)),
    ("jax_persistent_cache_min_compile_time_secs", 0.0),  # the tiny model compiles in < 1 s
  ):
    jax.config.update(name, value)
    os.environ[name.upper()] = str(value)  # for main.py and multi-process launches
  return cache


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
