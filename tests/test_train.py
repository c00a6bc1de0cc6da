"""A shortened demo run, in process: the loss falls, checkpoints and TensorBoard files appear."""

import json
import logging
import os
import re

import jax
import pytest

from flaxformer_nmt import config_lib, train

DEMO = os.path.join(os.path.dirname(__file__), "..", "configs", "demo.py")


def short_demo_config():
  import runpy

  c = runpy.run_path(DEMO)["get_config"]()
  c.num_train_steps = 60
  c.log_every_steps = 10
  c.eval_every_steps = 60
  c.checkpoint_every_steps = 30
  c.data.demo_train_size = 5_000
  c.data.demo_dev_size = 40
  c.data.demo_test_size = 40
  c.eval.dev_bleu_sentences = 20
  c.decode.beam_size = 2
  return c


class _Lines(logging.Handler):
  def __init__(self) -> None:
    super().__init__(logging.INFO)
    self.lines: list[str] = []

  def emit(self, record: logging.LogRecord) -> None:
    self.lines.append(record.getMessage())


def _run(config, workdir) -> tuple[dict, str]:
  """train_and_evaluate, with the log lines it wrote."""
  handler = _Lines()
  root = logging.getLogger()
  level = root.level
  root.addHandler(handler)
  root.setLevel(logging.INFO)
  try:
    result = train.train_and_evaluate(config, str(workdir))
  finally:
    root.removeHandler(handler)
    root.setLevel(level)
  return result, "\n".join(handler.lines)


@pytest.fixture(scope="module")
def float32_demo(tmp_path_factory):
  """The shortened demo in float32 (what "auto" means on a CPU): (result, log, workdir)."""
  workdir = tmp_path_factory.mktemp("demo_float32")
  c = short_demo_config()
  c.model.dtype = "float32"
  return (*_run(c, workdir), workdir)


def test_short_demo_run_lowers_loss_and_writes_checkpoints(float32_demo):
  result, log, tmp_path = float32_demo
  losses = [float(m.group(1)) for m in re.finditer(r"step \d+/60  loss ([\d.]+)", log)]
  assert len(losses) == 6, log[-2000:]
  assert losses[-1] < 0.6 * losses[0], losses

  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["30", "60"]
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))
  assert (tmp_path / "spm.model").exists()
  # The final report: dev figures and both decoding flavours on the test split.
  assert result["step"] == 60
  for key in ("dev_loss", "dev_bleu", "test_sacrebleu_greedy", "test_sacrebleu_beam2",
              "test_tokenized_bleu_beam2", "train_minutes"):
    assert key in result, result
  assert os.path.exists(tmp_path / "eval" / "test_step60_beam2.hyp.txt")
  json.dumps(result)  # the JSON line main.py prints



def test_time_budget_stops_early_with_a_checkpoint(tmp_path):
  c = short_demo_config()
  c.max_train_minutes = 1e-4  # 6 ms: stops after the first step
  c.data.demo_test_size = 5
  result = train.train_and_evaluate(c, str(tmp_path))
  assert result["step"] == 1
  assert os.listdir(tmp_path / "checkpoints") == ["1"]


@pytest.mark.parametrize("field,value,message", [
    ("num_train_steps", 0, "config.num_train_steps must be >= 1"),
    ("label_smoothing", 1.0, "config.label_smoothing must be in [0, 1)"),
])
def test_bad_config_values_fail_before_any_work(tmp_path, field, value, message):
  c = config_lib.base_config("tiny")
  c[field] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    train.train_and_evaluate(c, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()  # nothing was created


def test_bfloat16_demo_trains_close_to_float32_with_float32_state(float32_demo, tmp_path):
  """Mixed precision: bfloat16 products, float32 parameters and Adam moments on disk.

  The same 60 steps in both: the bfloat16 loss falls as the float32 one does; the test allows 5%
  between their dev losses and 5 BLEU points between their greedy test BLEU.
  """
  import numpy as np
  import orbax.checkpoint as ocp

  full, _, _ = float32_demo
  c = short_demo_config()
  c.model.dtype = "bfloat16"
  c.decode.beam_size = 1
  low, log = _run(c, tmp_path / "bfloat16")
  assert "bfloat16 matrix products" in log
  losses = [float(m.group(1)) for m in re.finditer(r"step \d+/60  loss ([\d.]+)", log)]
  assert len(losses) == 6 and losses[-1] < 0.6 * losses[0], losses
  print(f"dev loss {full['dev_loss']:.4f} (float32) / {low['dev_loss']:.4f} (bfloat16); greedy "
        f"test sacreBLEU {full['test_sacrebleu_greedy']:.2f} / {low['test_sacrebleu_greedy']:.2f}")
  assert abs(low["dev_loss"] - full["dev_loss"]) <= 0.05 * full["dev_loss"], (low, full)
  assert abs(low["test_sacrebleu_greedy"] - full["test_sacrebleu_greedy"]) <= 5.0, (low, full)
  with ocp.CheckpointManager(tmp_path / "bfloat16" / "checkpoints") as manager:
    state = manager.restore(60, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))["state"]
  floats = [x for x in jax.tree.leaves(state) if np.issubdtype(np.asarray(x).dtype, np.floating)]
  assert floats and all(np.asarray(x).dtype == np.float32 for x in floats)


def test_resume_evaluates_a_step_the_interrupted_run_saved_but_did_not_evaluate(
    float32_demo, tmp_path):
  """A run killed between saving step 60 and evaluating it: rerunning fills the hole."""
  import shutil

  result, _, done = float32_demo
  workdir = tmp_path / "w"
  shutil.copytree(done, workdir)
  lines = (workdir / "dev_metrics.jsonl").read_text().splitlines()
  assert [json.loads(l)["step"] for l in lines] == [60]
  (workdir / "dev_metrics.jsonl").write_text("")  # as if killed before the evaluation
  c = short_demo_config()
  c.model.dtype = "float32"
  redone, log = _run(c, workdir)
  assert "Evaluating step 60, which the interrupted run did not." in log
  dev = [json.loads(l) for l in (workdir / "dev_metrics.jsonl").read_text().splitlines()]
  assert [d["step"] for d in dev] == [60]
  assert dev[0]["dev_loss"] == pytest.approx(result["dev_loss"], rel=1e-6)
  # Training time continues from the checkpoint instead of restarting at 0.
  assert dev[0]["train_minutes"] == pytest.approx(result["train_minutes"], abs=0.02)
  assert redone["test_sacrebleu_greedy"] == pytest.approx(result["test_sacrebleu_greedy"])
