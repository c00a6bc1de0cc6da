"""The preemption guard: SIGTERM or a first Ctrl-C sets a flag the loop polls; handlers restored."""

from __future__ import annotations

import os
import signal

import pytest

from flaxformer_nmt.training import preemption


def test_preemption_guard_sets_a_flag_and_restores_handlers():
  before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
  with preemption.PreemptionGuard() as guard:
    assert not guard.should_stop(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.requested and guard.should_stop(2) and guard.signal_name == "SIGTERM"
    assert "SIGTERM" in guard.message(2)
  assert {sig: signal.getsignal(sig) for sig in before} == before

  with pytest.raises(KeyboardInterrupt):
    with preemption.PreemptionGuard() as guard:
      os.kill(os.getpid(), signal.SIGINT)
      assert guard.requested
      os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C exits now
  assert {sig: signal.getsignal(sig) for sig in before} == before
