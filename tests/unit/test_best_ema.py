"""Research training: the parameters' moving average (optim.ema_decay), the best dev checkpoint
(best_metric) and early stopping (early_stopping_patience)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from flaxformer_nmt import api, errors
from flaxformer_nmt.checkpoints import reader
from flaxformer_nmt.config.choices import CHECKPOINTS
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.training import best


def test_the_tracker_counts_strict_improvements_of_the_better_of_raw_and_ema():
  loss = best.Tracker("dev_loss", patience=2)
  assert loss.update(10, {"dev_loss": 3.0, "ema_dev_loss": 2.5}) == "ema"
  assert (loss.value, loss.step, loss.parameters) == (2.5, 10, "ema")
  assert loss.update(20, {"dev_loss": 2.5, "ema_dev_loss": 2.6}) is None  # equal is no gain
  assert not loss.exhausted
  assert loss.update(30, {"dev_loss": 2.4}) == "params"
  assert loss.evals_without_improvement == 0
  for step in (40, 50):
    assert loss.update(step, {"dev_loss": 2.41, "ema_dev_loss": 2.42}) is None
  assert loss.exhausted and loss.summary()["best_step"] == 30

  bleu = best.Tracker("dev_bleu")
  assert bleu.update(1, {"dev_bleu": 20.0, "ema_dev_bleu": 20.0}) == "params"  # a tie: raw
  assert bleu.update(2, {"dev_bleu": 19.0, "ema_dev_bleu": 21.0}) == "ema"
  for step in range(3, 50):
    bleu.update(step, {"dev_bleu": 0.0})
  assert not bleu.exhausted  # patience 0: never


def test_the_tracker_replays_the_learning_curve_up_to_the_restored_step():
  """A step evaluated again after a resume counts once; evaluations past the restored step (a run
  killed before its next checkpoint) are left to the resumed run, which repeats them."""
  records = [
    {"step": 2, "dev_bleu": 5.0},
    {"step": 4, "dev_bleu": 7.0},
    {"step": 6, "dev_bleu": 6.0},
    {"step": 6, "dev_bleu": 6.0},  # evaluated again after a kill
    {"step": 8, "dev_bleu": 9.0},
  ]
  tracker = best.Tracker("dev_bleu", patience=3)
  tracker.replay(records, up_to_step=6)
  assert (tracker.value, tracker.step, tracker.evals_without_improvement) == (7.0, 4, 1)


def test_checkpoint_choices_agree():
  from flaxformer_nmt import cli  # pylint: disable=g-import-not-at-top

  assert tuple(cli.flags.FLAGS["checkpoint"].parser.enum_values) == CHECKPOINTS == api.CHECKPOINTS


@pytest.mark.parametrize(
  "which, message",
  [
    ("ema", "was not trained with config.optim.ema_decay > 0"),
    ("best", "no best checkpoint in"),
  ],
)
def test_a_run_without_them_has_no_ema_or_best(saved_run, which, message):
  """The committed run kept both; made to look like one that kept neither (its config.json says
  no EMA, its best/ is gone), each is one line."""
  config, workdir = saved_run
  run = Workdir(str(workdir))
  assert selection.resolve(run, which).kind == which
  saved = json.loads((workdir / "config.json").read_text())
  saved["optim"]["ema_decay"] = 0.0
  (workdir / "config.json").write_text(json.dumps(saved))
  shutil.rmtree(workdir / "best")
  with pytest.raises(errors.CheckpointError, match=message):
    selection.resolve(Workdir(str(workdir)), which)  # a new command: config.json read anew


def _best_params(value: float) -> dict:
  return {"w": np.full((3,), value, np.float32)}


def _best_info(step: int, value: float) -> dict:
  return {"metric": "dev_loss", "value": value, "step": step, "parameters": "params"}


def test_a_best_of_the_same_step_is_replaced_without_emptying_best(tmp_path, monkeypatch):
  """A resumed run whose evaluation of a saved best step came out another way writes the new
  parameters beside the old ones and swaps them in; a kill before the swap leaves the old best, a
  kill between its two renames leaves the new one in best/.incoming, moved into place at the next
  start. best/ never lacks a complete step to read (at 97ad9e1 the old step was deleted before the
  new one was written)."""
  directory, run = str(tmp_path / "best"), Workdir(str(tmp_path))
  best.write_best(run, 5, _best_params(1.0), _best_info(5, 1.0))
  assert reader.CheckpointDir(directory).steps() == [5]

  def steps_and_value():
    steps = reader.CheckpointDir(directory).steps()
    return steps, [reader.CheckpointDir(directory).read_data(s)["value"] for s in steps]

  class Killed(Exception):
    pass

  real_rename = best.os.rename  # os.rename itself: orbax renames through it too
  incoming = os.path.join(run.best_incoming, "5")

  def rename_then_die(src, dst):
    if str(src) == incoming:  # the old step is aside, the new one not yet in place
      raise Killed()
    real_rename(src, dst)

  monkeypatch.setattr(best.os, "rename", rename_then_die)
  with pytest.raises(Killed):
    best.write_best(run, 5, _best_params(2.0), _best_info(5, 2.0))
  monkeypatch.setattr(best.os, "rename", real_rename)
  assert reader.CheckpointDir(run.best_incoming).steps() == [5]
  # Readers meanwhile find the new one where it is (--checkpoint=best).
  assert selection.resolve(Workdir(str(tmp_path)), "best").directory == os.path.join(
    directory, ".incoming"
  )
  best.finish_replacement(run)  # what the next Keeper does first
  assert selection.resolve(Workdir(str(tmp_path)), "best").directory == directory
  assert steps_and_value() == ([5], [2.0])
  assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["5"]

  # A new best of a later step: the earlier one goes only once the new one is complete.
  best.write_best(run, 7, _best_params(3.0), _best_info(7, 3.0))
  assert steps_and_value() == ([7], [3.0])


def test_a_saved_best_is_recognised_by_its_own_record_not_best_result_json(tmp_path):
  """A kill after best/<step> was written but before best_result.json named it: the resumed run's
  identical evaluation finds it by the step's own JSON item and does not write it again."""
  directory = str(tmp_path / "best")
  info = _best_info(5, 1.5)
  best.write_best(Workdir(str(tmp_path)), 5, _best_params(1.5), info)
  assert best._already_saved(directory, info)  # pylint: disable=protected-access
  assert not best._already_saved(directory, _best_info(5, 1.4))  # pylint: disable=protected-access
  assert not best._already_saved(directory, _best_info(6, 1.5))  # pylint: disable=protected-access
