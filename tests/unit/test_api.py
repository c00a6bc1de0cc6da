"""The Python API (`flaxformer_nmt.api`): every mode as a function, as the notebook calls them."""

from __future__ import annotations

import pytest

from flaxformer_nmt import api, errors
from flaxformer_nmt.decoding import session as session_lib

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
    # The "did you mean" of flags (issue 52).
    ("demo", {"modle.d_ff": 3}, "config has no field 'modle'; did you mean 'model.d_ff'"),
    ("demo", {"model.dff": 3}, "config.model has no field 'dff'; did you mean 'model.d_ff'"),
    ("demo", {"decode.zzz": 3}, "config.decode has no field 'zzz'; its fields: alignment_layer"),
    ("demo", {"model.num_heads": 3}, "not divisible by config.model.num_heads=3"),
  ],
)
def test_load_config_errors_name_the_culprit(name, overrides, message):
  with pytest.raises(errors.ConfigError, match=message):
    api.load_config(name, overrides)


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_evaluate_translate_average_attention_export_on_a_trained_model(saved_run, tmp_path):
  """Every inference mode through the API on a trained workdir (the committed small one). The
  test scores are sacreBLEU's own figures for the hypotheses eval wrote, exactly."""
  import sacrebleu  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.data import sources  # pylint: disable=g-import-not-at-top

  config, work = saved_run
  scores = api.evaluate(config, str(work), checkpoint="latest")
  assert (scores["test_set"], scores["test_sentences"]) == ("demo test", 8)
  hyps = (work / "eval" / "test_step12_beam2.hyp.txt").read_text(encoding="utf-8").splitlines()
  refs = [t for _, t in sources.make_source(config.data).iter_pairs("test")]
  assert scores["test_sacrebleu_beam2"] == sacrebleu.corpus_bleu(hyps, [refs]).score
  assert scores["test_chrf_beam2"] == sacrebleu.corpus_chrf(hyps, [refs]).score
  lines = ["We need forty-two chairs.", "three hundred and five"]
  hyps = api.translate(config, str(work), lines)
  assert len(hyps) == 2 and all(isinstance(h, str) for h in hyps)
  # Loaded once (issue 52): the command line's defaults, its searches kept between calls.
  model = api.load(str(work))
  assert model.translate(lines) == hyps
  kept = model.translator()
  assert model.translate(lines) == hyps and model.translator() is kept
  assert model.kept_translators() == 1  # made once
  # Issue 62: a blank line's empty translation was silent in the API (the command line counts it).
  with pytest.warns(UserWarning, match=r"1 of 3 lines are blank \(their translations are empty"):
    assert model.translate([*lines, "  "])[:2] == hyps
  with pytest.warns(UserWarning, match=r"1 of 3 lines are blank"):
    assert api.translate(config, str(work), [*lines, ""])[2] == ""
  two = model.translate_nbest(lines, nbest=2)
  assert [len(h) for h in two] == [2, 2] and [h[0].text for h in two] == hyps
  scored = model.score(lines, ["Wir brauchen zweiundvierzig Stühle.", "dreihundertfünf"])
  assert len(scored) == 2 and all(s.tokens > 0 and s.log_prob < 0 for s in scored)
  drawn = model.attention(lines[0], str(tmp_path / "drawn"))
  assert drawn["translation"] == hyps[0] and (tmp_path / "drawn" / "cross_attention.png").is_file()
  with pytest.raises(errors.ConfigError, match="did you mean 'decode.beam_size'"):
    api.load(str(work), overrides={"decode.beam_szie": 4})
  with pytest.raises(TypeError, match="list of sentences"):
    api.translate(config, str(work), "one string")
  with pytest.raises(errors.ConfigError, match="--checkpoint=newest: choose one of"):
    api.translate(config, str(work), lines, checkpoint="newest")
  # One string is one ensemble member, not a list of its characters (at 97ad9e1: "member r").
  with pytest.raises(errors.CheckpointError, match="member runs/nothere: no such workdir"):
    api.translate(config, str(work), lines, ensemble="runs/nothere")
  assert len(api.translate(config, str(work), lines, checkpoint="best")) == 2

  averaged = api.average(config, str(work), num_checkpoints=2)
  assert averaged["steps"] == [8, 12]
  assert len(api.translate(config, str(work), lines, checkpoint="averaged")) == 2

  with pytest.raises(errors.ConfigError, match="--text is empty"):
    api.attention(config, str(work), "  ")
  pictures = api.attention(config, str(work), "We need forty-two chairs.")
  assert pictures["grids"]["cross_attention"] == [1, 2]  # 1 layer x 2 heads
  assert all((work / "attention" / f"{k}.png").is_file() for k in pictures["grids"])

  exported = api.export(config, str(work), str(tmp_path / "ct2"), quantization="int8")
  assert exported["quantization"] == "int8" and (tmp_path / "ct2" / "model.bin").is_file()


def test_two_ensembles_write_under_two_names():
  """Eval's output files are named by what each member loaded (at 97ad9e1 every ensemble of the
  same size and rule wrote test_ensemble2_auto_*, the second over the first)."""
  ours = "averaged params of 5 checkpoints (steps [6, 7, 8, 9, 10]) in /runs/a/averaged/x/10"
  one = session_lib.ensemble_tag(
    "auto", [ours, "/runs/b: step10 params ... in /runs/b/checkpoints/10"]
  )
  two = session_lib.ensemble_tag(
    "auto", [ours, "/runs/c: step10 params ... in /runs/c/checkpoints/10"]
  )
  assert one != two and one.startswith("ensemble2_auto_") and two.startswith("ensemble2_auto_")
  assert one == session_lib.ensemble_tag(
    "auto", [ours, "/runs/b: step10 params ... in /runs/b/checkpoints/10"]
  )
