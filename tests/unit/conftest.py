"""The unit tier's two rules, enforced while each test runs: no process is started and the
training loop is not run. A test that does either fails with a message saying it belongs in
tests/e2e. (Fixtures may build what a test reads, e.g. a SentencePiece model.)

A unit test that needs a trained workdir reads a copy of the small one committed under
tests/fixtures (`saved_run`), written by training it once with tests/fixtures/make_workdir.py:
the unit tier trains nothing.
"""

from __future__ import annotations

import multiprocessing.process
import os
import shutil
import subprocess

import pytest


class TierError(AssertionError):
  """A unit test did what only an end-to-end test may."""


def _refuse(what: str):
  def refuse(*args: object, **kwargs: object):
    raise TierError(
      f"{what}: a unit test starts no process and runs no training loop; move it to tests/e2e "
      "(tests/unit/conftest.py)."
    )

  return refuse


_POPEN_INIT = subprocess.Popen.__init__
_REFUSE_POPEN = _refuse("it started a process (subprocess)")


def _popen_refused(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
  """Refuses every process but matplotlib's `fc-list`: importing matplotlib.font_manager on a
  machine without matplotlib's font cache (~/.cache/matplotlib) lists the fonts to build it, which
  is the machine's set-up, not the test's work; refused, every plotting test failed there."""
  if isinstance(args, (list, tuple)) and args and args[0] == "fc-list":
    _POPEN_INIT(self, args, *rest, **kwargs)
    return
  _REFUSE_POPEN()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  from flaxformer_nmt.training import trainer  # pylint: disable=g-import-not-at-top

  patch = pytest.MonkeyPatch()
  patch.setattr(subprocess.Popen, "__init__", _popen_refused)
  patch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("it started a process"))
  for name in ("system", "fork", "posix_spawn", "posix_spawnp"):
    if hasattr(os, name):
      patch.setattr(os, name, _refuse(f"it started a process (os.{name})"))
  patch.setattr(trainer.Trainer, "__init__", _refuse("it ran the training loop (a Trainer)"))
  try:
    yield
  finally:
    patch.undo()


@pytest.fixture
def saved_run(tmp_path) -> tuple:
  """(config, workdir): a copy of the committed small trained workdir (one layer, 12 steps, an
  EMA, best/ and an average of its last two checkpoints) and the config it was trained with."""
  from flaxformer_nmt import api  # pylint: disable=g-import-not-at-top

  import helpers  # pylint: disable=g-import-not-at-top  (JAX: not in pytest's own start-up)

  work = tmp_path / "saved_run"
  shutil.copytree(helpers.SAVED_RUN, work)
  return api.load_config("demo", helpers.saved_run_overrides()), work
