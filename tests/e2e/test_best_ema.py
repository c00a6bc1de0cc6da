"""Research training: the parameters' moving average (optim.ema_decay), the best dev checkpoint
(best_metric) and early stopping (early_stopping_patience)."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest

from flaxformer_nmt import api
from flaxformer_nmt.checkpoints import reader
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import files, parallel
from flaxformer_nmt.training import init_from, metrics, optim
from flaxformer_nmt.training import loop as train

import helpers


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
  dev = files.read_jsonl(Workdir(str(workdir)).metrics_path("dev"))
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
  # The best is not the last here: --checkpoint=best and average --checkpoint=best take step
  # `every`, not the newest checkpoint (the shared best + EMA run's best may be its last step).
  _, description = helpers.load_params(config, workdir, "best")
  assert description.startswith(f"best params (params of step {every}, dev_bleu"), description
  assert api.average(config, str(workdir), 1, checkpoint="best")["steps"] == [every]


def _saved_state(workdir, step: int) -> dict:
  """A training checkpoint's state, read with orbax directly (not with the code under test)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  with ocp.CheckpointManager(workdir / "checkpoints", item_names=("state",)) as manager:
    return manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))["state"]


def _assert_same_leaves(tree, saved) -> None:
  flat = lambda t: {
    jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(t)[0]
  }
  got, want = flat(tree), flat(saved)
  assert got.keys() == want.keys()
  for name, value in got.items():
    np.testing.assert_array_equal(value, want[name], err_msg=name)


def test_best_and_ema_read_what_training_kept(trained_best_ema, tmp_path):
  """On the shared best + EMA run: --checkpoint=best reads the best evaluation's parameters (the
  raw ones or their average, whichever won), --checkpoint=ema the average kept in the latest
  checkpoint; average --checkpoint=best takes the K up to the best step, and fine-tuning can
  start from best/."""
  result, done = trained_best_ema
  workdir = tmp_path / "run"
  shutil.copytree(done, workdir)
  config = helpers.best_ema_config()
  best_step, which = result["best_step"], result["best_parameters"]
  assert best_step in (20, 40, 60) and which in ("params", "ema")
  best_params, description = helpers.load_params(config, workdir, "best")
  assert description.startswith(f"best params ({which} of step {best_step}, dev_bleu")
  # The parameters the training checkpoint of that step holds (raw, or their EMA), read with
  # orbax itself; and --checkpoint=ema is the EMA in the newest one.
  at_best, at_last = (_saved_state(workdir, step) for step in (best_step, 60))
  want = at_best["params"] if which == "params" else at_best["opt_state"]["1"]["ema"]
  _assert_same_leaves(best_params, want)
  ema, description = helpers.load_params(config, workdir, "ema")
  assert description.startswith("ema60 params")
  _assert_same_leaves(ema, at_last["opt_state"]["1"]["ema"])
  assert len(api.translate(config, str(workdir), ["drei"], checkpoint="best")) == 1
  averaged = api.average(config, str(workdir), 1, checkpoint="best")
  assert averaged["steps"] == [best_step]
  # Fine-tuning can start from the best evaluation's parameters.
  fine = helpers.demo_config(model__dtype="float32", init_from=str(workdir / "best"))
  source = init_from.check(fine, Workdir(str(tmp_path / "fine")))
  assert (source.workdir.path, source.location.kind) == (str(workdir), "best")


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
  assert not files.read_jsonl(Workdir(str(workdir)).metrics_path("dev"))
  written = (best_dir / "2").stat().st_ino

  monkeypatch.setattr(metrics.MetricWriter, "scalars", scalars)
  result = train.train_and_evaluate(
    config, Workdir(str(workdir))
  )  # resumes at step 2, evaluates it
  dev = files.read_jsonl(Workdir(str(workdir)).metrics_path("dev"))
  assert [r["step"] for r in dev] == [2] and result["best_step"] == 2
  assert reader.CheckpointDir(str(best_dir)).steps() == [2]
  assert (best_dir / "2").stat().st_ino == written  # found saved, not written again
  saved = json.loads((workdir / "best_result.json").read_text())
  assert (saved["best_step"], saved["best_value"]) == (2, dev[0]["dev_loss"])
