"""Checkpoint averaging: the mean of the last K checkpoints, which parameters `--checkpoint=auto`
and `averaged` then read, and that `averaged` means the average written last."""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import averaging
from flaxformer_nmt.checkpoints import params as params_lib
from flaxformer_nmt.checkpoints import reader as checkpoint_reader
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.folder import Workdir

from checkpoint_states import abstract, assert_bitwise_equal, make_state, new_ckpt, save_steps


def _mean(directory, num_checkpoints, template):
  """The mean of the last `num_checkpoints` steps of `directory`, and those steps."""
  steps = checkpoint_reader.CheckpointDir(str(directory)).steps()
  chosen = averaging.last_steps(steps, num_checkpoints, str(directory))
  template = template.params if hasattr(template, "params") else template
  return averaging.average(str(directory), chosen, template, ("params",)), chosen


def test_averaging_identical_and_different_checkpoints(tmp_path):
  ckpt_dir = Workdir(str(tmp_path)).checkpoints
  state = make_state(1, step=1)
  with new_ckpt(ckpt_dir, keep=5) as ckpt:
    for step in (1, 2, 3):
      ckpt.save(step, lambda: (state.replace(step=np.int32(step)), {}), force=True)
  params, steps = _mean(ckpt_dir, 3, abstract(state))
  assert steps == [1, 2, 3]
  assert_bitwise_equal(params, state.params)

  other = make_state(2, step=4)
  with new_ckpt(ckpt_dir, keep=5) as ckpt:
    ckpt.save(4, lambda: (other, {}), force=True)
  params, steps = _mean(ckpt_dir, 2, abstract(state).params)
  assert steps == [3, 4]
  expected = jax.tree.map(
    lambda a, b: ((a.astype(np.float64) + b) / 2).astype(np.float32), state.params, other.params
  )
  assert_bitwise_equal(params, expected)
  kernels = state.params["dense"]["kernel"], other.params["dense"]["kernel"]
  np.testing.assert_allclose(params["dense"]["kernel"], (kernels[0] + kernels[1]) / 2, rtol=1e-6)

  with pytest.raises(
    errors.CheckpointError, match=r"--num_checkpoints=5, but .* holds 4 checkpoints"
  ):
    _mean(ckpt_dir, 5, abstract(state))


def test_inference_params_prefer_a_fresh_average(tmp_path, caplog):
  run = Workdir(str(tmp_path))
  template = abstract(make_state(0)).params

  def load(which="auto"):
    return params_lib.load(selection.resolve(run, which), template)

  with pytest.raises(errors.CheckpointError, match="No checkpoint in"):
    load()
  with new_ckpt(run.checkpoints, keep=5) as ckpt:
    states = save_steps(ckpt, [1, 2])
  with pytest.raises(errors.CheckpointError, match="--mode=average"):
    load("averaged")

  params, description = load()
  assert description.startswith("step2 ")
  assert_bitwise_equal(params, states[2].params)

  mean, steps = _mean(run.checkpoints, 2, template)
  path = selection.save_average(run, mean, steps, "params")
  assert steps == [1, 2] and path.endswith(os.path.join("averaged", "params_2_steps_1_to_2", "2"))
  params, description = load()
  assert description.startswith("averaged") and "[1, 2]" in description
  assert_bitwise_equal(params, mean)
  params, _ = load("latest")
  assert_bitwise_equal(params, states[2].params)

  # Training went on after the average: 'auto' takes the newer checkpoint and says why.
  with new_ckpt(run.checkpoints, keep=5) as ckpt:
    states.update(save_steps(ckpt, [3]))
  with caplog.at_level(logging.WARNING):
    params, description = load()
  assert description.startswith("step3 ") and "training has saved step 3 since" in caplog.text
  with pytest.raises(errors.ConfigError, match="choose one of"):
    load("newest")


def test_averaged_means_the_average_written_last(tmp_path):
  """An average of the K checkpoints up to an older (best) step, written after an average of the
  newest K, is the one --checkpoint=averaged and auto read: averages are named by what they hold
  and averaged/latest.json names the one written last (at 97ad9e1 both were orbax steps named
  after their newest step, and `averaged` took the highest number)."""
  run = Workdir(str(tmp_path))
  template = abstract(make_state(0)).params
  with new_ckpt(run.checkpoints, keep=5) as ckpt:
    save_steps(ckpt, [1, 2, 3, 4])
  newest, steps = _mean(run.checkpoints, 2, template)
  selection.save_average(run, newest, steps, "params")  # steps 3, 4
  older = averaging.average(run.checkpoints, [1, 2], template, ("params",))
  path = selection.save_average(run, older, [1, 2], "params")  # e.g. the K up to the best step 2
  assert os.path.basename(os.path.dirname(path)) == "params_2_steps_1_to_2"
  for which in ("averaged", "auto"):
    params, description = params_lib.load(selection.resolve(run, which), template)
    assert "steps [1, 2]" in description, which
    assert_bitwise_equal(params, older)
  # Both stay on disk, each under its own name.
  assert sorted(os.listdir(run.averaged)) == [
    "latest.json",
    "params_2_steps_1_to_2",
    "params_2_steps_3_to_4",
  ]
