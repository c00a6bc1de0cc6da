"""Fine-tuning from another run's parameters (config.init_from) and the constant schedule."""

from __future__ import annotations

import pytest

from flaxformer_nmt import api, errors
from flaxformer_nmt.data.tokenizer import Tokenizer
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.training import init_from, optim

import helpers


def _fine_tune_config(source, **overrides):
  """The committed run's config, fine-tuning from `source` (overrides: dotted names)."""
  config = api.load_config("demo", {**helpers.saved_run_overrides(), **overrides})
  config.init_from = str(source)
  return config


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(init_from="{tmp}/nothere"), "config.init_from={tmp}/nothere: not a trained workdir"),
    (dict(**{"model.num_layers": 3}), "trained with model.num_layers=1 where this config has 3"),
    (dict(**{"model.num_heads": 4}), "trained with model.num_heads=2 where this config has 4"),
    (
      dict(**{"data.vocab_path": "{tmp}/other.model"}),
      "differs from {tmp}/other.model; a fine-tuned model and its source must share one vocabulary",
    ),
  ],
  ids=["missing", "another size", "another head count", "another vocabulary"],
)
def test_bad_sources_are_one_line_before_any_work(tmp_path, change, message):
  (tmp_path / "other.model").write_bytes(b"another vocabulary")
  change = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in change.items()}
  source = change.pop("init_from", str(helpers.SAVED_RUN))
  config = _fine_tune_config(source, **change)
  with pytest.raises(errors.UserError) as info:
    source = init_from.check(config, Workdir(str(tmp_path / "fine")))
    init_from.check_fits(source, Components(config, Tokenizer(source.vocabulary)))
  line = str(info.value)
  assert message.format(tmp=tmp_path) in line and "\n" not in line
  assert "config.init_from=" in line
  assert not (tmp_path / "fine").exists()


def test_a_fine_tuning_config_takes_its_sources_architecture(tmp_path):
  config = _fine_tune_config(str(helpers.SAVED_RUN), **{"model.num_heads": 4})
  assert selection.adopt_architecture(config) == ["model.num_heads=2"]
  assert config.model.num_heads == 2
  source = init_from.check(config, Workdir(str(tmp_path / "fine")))  # no refusal now
  init_from.check_fits(source, Components(config, Tokenizer(source.vocabulary)))
  assert selection.adopt_architecture(config) == []  # nothing left to take


def test_a_typed_field_is_kept_or_refused_and_the_vocabulary_is_the_sources(tmp_path):
  """Issue 62: --config.model.num_heads=8 (typed) was replaced by the source's with a generic
  warning, and config.json saved the command's data.vocab_size / vocab_model_type, which describe
  a vocabulary the run does not have (the exported card showed the demo's 400 and bpe)."""
  config = _fine_tune_config(str(helpers.SAVED_RUN), **{"model.num_heads": 4})
  with pytest.raises(errors.ConfigError) as info:
    selection.adopt_architecture(config, typed={"model.num_heads"})
  assert str(info.value) == (
    f"--config.model.num_heads=4: config.init_from={helpers.SAVED_RUN}'s config.json has "
    "model.num_heads=2, and a fine-tuned model keeps its source's architecture and vocabulary; "
    "leave it out."
  )
  config.data.vocab_size, config.data.vocab_model_type = 8000, "unigram"
  changed = selection.adopt_architecture(config, typed={"model.d_model", "data.src_lang"})
  source = Workdir(str(helpers.SAVED_RUN)).saved_config()["data"]
  assert f"data.vocab_size={source['vocab_size']}" in changed
  assert config.data.vocab_size == source["vocab_size"]
  assert config.data.vocab_model_type == source["vocab_model_type"] == "bpe"


def test_the_constant_schedule_warms_up_as_the_papers_then_holds():
  paper = optim.paper_schedule(512, 4000, 0.5)
  constant = optim.constant_schedule(512, 4000, 0.5)
  for step in (0, 100, 3999):
    assert float(constant(step)) == pytest.approx(float(paper(step)), rel=1e-6)
  peak = 0.5 * 512**-0.5 * 4000**-0.5
  assert float(constant(3999)) == pytest.approx(peak, rel=1e-6)
  assert float(constant(100_000)) == pytest.approx(peak, rel=1e-6)
  assert float(paper(100_000)) < peak / 4


def test_a_resumed_fine_tuning_run_takes_its_architecture_from_its_own_config(tmp_path):
  """Its source is not read again (it may have moved): the run's config.json decides."""
  import shutil  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.run import command  # pylint: disable=g-import-not-at-top

  work = tmp_path / "fine"
  shutil.copytree(helpers.SAVED_RUN, work)
  config = _fine_tune_config(str(tmp_path / "moved_away"), **{"model.num_heads": 4})
  run = command.open_run(config, str(work), "train")
  assert run.config.model.num_heads == 2


def test_an_imported_run_is_not_trained_in_place(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.run import command  # pylint: disable=g-import-not-at-top

  work = tmp_path / "imported"
  shutil.copytree(helpers.SAVED_RUN, work)
  (work / "run.json").write_text(json.dumps({"training_data": {"kind": "imported"}}))
  config = api.load_config("demo", helpers.saved_run_overrides())
  with pytest.raises(errors.ConfigError, match="holds an imported model, which is not trained"):
    command.open_run(config, str(work), "train")


def test_later_commands_keep_a_fine_tuned_runs_own_architecture_and_vocabulary(tmp_path):
  """A fine-tuned run's config.json holds its source's fields: eval naming a config file keeps
  them (not refused for the file's vocab_size), and a resume with a typed value that its first
  start took silently (runs from before typed values were refused) still resumes."""
  import json  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.run import command  # pylint: disable=g-import-not-at-top

  work = tmp_path / "fine"
  shutil.copytree(helpers.SAVED_RUN, work)
  saved = json.loads((work / "config.json").read_text())
  saved["init_from"] = str(tmp_path / "source")
  saved["data"]["vocab_size"] = 123  # the source's, not the config file's
  (work / "config.json").write_text(json.dumps(saved))
  config = api.load_config("demo", helpers.saved_run_overrides())
  run = command.open_run(config, str(work), "eval")
  assert run.config.data.vocab_size == 123
  with pytest.raises(errors.ConfigError, match="--config.model.num_heads=4: this fine-tuned run"):
    command.open_run(
      _fine_tune_config("x", **{"model.num_heads": 4}), str(work), "eval", {"model.num_heads"}
    )
  resumed = _fine_tune_config(str(tmp_path / "moved"), **{"model.num_heads": 4})
  run = command.open_run(resumed, str(work), "train", {"model.num_heads"})
  assert run.config.model.num_heads == 2
