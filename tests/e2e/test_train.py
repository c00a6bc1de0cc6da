"""A shortened demo run, in process: the loss falls, checkpoints and TensorBoard files appear."""

import json
import logging
import os
import pathlib
import time

import jax
import numpy as np
import pytest

from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.training import loop as train
from flaxformer_nmt.training import trainer as trainer_lib
from flaxformer_nmt.training.state import TrainSetup

import helpers


def _train_losses(workdir) -> list[float]:
  return [m["loss"] for m in helpers.read_metrics(pathlib.Path(workdir), "train")]


def test_short_demo_run_lowers_loss_and_writes_checkpoints(trained_demo):
  result, tmp_path = trained_demo
  train_metrics = helpers.read_metrics(tmp_path, "train")
  assert [m["step"] for m in train_metrics] == [10, 20, 30, 40, 50, 60]
  losses = [m["loss"] for m in train_metrics]
  assert losses[-1] < 0.6 * losses[0], losses
  assert all(m["target_tokens_per_s"] > 0 and m["learning_rate"] > 0 for m in train_metrics)

  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["30", "60"]
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))
  assert (tmp_path / "spm.model").exists()
  # The final report: dev figures and both decoding flavours on the test split.
  assert result["step"] == 60
  for key in (
    "dev_loss",
    "dev_bleu",
    "test_sacrebleu_greedy",
    "test_sacrebleu_beam2",
    "test_tokenized_bleu_beam2",
    "train_minutes",
  ):
    assert key in result, result
  # Named by the test set, a digest of what was scored (scored_set_id), the step, the search.
  assert (
    len(list((tmp_path / "eval").glob("test_demo.test40.*_step60_beam2-shrinking-a0.6.hyp.txt")))
    == 1
  )
  json.dumps(result)  # the JSON line main.py prints


def test_time_budget_stops_early_with_a_checkpoint(tmp_path, tiny_config, monkeypatch):
  c = tiny_config
  c.max_train_minutes = 1e-4  # 6 ms: stops after the first step
  c.data.demo_test_size = 5
  # A start-up slower than the budget (as on a loaded machine, where this test once ended at step
  # 0): the time before the first step is not this run's training, so the run still trains one.
  missed = trainer_lib.Trainer.evaluate_if_missed
  monkeypatch.setattr(
    trainer_lib.Trainer, "evaluate_if_missed", lambda self: time.sleep(0.05) or missed(self)
  )
  result = train.train_and_evaluate(c, Workdir(str(tmp_path)))
  assert result["step"] == 1
  assert os.listdir(tmp_path / "checkpoints") == ["1"]
  # Rerun (as benchmarks/experiments.py reruns a finished experiment): the budget is spent, so
  # no step past it (one more was trained before the loop asked first).
  again = train.train_and_evaluate(c, Workdir(str(tmp_path)))
  assert again["step"] == 1 and os.listdir(tmp_path / "checkpoints") == ["1"]


def test_bfloat16_demo_trains_close_to_float32_with_float32_state(
  trained_demo, tmp_path, tiny_config, caplog
):
  """Mixed precision: bfloat16 products, float32 parameters and Adam moments on disk.

  The same 60 steps in both: the bfloat16 loss falls as the float32 one does; the test allows 5%
  between their dev losses and 5 BLEU points between their greedy test BLEU.
  """
  import orbax.checkpoint as ocp

  full, _ = trained_demo
  c = tiny_config
  c.model.dtype = "bfloat16"
  c.decode.beam_size = 1
  with caplog.at_level(logging.INFO):
    low = train.train_and_evaluate(c, Workdir(str(tmp_path / "bfloat16")))
  assert "bfloat16 matrix products" in caplog.text
  losses = _train_losses(tmp_path / "bfloat16")
  assert len(losses) == 6 and losses[-1] < 0.6 * losses[0], losses
  print(
    f"dev loss {full['dev_loss']:.4f} (float32) / {low['dev_loss']:.4f} (bfloat16); greedy "
    f"test sacreBLEU {full['test_sacrebleu_greedy']:.2f} / {low['test_sacrebleu_greedy']:.2f}"
  )
  assert abs(low["dev_loss"] - full["dev_loss"]) <= 0.05 * full["dev_loss"], (low, full)
  assert abs(low["test_sacrebleu_greedy"] - full["test_sacrebleu_greedy"]) <= 5.0, (low, full)
  with ocp.CheckpointManager(tmp_path / "bfloat16" / "checkpoints") as manager:
    state = manager.restore(60, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))["state"]
  floats = [x for x in jax.tree.leaves(state) if np.issubdtype(np.asarray(x).dtype, np.floating)]
  assert floats and all(np.asarray(x).dtype == np.float32 for x in floats)


def test_resume_evaluates_a_step_the_interrupted_run_saved_but_did_not_evaluate(
  trained_demo, tmp_path, tiny_config, caplog, monkeypatch
):
  """A run killed between saving step 60 and evaluating it: rerunning fills the hole. The resume
  restores into the state's abstract shapes: no initial parameters and Adam zeros are built only
  to be overwritten (for big, ~2.5 GB of host memory per process)."""

  def no_initial_state(self):
    raise AssertionError("a resume built the initial train state")

  monkeypatch.setattr(TrainSetup, "initial_state", no_initial_state)
  import shutil

  result, done = trained_demo
  workdir = tmp_path / "w"
  shutil.copytree(done, workdir)
  assert [r["step"] for r in helpers.read_metrics(workdir, "dev")] == [60]
  (workdir / "dev_metrics.jsonl").write_text("")  # as if killed before the evaluation
  c = tiny_config
  c.model.dtype = "float32"
  with caplog.at_level(logging.INFO):
    redone = train.train_and_evaluate(c, Workdir(str(workdir)))
  assert "Evaluating step 60, which the interrupted run did not." in caplog.text
  dev = helpers.read_metrics(workdir, "dev")
  assert [d["step"] for d in dev] == [60]
  assert dev[0]["dev_loss"] == pytest.approx(result["dev_loss"], rel=1e-6)
  # Training time continues from the checkpoint instead of restarting at 0.
  assert dev[0]["train_minutes"] == pytest.approx(result["train_minutes"], abs=0.02)
  assert redone["test_sacrebleu_greedy"] == pytest.approx(result["test_sacrebleu_greedy"])


def test_a_run_killed_while_it_scored_the_test_set_returns_its_dev_figures(
  trained_demo, tmp_path, tiny_config
):
  """Killed during its final test decoding (train_result.json still says "pending"), the rerun
  resumes at the last step, which it evaluated already: its result carries that evaluation's
  figures from dev_metrics.jsonl, as the uninterrupted run's did (at 97ad9e1 it had none of
  dev_bleu, dev_loss or train_minutes, and the notebook's rerun cell raised KeyError)."""
  import shutil

  result, done = trained_demo
  workdir = tmp_path / "w"
  shutil.copytree(done, workdir)
  pending = {k: v for k, v in result.items() if not k.startswith("test") and "signature" not in k}
  (workdir / "train_result.json").write_text(json.dumps(dict(pending, test="pending")))
  c = tiny_config
  c.model.dtype = "float32"
  rerun = train.train_and_evaluate(c, Workdir(str(workdir)))
  for key in ("dev_bleu", "dev_loss", "dev_accuracy", "train_minutes"):
    assert rerun[key] == result[key], key
  assert rerun["test_sacrebleu_beam2"] == pytest.approx(result["test_sacrebleu_beam2"])
