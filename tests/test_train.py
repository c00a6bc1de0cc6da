"""A shortened demo run, in process: the loss falls, checkpoints and TensorBoard files appear."""

import json
import os
import re

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


def test_short_demo_run_lowers_loss_and_writes_checkpoints(tmp_path, caplog):
  caplog.set_level("INFO")
  result = train.train_and_evaluate(short_demo_config(), str(tmp_path))

  losses = [float(m.group(1)) for m in re.finditer(r"step \d+/60  loss ([\d.]+)", caplog.text)]
  assert len(losses) == 6, caplog.text[-2000:]
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
