"""Research training: the parameters' moving average (optim.ema_decay), the best dev checkpoint
(best_metric) and early stopping (early_stopping_patience)."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from flaxformer_nmt import api, errors
from flaxformer_nmt.checkpoints import reader
from flaxformer_nmt.config.choices import CHECKPOINTS
from flaxformer_nmt.runtime import parallel, records
from flaxformer_nmt.training import best, init_from, metrics, optim
from flaxformer_nmt.training import loop as train
from flaxformer_nmt.workdir import Workdir

import helpers


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


def _fresh_trainer(config, workdir):
  return helpers.fresh_trainer(config, workdir)


def test_the_ema_is_the_hand_computed_average_of_the_trained_parameters(tmp_path):
  """ema_0 = the initial parameters, ema_t = d * ema_(t-1) + (1 - d) * params_t, in float32,
  after every update; an optimizer without ema_decay keeps no average."""
  decay = 0.75
  config = helpers.demo_config(model__dtype="float32", optim__ema_decay=decay)
  with _fresh_trainer(config, tmp_path / "ema") as trainer:
    state = parallel.local_replica(trainer.p_state)
    hand = jax.tree.map(np.asarray, state.params)
    helpers.assert_trees_equal(optim.ema_of(state.opt_state), hand)
    for _ in range(3):
      trainer.train_step()
      trainer.flush()
      state = parallel.local_replica(trainer.p_state)
      params = jax.tree.map(np.asarray, state.params)
      hand = jax.tree.map(
        lambda e, p: np.float32(decay) * e + np.float32(1 - decay) * p, hand, params
      )
      ema = optim.ema_of(state.opt_state)
      for (path, got), want in zip(
        jax.tree_util.tree_leaves_with_path(ema), jax.tree.leaves(hand), strict=True
      ):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, err_msg=str(path))
    # After three updates the average differs from the parameters, as it should.
    assert any(
      not np.array_equal(e, p)
      for e, p in zip(jax.tree.leaves(ema), jax.tree.leaves(params), strict=True)
    )
  tx, _ = optim.make_optimizer(helpers.demo_config().optim, 128)
  assert optim.ema_of(tx.init({"w": np.zeros(3, np.float32)})) is None


def test_a_run_that_never_improves_stops_after_exactly_patience_evaluations(tmp_path):
  """The learning rate scaled to ~0 leaves the parameters as they are (and the EMA with them), so
  dev BLEU never changes: the first evaluation is the best, and the run stops after `patience`
  more, saved, with its result; rerunning it trains no further."""
  patience, every = 3, 4
  config = helpers.demo_config(
    model__dtype="float32",
    num_train_steps=100,
    log_every_steps=every,
    eval_every_steps=every,
    checkpoint_every_steps=every,
    best_metric="dev_bleu",
    early_stopping_patience=patience,
    optim__lr_scale=1e-30,
    optim__ema_decay=0.9,
    eval__dev_bleu_sentences=4,
    data__demo_test_size=8,
  )
  workdir = tmp_path / "flat"
  result = train.train_and_evaluate(config, Workdir(str(workdir)))
  stop_step = every * (patience + 1)
  assert result["stopped_early"] is True and result["step"] == stop_step
  assert (result["best_step"], result["best_metric"]) == (every, "dev_bleu")
  assert result["evals_without_improvement"] == patience
  dev = records.read_jsonl(Workdir(str(workdir)).metrics_path("dev"))
  assert [r["step"] for r in dev] == [every * k for k in range(1, patience + 2)]
  assert all("ema_dev_bleu" in r and "ema_dev_loss" in r for r in dev)
  assert "test_sacrebleu_beam2" in result
  saved = json.loads((workdir / "train_result.json").read_text())
  assert saved["stopped_early"] and saved["step"] == stop_step
  assert reader.CheckpointDir(Workdir(str(workdir)).checkpoints).steps()[-1] == stop_step
  best_steps = reader.CheckpointDir(Workdir(str(workdir)).best).steps()
  assert best_steps == [every]
  best_result = json.loads((workdir / "best_result.json").read_text())
  assert best_result["best_step"] == every and best_result["best_parameters"] == "params"

  # Rerunning returns the saved result; with that result lost (a kill during the test decoding)
  # the resumed run stops at once from its learning curve: no step is trained again.
  train_log = (workdir / "train_metrics.jsonl").read_text()
  assert api.train(config, str(workdir))["step"] == stop_step
  (workdir / "train_result.json").unlink()
  again = train.train_and_evaluate(config, Workdir(str(workdir)))
  assert again["stopped_early"] and again["step"] == stop_step and again["best_step"] == every
  assert (workdir / "train_metrics.jsonl").read_text() == train_log

  # --checkpoint=best and --checkpoint=ema read what training kept.
  best_params, description = helpers.load_params(config, workdir, "best")
  assert description.startswith(f"best params (params of step {every}, dev_bleu")
  latest, _ = helpers.load_params(config, workdir, "latest")
  for b, p in zip(jax.tree.leaves(best_params), jax.tree.leaves(latest), strict=True):
    np.testing.assert_allclose(b, p, rtol=1e-6, atol=1e-20)  # nothing moved but by ~lr = 1e-30
  ema, description = helpers.load_params(config, workdir, "ema")
  assert description.startswith(f"ema{stop_step} params")
  for e, p in zip(jax.tree.leaves(ema), jax.tree.leaves(latest), strict=True):
    np.testing.assert_allclose(e, p, rtol=1e-6, atol=1e-20)
  assert len(api.translate(config, str(workdir), ["drei"], checkpoint="best")) == 1
  averaged = api.average(config, str(workdir), 1, checkpoint="best")
  assert averaged["steps"] == [every]
  # Fine-tuning can start from the best evaluation's parameters.
  fine = helpers.demo_config(model__dtype="float32", init_from=str(workdir / "best"))
  source = init_from.check(fine, Workdir(str(tmp_path / "fine")))
  assert (source.workdir.path, source.location.kind) == (str(workdir), "best")


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
def test_a_run_without_them_has_no_ema_or_best(trained_demo, which, message):
  _, workdir = trained_demo
  with pytest.raises(errors.CheckpointError, match=message):
    Workdir(str(workdir)).resolve(which)


def test_a_best_is_saved_before_its_evaluation_is_logged_and_not_written_twice(
  tmp_path, monkeypatch
):
  """A kill between the two leaves an evaluation the resumed run makes again: it finds that best
  already in best/ (the same folder, not rewritten), and the learning curve, best/ and
  best_result.json agree in the end."""
  config = helpers.demo_config(
    model__dtype="float32",
    num_train_steps=2,
    log_every_steps=2,
    eval_every_steps=2,
    checkpoint_every_steps=2,
    best_metric="dev_loss",
    eval__dev_bleu_sentences=4,
    data__demo_test_size=8,
  )
  workdir = tmp_path / "run"
  scalars = metrics.MetricWriter.scalars

  class Killed(Exception):
    pass

  def killed_when_logging_dev(self, step, values, split):
    if split == "dev":
      raise Killed("before the evaluation reached dev_metrics.jsonl")
    scalars(self, step, values, split)

  monkeypatch.setattr(metrics.MetricWriter, "scalars", killed_when_logging_dev)
  with pytest.raises(Killed):
    train.train_and_evaluate(config, Workdir(str(workdir)))
  best_dir = workdir / "best"
  assert reader.CheckpointDir(str(best_dir)).steps() == [2]
  assert not records.read_jsonl(Workdir(str(workdir)).metrics_path("dev"))
  written = (best_dir / "2").stat().st_ino

  monkeypatch.setattr(metrics.MetricWriter, "scalars", scalars)
  result = train.train_and_evaluate(
    config, Workdir(str(workdir))
  )  # resumes at step 2, evaluates it
  dev = records.read_jsonl(Workdir(str(workdir)).metrics_path("dev"))
  assert [r["step"] for r in dev] == [2] and result["best_step"] == 2
  assert reader.CheckpointDir(str(best_dir)).steps() == [2]
  assert (best_dir / "2").stat().st_ino == written  # found saved, not written again
  saved = json.loads((workdir / "best_result.json").read_text())
  assert (saved["best_step"], saved["best_value"]) == (2, dev[0]["dev_loss"])


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
  directory = str(tmp_path / "best")
  best.write_best(directory, 5, _best_params(1.0), _best_info(5, 1.0))
  assert reader.CheckpointDir(directory).steps() == [5]

  def steps_and_value():
    steps = reader.CheckpointDir(directory).steps()
    return steps, [reader.CheckpointDir(directory).read_data(s)["value"] for s in steps]

  class Killed(Exception):
    pass

  real_rename = best.os.rename  # os.rename itself: orbax renames through it too
  incoming = os.path.join(directory, best.INCOMING, "5")

  def rename_then_die(src, dst):
    if str(src) == incoming:  # the old step is aside, the new one not yet in place
      raise Killed()
    real_rename(src, dst)

  monkeypatch.setattr(best.os, "rename", rename_then_die)
  with pytest.raises(Killed):
    best.write_best(directory, 5, _best_params(2.0), _best_info(5, 2.0))
  monkeypatch.setattr(best.os, "rename", real_rename)
  assert reader.CheckpointDir(str(tmp_path / "best" / best.INCOMING)).steps() == [5]
  # Readers meanwhile find the new one where it is (--checkpoint=best).
  assert Workdir(str(tmp_path)).resolve("best").directory == os.path.join(directory, ".incoming")
  best.finish_replacement(directory)  # what the next Keeper does first
  assert Workdir(str(tmp_path)).resolve("best").directory == directory
  assert steps_and_value() == ([5], [2.0])
  assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["5"]

  # A new best of a later step: the earlier one goes only once the new one is complete.
  best.write_best(directory, 7, _best_params(3.0), _best_info(7, 3.0))
  assert steps_and_value() == ([7], [3.0])


def test_a_saved_best_is_recognised_by_its_own_record_not_best_result_json(tmp_path):
  """A kill after best/<step> was written but before best_result.json named it: the resumed run's
  identical evaluation finds it by the step's own JSON item and does not write it again."""
  directory = str(tmp_path / "best")
  info = _best_info(5, 1.5)
  best.write_best(directory, 5, _best_params(1.5), info)
  assert best._already_saved(directory, info)  # pylint: disable=protected-access
  assert not best._already_saved(directory, _best_info(5, 1.4))  # pylint: disable=protected-access
  assert not best._already_saved(directory, _best_info(6, 1.5))  # pylint: disable=protected-access
