"""The trained workdirs the end-to-end tests share: each is trained once per test run (the first
xdist worker to ask trains it while the others wait on a file lock) and read-only afterwards; a
test that changes one copies it first.

- `trained_demo`: the tiny demo config, 60 steps, float32 (the quick start's model, made small).
- `trained_best_ema`: the same with config.best_metric (dev_bleu) and an EMA (0.9), evaluated
  every 20 steps: best/, --checkpoint=best|ema, the K up to the best step.
- `fine_tuned_demo`: 10 steps fine-tuned from `trained_demo` (config.init_from, constant schedule).
- `trained_demo_seed1`: `trained_demo`'s config with seed 1: a second model for ensembles.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import pytest

# The README tests (`-m readme`, .ci/run's second stage) on two workers: xdist hands tests out in
# collection order, so a long chain collected last ran alone at the end (21 min for 29 min of
# tests on 2 cores: benchmarks 596 s, files 437 s, decoding 167 s, the install check 113 s, the
# rest under 81 s each; `-m readme --durations=0` at 6f0130f). Longest first, the short ones
# fill in behind.
_LONGEST_FIRST = (
  "test_benchmark_commands",
  "test_files_chain",
  "test_docs_demo_chain[decoding]",
  "test_install_commands_resolve_and_ci_runs_the_test_command",
  "test_serving_chain",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  del config
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.name, len(rank)))  # stable: the rest as collected


def _shared_run(tmp_path_factory, name: str, train: Callable[[pathlib.Path], dict]) -> tuple:
  """(result, workdir) of a run trained once per session by `train(workdir)`."""
  import helpers  # pylint: disable=g-import-not-at-top

  return helpers.shared_once(tmp_path_factory, name, train)


def _train(config, workdir: pathlib.Path) -> dict:
  from flaxformer_nmt.run.folder import Workdir  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.training import loop  # pylint: disable=g-import-not-at-top

  return loop.train_and_evaluate(config, Workdir(str(workdir)))


@pytest.fixture(scope="session")
def trained_demo(tmp_path_factory) -> tuple[dict, pathlib.Path]:
  """The tiny config trained to step 60 in float32: (result, workdir).

  Checkpoints at steps 30 and 60, dev figures at step 60, test BLEU greedy and beam 2.
  """
  import helpers  # pylint: disable=g-import-not-at-top

  config = helpers.demo_config(model__dtype="float32")
  return _shared_run(tmp_path_factory, "trained_demo", lambda w: _train(config, w))


@pytest.fixture(scope="session")
def trained_best_ema(tmp_path_factory) -> tuple[dict, pathlib.Path]:
  """The tiny config with best_metric dev_bleu and an EMA of 0.9, 60 steps, evaluated and saved
  every 20: (result, workdir)."""
  import helpers  # pylint: disable=g-import-not-at-top

  config = helpers.best_ema_config()
  return _shared_run(tmp_path_factory, "trained_best_ema", lambda w: _train(config, w))


@pytest.fixture(scope="session")
def fine_tuned_demo(tmp_path_factory, trained_demo) -> tuple[dict, pathlib.Path]:
  """10 steps fine-tuned from `trained_demo` (another demo data seed, constant schedule at 0.1 of
  the peak): (result, workdir)."""
  import helpers  # pylint: disable=g-import-not-at-top

  _, source = trained_demo
  config = helpers.fine_tune_config(source)
  return _shared_run(tmp_path_factory, "fine_tuned_demo", lambda w: _train(config, w))


@pytest.fixture(scope="session")
def trained_demo_seed1(tmp_path_factory) -> tuple[dict, pathlib.Path]:
  """`trained_demo`'s config with seed 1 (the same data and vocabulary file): (result, workdir)."""
  import helpers  # pylint: disable=g-import-not-at-top

  config = helpers.demo_config(model__dtype="float32", seed=1)
  return _shared_run(tmp_path_factory, "trained_demo_seed1", lambda w: _train(config, w))
