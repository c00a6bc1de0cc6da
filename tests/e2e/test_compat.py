"""A workdir written by commit 97ad9e1 (tests/fixtures/workdir_97ad9e1) still resumes training;
tests/unit/test_compat.py checks that it evaluates, translates and averages."""

from __future__ import annotations

import json

from flaxformer_nmt import api
from flaxformer_nmt.run.folder import Workdir

import helpers


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
