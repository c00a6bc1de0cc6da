"""Fine-tuning from another run's parameters (config.init_from) and the constant schedule."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.data import pipeline as data_lib
from flaxformer_nmt.data.tokenizer import Tokenizer
from flaxformer_nmt.model import losses
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import parallel
from flaxformer_nmt.training import init_from, steps
from flaxformer_nmt.training import loop as train
from flaxformer_nmt.training.state import TrainSetup
from flaxformer_nmt.training.trainer import Trainer

import helpers


def _fine_tune_config(source, **overrides):
  fields = dict(model__dtype="float32", init_from=str(source), data__demo_seed=7)
  return helpers.demo_config(**{**fields, **overrides})


def test_starts_from_the_source_bitwise_and_its_first_loss_is_the_sources(trained_demo, tmp_path):
  """Step 0 holds the source's parameters bit for bit, with fresh Adam moments; the first step's
  loss is the source model's own loss on that batch (the demo has no dropout)."""
  _, trained = trained_demo
  source, work = tmp_path / "source", tmp_path / "fine"
  shutil.copytree(trained, source)
  config = _fine_tune_config(source)
  run = Workdir(str(work))
  src = init_from.check(config, run)
  assert (src.workdir.path, src.location.kind) == (str(source), "latest")
  assert not run.training_steps()
  work.mkdir()
  components = Components(config, Tokenizer(src.vocabulary))
  init_from.check_fits(src, components)
  init_from.adopt_vocabulary(config, run, src)
  assert (work / "spm.model").read_bytes() == (source / "spm.model").read_bytes()

  data = data_lib.make_data(config, run, 8, 0, 1, tokenizer=components.tokenizer)
  wanted, _ = helpers.load_params(config, source, "latest")
  # The same config and vocabulary in another workdir packs the same first batch.
  peek_config = _fine_tune_config(source, data__vocab_path=str(source / "spm.model"))
  peek = data_lib.make_data(peek_config, Workdir(str(tmp_path / "peek")), 8, 0, 1)
  first_batch = next(peek.train)
  peek.train.close()
  with Trainer(TrainSetup(components), data, run, None, src) as trainer:
    state = parallel.local_replica(trainer.p_state)
    assert int(state.step) == 0 and trainer.step == 0
    helpers.assert_trees_equal(state.params, wanted)
    assert all(not np.any(x) for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0)
    trainer.train_step()
    (first,) = trainer.flush()
  record = json.loads((work / "init_from.json").read_text())
  assert record["source_workdir"] == str(source) and record["parameters"].startswith("step60")

  logits = steps._forward(components.model, wanted, first_batch, train=False)  # pylint: disable=protected-access
  weights = (first_batch["targets"] > 0).astype(np.float32)
  loss_sum, _, tokens = losses.label_smoothed_cross_entropy(
    logits, first_batch["targets"], weights, config.label_smoothing
  )
  assert first["tokens"] == float(tokens)
  assert first["loss_sum"] / first["tokens"] == pytest.approx(float(loss_sum / tokens), rel=1e-5)


def test_a_fine_tuning_run_trains_and_then_resumes_its_own_checkpoints(
  fine_tuned_demo, trained_demo, tmp_path
):
  """The shared fine-tuned run (10 steps from trained_demo), then on a copy of it: a rerun
  resumes its own checkpoints without the source; unreadable checkpoints stop the run."""
  result, done = fine_tuned_demo
  _, trained = trained_demo
  assert result["step"] == 10 and "test_sacrebleu_beam2" in result
  record = json.loads((done / "init_from.json").read_text())
  assert record["source_workdir"] == str(trained) and record["parameters"].startswith("step60")
  work = tmp_path / "fine"
  shutil.copytree(done, work)
  assert Workdir(str(work)).training_steps()  # its own checkpoints win from now on
  # Resuming does not need the source any more: moved away, the rerun still resumes.
  source = tmp_path / "source"
  shutil.copytree(trained, source)
  config = helpers.fine_tune_config(source)
  shutil.move(str(source), str(tmp_path / "moved"))
  assert train.train_and_evaluate(config, Workdir(str(work)))["step"] == 10
  # Checkpoints that are listed but all unreadable stop the run (set aside, not deleted), never
  # a silent start from random parameters; the next run starts over from the source.
  shutil.move(str(tmp_path / "moved"), str(source))
  (work / "init_from.json").unlink()
  for metadata in (work / "checkpoints").glob("*/state/_METADATA"):
    metadata.write_text("{not json")
  with pytest.raises(errors.CheckpointError, match="could be read"):
    train.train_and_evaluate(config, Workdir(str(work)))
  assert (work / "checkpoints" / "unreadable" / "10").is_dir()
  assert train.train_and_evaluate(config, Workdir(str(work)))["step"] == 10
  record = json.loads((work / "init_from.json").read_text())
  assert record["source_workdir"] == str(source)


def test_a_typed_architecture_field_that_differs_from_the_source_is_one_line(
  trained_demo, tmp_path
):
  """Issue 62: the command line's --config.model.num_heads=8 was replaced by the source's with a
  generic warning, exit 0; now one line names both values, before any work."""
  _, trained = trained_demo
  work = tmp_path / "fine"
  proc = helpers.run_main(
    "--config=demo",
    f"--workdir={work}",
    f"--config.init_from={trained}",
    "--config.model.num_heads=8",
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1] == (
    f"error: --config.model.num_heads=8: config.init_from={trained}'s config.json has "
    "model.num_heads=4, and a fine-tuned model keeps its source's architecture and vocabulary; "
    "leave it out."
  )
  assert not work.exists()
