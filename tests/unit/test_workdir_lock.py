"""One training job per workdir; a lock left by a dead job is taken over, a live one's never."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.training import lock as workdir_lock

import helpers

LOCK_NAME = os.path.basename(Workdir("").lock_path)  # train.lock


def test_held_while_training_and_released_after(tmp_path):
  path = tmp_path / LOCK_NAME
  with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
    holder = json.loads(path.read_text())
    assert holder["pid"] == os.getpid() and holder["host"] and holder["started"]
    with pytest.raises(errors.WorkdirLockedError) as info:
      with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
        pass
    message = str(info.value)
    assert "\n" not in message and f"pid {os.getpid()}" in message
    assert holder["host"] in message and holder["started"] in message
    assert path.exists()  # the refused job left the holder's lock alone
  assert not path.exists()


def test_a_live_process_on_this_host_keeps_its_lock(tmp_path):
  holder = os.getppid()  # a live process of this host other than this one (pytest's parent)
  helpers.write_lock(
    tmp_path,
    host=workdir_lock.socket.gethostname(),
    pid=holder,
    process_start=workdir_lock._process_start(holder),
    started="then",
  )
  old = time.time() - 10 * workdir_lock.STALE_AFTER_S
  os.utime(tmp_path / LOCK_NAME, (old, old))  # an old file, but a live holder
  with pytest.raises(errors.WorkdirLockedError, match=f"pid {holder}, started then"):
    with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
      pass


def test_a_dead_process_on_this_host_is_taken_over(tmp_path, caplog):
  helpers.write_dead_holders_lock(tmp_path)
  with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
  assert "Took over the lock" in caplog.text
  assert sorted(os.listdir(tmp_path)) == []  # the stale file was not left behind


def test_a_reused_pid_does_not_count_as_the_holder(tmp_path):
  # This very process, but started at another time: the pid was reused after the holder died.
  helpers.write_lock(
    tmp_path,
    host=workdir_lock.socket.gethostname(),
    pid=os.getpid(),
    process_start="12345",
    started="then",
  )
  with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
    pass


def _beating(path: str, every: float) -> tuple[threading.Thread, threading.Event]:
  """A holder on another host, alive: its heartbeat touches `path` every `every` s until the
  event is set (the test sets it once it has its answer, rather than sleeping out a fixed span)."""
  stop = threading.Event()

  def beat() -> None:
    while not stop.wait(every):
      os.utime(path)

  thread = threading.Thread(target=beat, daemon=True)
  thread.start()
  return thread, stop


def test_another_hosts_live_holder_keeps_its_lock(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lock, "STALE_AFTER_S", 3.0)
  monkeypatch.setattr(workdir_lock, "POLL_S", 0.05)
  path = helpers.write_lock(tmp_path, host="other-host", pid=1, started="then", token="theirs")
  beats, stop = _beating(path, every=0.3)
  start = time.monotonic()
  try:
    with pytest.raises(errors.WorkdirLockedError, match="host other-host, pid 1, started then"):
      with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
        pass
    assert time.monotonic() - start < 2.0  # refused at the first heartbeat seen, not after a wait
  finally:
    stop.set()
    beats.join()
  assert json.loads(open(path).read())["token"] == "theirs"


def test_another_hosts_silent_lock_is_taken_over_within_the_window(tmp_path, monkeypatch, caplog):
  """A new Colab runtime on a Drive workdir: the old runtime's lock is fresh but never touched
  again, so it is taken over after STALE_AFTER_S of silence, not refused."""
  monkeypatch.setattr(workdir_lock, "STALE_AFTER_S", 0.6)
  monkeypatch.setattr(workdir_lock, "POLL_S", 0.05)
  path = helpers.write_lock(tmp_path, host="dead-runtime", pid=1, started="then")
  start = time.monotonic()
  with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
    assert json.loads(open(path).read())["pid"] == os.getpid()
  assert 0.4 < time.monotonic() - start < 6.0  # the window was waited out, not skipped
  assert "Took over the lock" in caplog.text


def test_another_hosts_old_lock_is_taken_over_at_once(tmp_path):
  path = helpers.write_lock(tmp_path, host="other-host", pid=1, started="then")
  old = time.time() - workdir_lock.STALE_AFTER_S - 1
  os.utime(path, (old, old))
  start = time.monotonic()
  with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
    assert json.loads(open(path).read())["pid"] == os.getpid()
  assert time.monotonic() - start < workdir_lock.POLL_S * 3


def test_a_holder_whose_lock_was_taken_over_stops_before_saving(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lock, "HEARTBEAT_S", 0.05)
  path = tmp_path / LOCK_NAME
  with workdir_lock.WorkdirLock(Workdir(str(tmp_path))) as lock:
    lock.check_held()  # still ours
    path.write_text(json.dumps({"host": "newcomer", "pid": 7, "token": "theirs"}))
    deadline = time.time() + 10
    while lock.lost_to is None and time.time() < deadline:
      time.sleep(0.02)
    with pytest.raises(errors.WorkdirLockedError, match="host newcomer, pid 7"):
      lock.check_held()
  assert json.loads(path.read_text())["token"] == "theirs"  # the newcomer's lock is left alone


def test_the_heartbeat_keeps_a_long_job_fresh(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lock, "HEARTBEAT_S", 0.05)
  path = tmp_path / LOCK_NAME
  with workdir_lock.WorkdirLock(Workdir(str(tmp_path))):
    old = time.time() - 1000
    os.utime(path, (old, old))
    deadline = time.time() + 10
    while path.stat().st_mtime < time.time() - 100 and time.time() < deadline:
      time.sleep(0.02)
    assert path.stat().st_mtime > time.time() - 100
