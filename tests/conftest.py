"""Test set-up: 8 virtual CPU devices, so pmap code is exercised as on an 8-accelerator host.

XLA reads the flag once, when jax is first imported, so it must be set before any test imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402


def pytest_configure(config):
  # Registered in pyproject.toml too; repeated here so a bare `pytest tests/x.py` knows it.
  config.addinivalue_line("markers", "slow: starts subprocesses (main.py, several processes)")
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


@pytest.fixture(scope="session")
def trained_demo(tmp_path_factory) -> tuple[dict, pathlib.Path]:
  """The tiny config trained to step 60 in float32, once per test session: (result, workdir).

  Checkpoints at steps 30 and 60, dev figures at step 60, test BLEU greedy and beam 2. Tests that
  change the workdir copy it first. Under pytest-xdist the workers share one run: the first to
  get here trains, the others wait on a file lock and read its result.
  """
  import fcntl
  import json

  from flaxformer_nmt.training import loop as train  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.workdir import Workdir  # pylint: disable=g-import-not-at-top

  import helpers  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the session's folder, shared by its workers
  workdir, done = root / "trained_demo", root / "trained_demo.json"
  with open(root / "trained_demo.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      config = helpers.demo_config(model__dtype="float32")
      done.write_text(json.dumps(train.train_and_evaluate(config, Workdir(str(workdir)))))
  return json.loads(done.read_text()), workdir
