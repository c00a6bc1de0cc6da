"""The Python API (`flaxformer_nmt.api`): every mode as a function, as the notebook calls them."""

from __future__ import annotations

import json
import shutil

import pytest

from flaxformer_nmt import api, errors, modes

import helpers


def test_load_config_by_name_path_and_variant_with_overrides():
  c = api.load_config("demo", {"num_train_steps": 7, "model.dtype": "float32"})
  assert c.num_train_steps == 7 and c.model.dtype == "float32" and c.data.source == "demo"
  by_path = api.load_config(str(helpers.REPO / "configs" / "demo.py"))
  assert by_path.num_train_steps == api.load_config("demo").num_train_steps
  files = api.load_config("wmt14_ende_base:files", {"data.dir": "/data/wmt14"})
  assert (files.data.source, files.data.test_prefix) == ("files", "newstest2014")


@pytest.mark.parametrize(
  "name,overrides,message",
  [
    ("nonexistent", {}, "no installed config of that name"),
    ("demo:big", {}, "takes no argument after ':'"),
    ("demo", {"modle.d_ff": 3}, "config has no group 'modle'"),
    ("demo", {"model.dff": 3}, "config has no field 'model.dff'"),
    ("demo", {"model.num_heads": 3}, "not divisible by config.model.num_heads=3"),
  ],
)
def test_load_config_errors_name_the_culprit(name, overrides, message):
  with pytest.raises(errors.ConfigError, match=message):
    api.load_config(name, overrides)


def test_train_resumes_and_writes_its_result(tmp_path):
  tiny = {"num_train_steps": 6, "checkpoint_every_steps": 3, "eval_every_steps": 6}
  config = api.load_config("demo", {**_tiny_demo(), **tiny})
  first = api.train(config, str(tmp_path))
  assert first["step"] == 6 and "dev_loss" in first and "test_sacrebleu_beam2" in first
  assert first == json.loads((tmp_path / "train_result.json").read_text())
  hyps = sorted((tmp_path / "eval").glob("test_step6_*.hyp.txt"))
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


def test_evaluate_translate_average_attention_export_on_a_trained_model(trained_demo, tmp_path):
  _, trained = trained_demo
  work = tmp_path / "workdir"
  shutil.copytree(trained, work)
  config = helpers.demo_config(model__dtype="float32")

  scores = api.evaluate(config, str(work), checkpoint="latest")
  assert scores["test_set"] == "demo test" and 0.0 <= scores["test_sacrebleu_beam2"] <= 100.0
  lines = ["We need forty-two chairs.", "three hundred and five"]
  hyps = api.translate(config, str(work), lines)
  assert len(hyps) == 2 and all(isinstance(h, str) and h for h in hyps)
  with pytest.raises(TypeError, match="list of sentences"):
    api.translate(config, str(work), "one string")
  with pytest.raises(errors.ConfigError, match="--checkpoint=newest: choose one of"):
    api.translate(config, str(work), lines, checkpoint="newest")
  # One string is one ensemble member, not a list of its characters (at 97ad9e1: "member r").
  with pytest.raises(errors.CheckpointError, match="member runs/nothere: no such workdir"):
    api.translate(config, str(work), lines, ensemble="runs/nothere")
  with pytest.raises(errors.CheckpointError, match="--checkpoint=best: no best checkpoint"):
    api.translate(config, str(work), lines, checkpoint="best")  # trained without best_metric

  averaged = api.average(config, str(work), num_checkpoints=2)
  assert averaged["steps"] == [30, 60]
  assert api.translate(config, str(work), lines, checkpoint="averaged")  # the averaged params

  with pytest.raises(errors.ConfigError, match="--text is empty"):
    api.attention(config, str(work), "  ")
  pictures = api.attention(config, str(work), "We need forty-two chairs.")
  assert pictures["grids"]["cross_attention"] == [2, 4]  # tiny: 2 layers x 4 heads
  assert all((work / "attention" / f"{k}.png").is_file() for k in pictures["grids"])

  exported = api.export(config, str(work), str(tmp_path / "ct2"), quantization="int8")
  assert exported["quantization"] == "int8" and (tmp_path / "ct2" / "model.bin").is_file()


def test_two_ensembles_write_under_two_names():
  """Eval's output files are named by what each member loaded (at 97ad9e1 every ensemble of the
  same size and rule wrote test_ensemble2_auto_*, the second over the first)."""
  ours = "averaged params of 5 checkpoints (steps [6, 7, 8, 9, 10]) in /runs/a/averaged/x/10"
  one = modes.ensemble_tag("auto", [ours, "/runs/b: step10 params ... in /runs/b/checkpoints/10"])
  two = modes.ensemble_tag("auto", [ours, "/runs/c: step10 params ... in /runs/c/checkpoints/10"])
  assert one != two and one.startswith("ensemble2_auto_") and two.startswith("ensemble2_auto_")
  assert one == modes.ensemble_tag(
    "auto", [ours, "/runs/b: step10 params ... in /runs/b/checkpoints/10"]
  )
