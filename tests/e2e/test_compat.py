"""A workdir written before the package was split into stages (commit 97ad9e1) still evaluates,
translates, averages and resumes: the files in a workdir are a contract with its user.

tests/fixtures/workdir_97ad9e1 (helpers.SAVED_RUN) was made by tests/fixtures/make_workdir.py run
on that commit (its docstring has the command): training checkpoints with an EMA, best/<step>, and
an average in the old layout, averaged/<step>/.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from flaxformer_nmt import api
from flaxformer_nmt.workdir import Workdir

import helpers


@pytest.fixture
def old_workdir(tmp_path) -> pathlib.Path:
  work = tmp_path / "old"
  shutil.copytree(helpers.SAVED_RUN, work)
  return work


def test_an_old_workdir_resumes(old_workdir):
  """Two more steps: resumed from step 12 with its EMA and best/ (the config differs from the
  saved one only in num_train_steps), the best tracker replaying the old dev_metrics.jsonl."""
  overrides = helpers.saved_run_overrides()
  overrides["num_train_steps"] = 16
  config = api.load_config("demo", overrides)
  result = api.train(config, str(old_workdir))
  assert result["step"] == 16 and "ema_dev_loss" in result and result["best_step"] in (12, 16)
  train_log = [json.loads(line) for line in (old_workdir / "train_metrics.jsonl").open()]
  assert [r["step"] for r in train_log] == [4, 8, 12, 16]  # trained on, not from scratch
  assert Workdir(str(old_workdir)).training_steps()[-1] == 16
