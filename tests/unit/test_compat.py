"""A workdir written before the package was split into stages (commit 97ad9e1) still evaluates,
translates, averages and resumes: the files in a workdir are a contract with its user.

tests/fixtures/workdir_97ad9e1 (helpers.SAVED_RUN) was made by tests/fixtures/make_workdir.py run
on that commit (its docstring has the command): training checkpoints with an EMA, best/<step>, and
an average in the old layout, averaged/<step>/.
"""

from __future__ import annotations

import json
import pathlib

from flaxformer_nmt import api
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.folder import Workdir

import helpers


def test_an_old_workdir_reads_every_checkpoint_choice(old_workdir):
  config = api.load_config("demo", helpers.saved_run_overrides())
  run = Workdir(str(old_workdir))
  assert selection.resolve(run, "averaged").directory == str(
    old_workdir / "averaged"
  )  # averaged/12
  assert selection.resolve(run, "auto").kind == "averaged"  # made at step 12, the newest checkpoint
  for which in ("latest", "averaged", "best", "ema", "auto"):
    (hyps,) = api.translate_nbest(config, str(old_workdir), ["three hundred"], 1, which)
    assert isinstance(hyps[0].text, str), which
  scores = api.evaluate(config, str(old_workdir))
  assert scores["checkpoint"].startswith("averaged params of 2 checkpoints (steps [8, 12])")
  assert scores["test_sentences"] == 8

  # A new average goes beside the old one, under its own name, and is the one read from then on.
  made = api.average(config, str(old_workdir), num_checkpoints=3)
  assert made["path"] == str(old_workdir / "averaged" / "params_3_steps_4_to_12" / "12")
  assert selection.resolve(run, "averaged").directory == str(pathlib.Path(made["path"]).parent)
  assert (old_workdir / "averaged" / "12").is_dir()


def test_a_finished_run_saved_before_a_config_field_was_added_is_still_finished(old_workdir):
  """A field added to the config since (config.run_config.ADDED_FIELDS, e.g. model.d_k) at its
  old-behaviour value does not make the saved config.json another config, so rerunning the
  finished command returns its figures; any real difference still does."""
  from flaxformer_nmt.training import loop  # pylint: disable=g-import-not-at-top

  saved = Workdir(str(old_workdir)).saved_config_text()
  assert '"d_k"' not in saved
  assert '"attention": "ours"' in saved  # the default then; "auto" (today's) means the run's
  config = api.load_config("demo", helpers.saved_run_overrides())
  assert config.model.attention == "auto"
  assert loop._same_config(saved, config)
  config.model.d_k = 4
  assert not loop._same_config(saved, config)
  config = api.load_config("demo", {**helpers.saved_run_overrides(), "model.attention": "jax"})
  assert not loop._same_config(saved, config)
  # Saved before model.attention existed: it computed with ours, which "auto" means for it.
  older = json.loads(saved)
  del older["model"]["attention"]
  config = api.load_config("demo", helpers.saved_run_overrides())
  assert loop._same_config(json.dumps(older, indent=2), config)
  config = api.load_config("demo", {**helpers.saved_run_overrides(), "num_train_steps": 13})
  assert not loop._same_config(saved, config)
