"""One training job per workdir; a lock left by a dead job is taken over, a live one's never."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from flaxformer_nmt.run.folder import Workdir

import helpers

LOCK_NAME = os.path.basename(Workdir("").lock_path)  # train.lock


_CONTENDER = r"""
import os, sys, time
from flaxformer_nmt import errors
from flaxformer_nmt.training import lock as workdir_lock
from flaxformer_nmt.run.folder import Workdir

workdir, go, out, ready = sys.argv[1:5]
real_stale = workdir_lock.WorkdirLock._stale


def slow_stale(self, holder):
  # A slow filesystem or a descheduled process: time passes between judging the old record
  # stale and taking the lock over, while the other contenders judge it too.
  stale = real_stale(self, holder)
  time.sleep(0.3)
  return stale


workdir_lock.WorkdirLock._stale = slow_stale
open(os.path.join(ready, str(os.getpid())), "w").close()  # imported: waiting for the start
while not os.path.exists(go):
  time.sleep(0.005)
try:
  with workdir_lock.WorkdirLock(Workdir(workdir)):
    line = "won"
    # Hold it until every other contender has tried and reported (a loaded machine can be slow
    # to schedule them): one that came after a release would rightly win a free lock.
    deadline = time.time() + 60
    while time.time() < deadline:
      if os.path.exists(out) and len(open(out).read().split()) >= 11:
        break
      time.sleep(0.05)
except errors.WorkdirLockedError:
  line = "refused"
with open(out, "a") as f:
  f.write(line + "\n")
"""


def test_of_many_simultaneous_contenders_for_a_stale_lock_exactly_one_wins(tmp_path):
  """12 processes start together on the lock of a dead job: exactly one takes it over."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  helpers.write_dead_holders_lock(workdir)
  script, go, out = tmp_path / "contender.py", tmp_path / "go", tmp_path / "outcomes.txt"
  ready = tmp_path / "ready"
  ready.mkdir()
  script.write_text(_CONTENDER)
  args = [str(workdir), str(go), str(out), str(ready)]
  procs = [subprocess.Popen([sys.executable, str(script), *args]) for _ in range(12)]
  deadline = time.time() + 120
  while len(os.listdir(ready)) < 12 and time.time() < deadline:
    time.sleep(0.05)  # every contender imported and waiting for the start
  assert len(os.listdir(ready)) == 12, "contenders did not start"
  go.touch()
  for proc in procs:
    assert proc.wait(timeout=120) == 0
  outcomes = sorted(out.read_text().split())
  assert outcomes == ["refused"] * 11 + ["won"], outcomes
  assert not (workdir / LOCK_NAME).exists()  # the winner released it
