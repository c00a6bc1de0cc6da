"""The Python API (`flaxformer_nmt.api`): every mode as a function, as the notebook calls them."""

from __future__ import annotations

import json

from flaxformer_nmt import api


def test_train_resumes_and_writes_its_result(tmp_path):
  tiny = {"num_train_steps": 6, "checkpoint_every_steps": 3, "eval_every_steps": 6}
  config = api.load_config("demo", {**_tiny_demo(), **tiny})
  first = api.train(config, str(tmp_path))
  assert first["step"] == 6 and "dev_loss" in first and "test_sacrebleu_beam2" in first
  assert first == json.loads((tmp_path / "train_result.json").read_text())
  hyps = sorted((tmp_path / "eval").glob("test_demo.test16.*_step6_*.hyp.txt"))
  stamps = [p.stat().st_mtime_ns for p in hyps]
  # The same call again (a notebook cell rerun after a runtime reset): the saved figures, with
  # nothing trained or decoded again.
  assert api.train(config, str(tmp_path)) == first
  assert hyps and [p.stat().st_mtime_ns for p in hyps] == stamps
  config.num_train_steps = 9
  again = api.train(config, str(tmp_path))  # the same workdir, more steps: resumes at 6
  assert again["step"] == 9 and again["test_sacrebleu_beam2"] >= 0
  steps = [json.loads(line)["step"] for line in open(tmp_path / "train_metrics.jsonl")]
  assert steps == [3, 6, 9]  # logged once each: step 9's run started from step 6's checkpoint


def _tiny_demo() -> dict:
  return {
    "data.demo_train_size": 2_000,
    "data.demo_dev_size": 16,
    "data.demo_test_size": 16,
    "eval.dev_bleu_sentences": 8,
    "log_every_steps": 3,
    "decode.beam_size": 2,
  }
