"""Turns SIGTERM / Ctrl-C into a flag the training loop checks between steps.

A preemptible job gets SIGTERM some seconds before it is killed. Dying inside a step, or inside an
asynchronous checkpoint write, throws away everything since the last periodic save; finishing the
step in flight, saving and exiting with status 0 loses nothing and tells the scheduler the job
ended cleanly. The handlers only set a flag (a signal handler must not run JAX or I/O), and the
loop acts on it at the next step boundary:

  with preemption.PreemptionGuard() as guard:
    for step in ...:
      state = train_step(state, batch)
      if guard.should_stop(step):
        ckpt.save(step, host_state, data_position, force=True)
        ckpt.wait_until_finished()
        logging.info(guard.message(step))
        return

Multi-process runs: every process must stop at the same step, or the next collective (or orbax's
save barrier) deadlocks. A local flag cannot give that, since each host gets its signal at a
different moment, so with `jax.process_count() > 1` the guard leaves SIGTERM to JAX's preemption
service (started by `jax.distributed.initialize`, `jax_enable_preemption_service`, on by default):
its notifier catches SIGTERM on any host, the hosts agree on a step, and
`multihost_utils.reached_preemption_sync_point(step)` turns True on all of them at that step.
Installing a Python SIGTERM handler there would replace the service's handler and break that
agreement. SIGINT is still caught and logged, but a lone Ctrl-C on one host does not stop a
multi-process run.
"""

from __future__ import annotations

import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import jax
from absl import logging
from jax.experimental import multihost_utils

_Handler = Callable[[int, types.FrameType | None], Any] | int | None


class PreemptionGuard:
  """Context manager: SIGTERM / SIGINT set `requested`; the previous handlers come back on exit.

  A second Ctrl-C while a save is pending is handed to the previous SIGINT handler (by default a
  KeyboardInterrupt), so a user who really wants out is never stuck behind a slow save.
  """

  def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    self._signals = signals
    self._previous: dict[int, _Handler] = {}
    self._signal_name: str | None = None
    self._multi_process = False

  @property
  def requested(self) -> bool:
    """True once a stop signal arrived in this process."""
    return self._signal_name is not None

  @property
  def signal_name(self) -> str | None:
    return self._signal_name

  def __enter__(self) -> PreemptionGuard:
    self._multi_process = jax.process_count() > 1
    if threading.current_thread() is not threading.main_thread():
      # Python only lets the main thread install handlers; say so instead of failing the run.
      logging.warning("PreemptionGuard outside the main thread: signals are not caught.")
      return self
    for sig in self._signals:
      if sig == signal.SIGTERM and self._multi_process:
        continue  # JAX's preemption service owns SIGTERM (see the module docstring).
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc_info: object) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    self._previous.clear()

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    name = signal.Signals(signum).name
    if self._signal_name is not None and signum == signal.SIGINT:
      previous = self._previous.get(signum)
      if callable(previous):
        previous(signum, frame)
        return
      raise KeyboardInterrupt
    if self._signal_name is None:
      self._signal_name = name
    # absl logging takes locks, which a handler interrupting a log call would deadlock on; a
    # plain write to stderr is safe here.
    sys.stderr.write(
      f"Received {name}: saving a checkpoint at the end of this step, then exiting"
      + (" (Ctrl-C again to exit now)" if signum == signal.SIGINT else "")
      + ".\n"
    )

  def should_stop(self, step: int) -> bool:
    """Whether to save and exit after `step`; all processes get the same answer at the same step.

    Call it at every step (the multi-process sync point requires it).
    """
    if self._multi_process:
      return multihost_utils.reached_preemption_sync_point(step)
    return self.requested

  def message(self, step: int) -> str:
    """The line the loop logs on its way out."""
    cause = self._signal_name or "a preemption notice"
    return (
      f"Stopped by {cause} after step {step}; checkpoint saved. Rerun the same command to resume."
    )
