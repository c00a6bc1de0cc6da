"""Checkpoint save / resume / fallback on tiny train states (fast, CPU); averaging is in
test_averaging.py."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import checkpointer as checkpoint
from flaxformer_nmt.checkpoints import reader as checkpoint_reader
from flaxformer_nmt.runtime import parallel
from flaxformer_nmt.training.steps import TrainState

import helpers
from checkpoint_states import abstract, assert_bitwise_equal, make_state, new_ckpt, save_steps


def test_round_trip_is_bitwise_with_data_position_and_rng(tmp_path):
  state = make_state(seed=7, step=3)
  with new_ckpt(tmp_path) as ckpt:
    assert ckpt.restore(abstract(state)) is None  # nothing saved yet
    assert ckpt.save(3, lambda: (state, {"epoch": 1, "index": 12345}), force=True)
  with new_ckpt(tmp_path) as ckpt:  # a fresh process's view
    assert ckpt.latest_step() == 3
    for template in (abstract(state), make_state(seed=99, step=0)):
      restored, data, step = ckpt.restore(template)
      assert step == 3 and data == {"epoch": 1, "index": 12345}
      assert isinstance(restored, TrainState)
      assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(restored))
      assert_bitwise_equal(restored, state)


def test_keeps_last_k_and_does_not_save_a_step_twice(tmp_path):
  with new_ckpt(tmp_path, keep=2) as ckpt:
    save_steps(ckpt, [1, 2, 3, 4])
    assert ckpt.all_steps() == [3, 4]
    assert not ckpt.save(4, lambda: (make_state(0, step=4), {}), force=True)  # already saved: no-op
    assert not ckpt.save(
      2, lambda: (make_state(0, step=2), {}), force=True
    )  # older than the newest


def test_one_save_decision_every_n_steps_or_every_s_seconds(tmp_path, monkeypatch):
  clock = [1000.0]
  monkeypatch.setattr(checkpoint.time, "monotonic", lambda: clock[0])
  made = []

  def make(step):
    def state_and_data():
      made.append(step)
      return make_state(0, step=step), {}

    return state_and_data

  with new_ckpt(tmp_path, keep=5, every_steps=5, every_secs=600) as ckpt:
    assert [s for s in range(0, 12) if ckpt.save(s, make(s))] == [5, 10]
    assert made == [5, 10]  # the state is copied to the host only for a save
    clock[0] += 599
    assert not ckpt.save(12, make(12))
    clock[0] += 2
    assert not ckpt.save(12, make(12), check_clock=False)  # not every process asks here
    assert ckpt.save(12, make(12))  # 601 s since the save of step 10
    clock[0] += 601
    assert not ckpt.save(12, make(12), force=True)  # saved already
    assert not ckpt.save(11, make(11), force=True)  # behind the newest checkpoint
    assert ckpt.save(13, make(13), force=True)
    assert not ckpt.save(14, make(14))  # the clock restarted at the forced save
    assert made == [5, 10, 12, 13]
    ckpt.wait_until_finished()
  assert checkpoint_reader.CheckpointDir(str(tmp_path)).steps() == [5, 10, 12, 13]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["truncate_all", "garbage_metadata"])
def test_a_corrupt_latest_falls_back_with_a_warning_naming_it_and_its_cost(
  tmp_path, caplog, damage
):
  """Positive evidence of damage in files that are present: set aside, previous one restored."""
  with new_ckpt(tmp_path) as ckpt:
    states = save_steps(ckpt, [1, 2])
  bad = tmp_path / "2"
  files = [p for p in bad.rglob("*") if p.is_file()]
  if damage == "truncate_all":
    for p in files:
      os.truncate(p, p.stat().st_size // 2)
  else:
    (bad / "state" / "_METADATA").write_text("{not json")

  with new_ckpt(tmp_path) as ckpt, caplog.at_level(logging.WARNING):
    restored, data, step = ckpt.restore(abstract(states[1]))
    assert step == 1 and data == {"epoch": 0, "index": 100}
    assert_bitwise_equal(restored, states[1])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(bad) in w and "unreadable" in w for w in warnings), warnings
    assert any("step 2: 1 steps will be trained again" in w for w in warnings), warnings
    # Moved aside, not deleted, and the resumed run can save step 2 again.
    assert (tmp_path / "unreadable" / "2").is_dir() and not bad.exists()
    assert ckpt.all_steps() == [1]
    assert ckpt.save(2, lambda: (make_state(5, step=2), {"epoch": 0, "index": 5}), force=True)
  with new_ckpt(tmp_path) as ckpt:
    assert ckpt.restore(abstract(states[1]))[2] == 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("missing", ["state_dir", "array_files", "everything"])
def test_a_missing_file_is_retried_never_taken_for_damage(tmp_path, monkeypatch, missing):
  """On eventually consistent storage a listed step can lack files for a while: no quarantine,
  no silent fall back to an older step; one line saying what to do."""
  monkeypatch.setattr(checkpoint_reader, "RETRY_DELAYS_S", (0.0, 0.0))
  with new_ckpt(tmp_path) as ckpt:
    states = save_steps(ckpt, [1, 2])
  bad = tmp_path / "2"
  if missing == "state_dir":
    shutil.rmtree(bad / "state")
  elif missing == "array_files":
    for p in [p for p in bad.rglob("*") if p.is_file() and p.parent.name == "d"]:
      p.unlink()  # ocdbt data and b-tree files
  else:
    shutil.rmtree(bad)
    bad.mkdir()
  before = helpers.snapshot(tmp_path)
  with new_ckpt(tmp_path) as ckpt:
    with pytest.raises(errors.CheckpointError, match="A missing file is not taken as damage") as e:
      ckpt.restore(abstract(states[2]))
  message = str(e.value)
  assert "\n" not in message and str(bad) in message and str(tmp_path / "unreadable") in message
  assert helpers.snapshot(tmp_path) == before  # nothing moved, nothing written


def test_a_file_that_shows_up_late_is_read_not_set_aside(tmp_path, monkeypatch):
  """GCS-FUSE/NFS: the step is listed before this host sees its array files; a retry finds them."""
  monkeypatch.setattr(checkpoint_reader, "RETRY_DELAYS_S", (0.3, 0.3))
  with new_ckpt(tmp_path) as ckpt:
    states = save_steps(ckpt, [1, 2])
  hidden = tmp_path / "hidden"
  shutil.move(tmp_path / "2" / "state", hidden)  # not visible yet ...
  threading.Timer(0.15, lambda: shutil.move(hidden, tmp_path / "2" / "state")).start()  # ... now
  with new_ckpt(tmp_path) as ckpt:
    restored, _, step = ckpt.restore(abstract(states[2]))
  assert step == 2
  assert_bitwise_equal(restored, states[2])
  assert not (tmp_path / "unreadable").exists()


def test_a_failed_read_is_retried_and_moves_nothing(tmp_path, monkeypatch, caplog):
  """NFS/GCS have bad seconds: an I/O error is not evidence that the checkpoint is corrupt."""
  monkeypatch.setattr(checkpoint_reader, "RETRY_DELAYS_S", (0.0, 0.0))
  with new_ckpt(tmp_path) as ckpt:
    states = save_steps(ckpt, [1, 2])
  real_restore = ocp.CheckpointManager.restore
  failures = [2]

  def flaky_restore(self, step, *args, **kwargs):
    if failures[0]:
      failures[0] -= 1
      raise OSError(errno.EIO, "Input/output error", str(tmp_path / str(step)))
    return real_restore(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", flaky_restore)
  with new_ckpt(tmp_path) as ckpt, caplog.at_level(logging.WARNING):
    restored, _, step = ckpt.restore(abstract(states[2]))
  assert step == 2 and failures == [0]
  assert_bitwise_equal(restored, states[2])
  assert "attempt 3 of 3" in caplog.text

  failures[0] = 100  # the storage stays down: one line, and the good checkpoint stays put
  with new_ckpt(tmp_path) as ckpt:
    with pytest.raises(errors.CheckpointError, match="nothing was moved") as info:
      ckpt.restore(abstract(states[2]))
    assert "\n" not in str(info.value) and str(tmp_path / "2") in str(info.value)
    assert ckpt.all_steps() == [1, 2]
  assert not (tmp_path / "unreadable").exists()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_no_readable_checkpoint_is_one_clear_error(tmp_path):
  with new_ckpt(tmp_path) as ckpt:
    states = save_steps(ckpt, [1])
  (tmp_path / "1" / "state" / "_METADATA").write_text("{not json")
  with new_ckpt(tmp_path) as ckpt:
    with pytest.raises(errors.CheckpointError, match="None of the 1 checkpoints"):
      ckpt.restore(abstract(states[1]))


def test_shape_mismatch_is_a_one_line_error_not_a_fallback(tmp_path):
  with new_ckpt(tmp_path) as ckpt:
    save_steps(ckpt, [1, 2], width=8)
  with new_ckpt(tmp_path) as ckpt:
    with pytest.raises(errors.CheckpointMismatchError) as info:
      ckpt.restore(abstract(make_state(0, width=16)))
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path / "2") in message  # the newest: no fallback past a mismatch
    assert "params/dense/kernel" in message and "(8, 4)" in message and "(16, 4)" in message
    assert ckpt.all_steps() == [1, 2] and not (tmp_path / "unreadable").exists()

    renamed = make_state(0)
    renamed.params["dense"]["weight"] = renamed.params["dense"].pop("kernel")
    with pytest.raises(errors.CheckpointMismatchError, match="params/dense"):
      ckpt.restore(abstract(renamed))


def test_save_rejects_a_replicated_state_or_a_step_mismatch(tmp_path):
  state = make_state(0, step=3)
  with new_ckpt(tmp_path) as ckpt:
    with pytest.raises(ValueError, match="replicated state"):
      ckpt.save(3, lambda: (jax.tree.map(lambda x: np.stack([x, x]), state), {}), force=True)
    with pytest.raises(ValueError, match="step is 3"):
      ckpt.save(4, lambda: (state, {}), force=True)
    with pytest.raises(ValueError, match="JSON"):
      ckpt.save(3, lambda: (state, {"position": object()}), force=True)
    assert ckpt.all_steps() == []


@pytest.mark.parametrize("save_devices,restore_devices", [(8, 1), (1, 8)])
def test_restore_across_device_counts(tmp_path, save_devices, restore_devices):
  assert jax.local_device_count() == 8, "tests/conftest.py should give 8 CPU devices"
  state = make_state(3, step=5)
  replicated = parallel.replicate(state, jax.local_devices()[:save_devices])
  with new_ckpt(tmp_path) as ckpt:
    ckpt.save(5, lambda: (parallel.local_replica(replicated), {"epoch": 0, "index": 9}), force=True)
  with new_ckpt(tmp_path) as ckpt:
    restored, _, _ = ckpt.restore(abstract(state))
  on_devices = parallel.replicate(restored, jax.local_devices()[:restore_devices])
  assert jax.tree.leaves(on_devices)[0].shape[0] == restore_devices
  for replica in range(restore_devices):
    assert_bitwise_equal(jax.device_get(jax.tree.map(lambda x: x[replica], on_devices)), state)


def test_relative_directory_saves_and_restores(tmp_path, monkeypatch):
  """`--workdir=runs/demo` (as in the README) is relative; orbax itself accepts only absolute."""
  monkeypatch.chdir(tmp_path)
  state = {"step": np.array(3, np.int32), "params": {"w": np.arange(4, dtype=np.float32)}}
  ckpt = checkpoint.Checkpointer("runs/demo/checkpoints", keep=2, every_steps=1)
  ckpt.save(3, lambda: (state, {"epoch": 0, "index": 5}), force=True)
  ckpt.wait_until_finished()
  restored, data_state, step = checkpoint.Checkpointer(
    "runs/demo/checkpoints", keep=2, every_steps=1
  ).restore(state)
  assert step == 3 and data_state == {"epoch": 0, "index": 5}
  np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
  assert (tmp_path / "runs/demo/checkpoints/3").is_dir()


def test_the_two_writing_managers_synchronise_under_their_own_barrier_names(tmp_path, monkeypatch):
  """Orbax's barrier names are fixed strings: in a two-process run, the training checkpoints'
  asynchronous save finishing in its thread while `best/` was written failed with "Barrier ... is
  already ongoing". Each writing manager prefixes its barriers with a name of its own."""
  prefixes = {}
  real = checkpoint.open_manager

  def recording(directory, **kwargs):
    manager = real(directory, **kwargs)
    prefixes[os.path.basename(directory)] = manager._options.multiprocessing_options  # orbax's
    return manager

  monkeypatch.setattr(checkpoint, "open_manager", recording)
  ckpt = new_ckpt(tmp_path / "checkpoints")
  save_steps(ckpt, [1])
  checkpoint.write(str(tmp_path / "best"), 1, {"params": {"w": np.zeros(2, np.float32)}}, {})
  ckpt.close()
  train, best = prefixes["checkpoints"], prefixes["best"]
  assert train.barrier_sync_key_prefix and best.barrier_sync_key_prefix
  assert train.barrier_sync_key_prefix != best.barrier_sync_key_prefix
  # Otherwise the defaults: every process of the job takes part, process 0 writes.
  assert train.active_processes is best.active_processes is None
  assert train.primary_host == best.primary_host == 0
