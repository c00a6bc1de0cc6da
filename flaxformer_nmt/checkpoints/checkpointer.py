"""Checkpoints: save the train state and resume it exactly; read any checkpoint for inference.

A run of the big model spans days of preemptible accelerators, so the contract is: an interrupted
run, resumed, is bitwise the run that was never interrupted, and nothing already saved is lost.
What that takes here:

* Everything that determines the rest of the run is saved together, in orbax's format (no home-made
  one): the train state (step, params, Adam moments, base dropout key) as a PyTree item, and the
  input pipeline's position (and training time) as a JSON item. Arrays are host numpy copies of one
  replica, so a checkpoint does not depend on how many devices wrote it or will read it.
* Orbax writes each step into a temporary directory and renames it when complete, and deletes old
  steps (beyond `keep`) only after the new one is committed; a kill at any moment leaves the
  previous checkpoints intact (leftover temporary directories are cleaned at the next start).
* A read that fails is retried (storage on NFS or GCS has bad seconds). A checkpoint is set aside,
  to `<dir>/unreadable/<step>` with a warning naming it and the steps that costs, only on positive
  evidence that a file which is present is damaged: metadata that is not JSON, a truncated or
  checksum-failing array file. Then the previous one is restored; moving (not deleting) keeps it
  for inspection and lets the resumed run save that step number again. A *missing* file is not
  such evidence: on eventually consistent storage (GCS-FUSE, NFS) a host can list a step before it
  sees all its files. A miss is retried like any I/O error, and a read that still fails stops with
  a one-line error and leaves everything where it is: resuming from an older checkpoint would
  silently throw away work that is probably intact.
* A checkpoint of another model (trained as base, resumed as big) is not "unreadable": falling
  back past it would silently train something else, so it is a one-line error naming the first
  mismatching parameter and both shapes, found from the checkpoint's metadata before any array is
  read.

Every folder of checkpoints holds orbax step directories with a `state` item and a `data` item (an
average or `best/` stores `{"params": ...}` and a description of itself). `Checkpointer` writes
them during training; `reader.CheckpointDir` reads any of them; `write` writes one step at once
(averages, `best/`). Which folder of a workdir holds what is `run.folder.Workdir`'s.

Multi-process runs (`jax.distributed`): every process calls `save` and `restore`; orbax writes numpy
arrays and JSON from process 0 only, and synchronises the processes around each save. Which step
a restore reads is decided by process 0 alone (it also sets corrupt steps aside) and broadcast:
hosts that list a shared folder at different moments would otherwise restore different steps.
The decision to save is the same on all processes (a time-based one is taken on process 0 and
broadcast, since host clocks differ and a save that only some processes enter deadlocks).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from flaxformer_nmt.checkpoints.reader import (
  DATA_ITEM,
  STATE_ITEM,
  UNREADABLE,
  CheckpointDir,
  PyTree,
  from_state_dict,
  open_manager,
  state_dict,
)

# The barrier names of the two writing managers (reader.open_manager): the training checkpoints'
# asynchronous saves may still be finishing when `write` saves `best/` or an average.
TRAIN_BARRIERS, WRITE_BARRIERS = "train_checkpoints", "one_step_write"


def _host_leaf(x: Any) -> np.ndarray:
  dtype = getattr(x, "dtype", None)
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    raise ValueError(
      "Checkpointer.save() got a typed PRNG key (jax.random.key); store the raw uint32 key "
      "(jax.random.PRNGKey or jax.random.key_data) in the state instead."
    )
  # A copy, never a view: orbax writes asynchronously, after the loop has moved on and the
  # buffers a view would point into (donated to the next step on CPU) may be reused.
  return np.array(x)


def write(
  directory: str, step: int, tree: PyTree, data: Any, *, replace: bool = False, only: bool = False
) -> str:
  """Writes one step (`tree`'s arrays as host numpy, `data` as JSON) and waits until it is on disk.

  `replace` first deletes an existing step of that number; `only` deletes the folder's other
  steps once this one is complete (orbax renames a finished step into place, so a reader finds
  the old step or the new one, never half of one). Returns the step's path. Every process of a
  multi-process run calls it (orbax writes from process 0).
  """
  manager = open_manager(epath.Path(directory), barrier_prefix=WRITE_BARRIERS)
  try:
    if step in manager.all_steps():
      if not replace:
        raise ValueError(f"{directory} already holds step {step}.")
      logging.info("Replacing %s.", epath.Path(manager.directory) / str(step))
      manager.delete(step)
    host = jax.tree.map(_host_leaf, state_dict(tree))
    manager.save(
      step,
      args=ocp.args.Composite(
        **{STATE_ITEM: ocp.args.PyTreeSave(host), DATA_ITEM: ocp.args.JsonSave(data)}
      ),
      force=True,
    )
    manager.wait_until_finished()
    if only:
      for other in manager.all_steps():
        if other != step:
          manager.delete(other)
  finally:
    manager.close()
  return str(epath.Path(manager.directory) / str(step))


# ----------------------------------------------------------------------------- training


class Checkpointer:
  """Saves the train state every N steps / S seconds, keeps the last K, resumes the newest.

  `save` returns as soon as orbax has started writing (asynchronously), so training goes on while
  the big model's gigabytes go to disk; `wait_until_finished` or `close` make it durable. If the
  program ends without either (an exception), an exit hook finishes the write; only a kill -9
  or a crash of the interpreter leaves it unfinished, and then the previous checkpoints remain.
  The values come from `config.checks.validate`: `every_steps` and `every_secs` 0 mean "off".
  """

  def __init__(
    self, directory: str, *, keep: int, every_steps: int, every_secs: float = 0.0
  ) -> None:
    self._directory = epath.Path(os.path.abspath(directory))  # `--workdir=runs/x` is relative
    self._every_steps = every_steps
    self._every_secs = float(every_secs)
    self._manager = open_manager(self._directory, keep=keep, barrier_prefix=TRAIN_BARRIERS)
    self._reader = CheckpointDir(str(self._directory))  # reads with its own, local manager
    self._last_save_time = time.monotonic()
    self._closed = False
    self._pending = False  # a save was started and not waited for
    _run_before_thread_shutdown(functools.partial(_close_at_exit, weakref.ref(self)))

  @property
  def directory(self) -> str:
    return str(self._directory)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def _due(self, step: int, check_clock: bool) -> bool:
    """Every `every_steps` steps, or once `every_secs` seconds have passed since the last save.

    The time-based test is a collective with several processes (process 0's clock decides), so
    `check_clock=False` skips it where not every process asks.
    """
    if self._every_steps and step % self._every_steps == 0:
      return True
    if not self._every_secs or not check_clock:
      return False
    due = time.monotonic() - self._last_save_time >= self._every_secs
    if jax.process_count() > 1:
      due = bool(multihost_utils.broadcast_one_to_all(np.asarray(due)))
    return due

  def save(
    self,
    step: int,
    make: Callable[[], tuple[PyTree, dict[str, Any]]],
    *,
    force: bool = False,
    check_clock: bool = True,
  ) -> bool:
    """The one save decision: saves step `step` if it is due (or `force`) and not saved yet.

    `make()` returns (the state as one host copy, not replicated; the JSON data item); it is
    called only when saving, since copying the state to the host and gathering the input
    positions cost time (and are collectives in multi-process runs). Returns whether a save
    started.
    """
    step = int(step)
    latest = self.latest_step()
    if step <= 0 or (latest is not None and step <= latest):
      if force and latest is not None and step < latest:
        logging.warning(
          "Not saving step %d: %s already holds step %d.", step, self._directory, latest
        )
      return False
    if not force and not self._due(step, check_clock):
      return False
    state, data_state = make()
    host_state = self._host_state(step, state)
    try:
      data = json.loads(json.dumps(data_state))
    except (TypeError, ValueError) as e:
      raise ValueError(
        f"Checkpointer.save(): the data position is not JSON-serialisable: {e}"
      ) from e
    self._manager.save(
      step,
      args=ocp.args.Composite(
        **{STATE_ITEM: ocp.args.PyTreeSave(host_state), DATA_ITEM: ocp.args.JsonSave(data)}
      ),
      force=True,
    )
    self._last_save_time = time.monotonic()
    self._pending = True
    logging.info("Saving checkpoint for step %d to %s.", step, self._reader.path(step))
    return True

  @staticmethod
  def _host_state(step: int, state: PyTree) -> PyTree:
    """Numpy copies of the state's leaves, after checking it is what a checkpoint should hold."""
    state_sd = state_dict(state)
    if isinstance(state_sd, dict) and "step" in state_sd:
      state_step = np.asarray(jax.device_get(state_sd["step"]))
      if state_step.ndim:
        raise ValueError(
          f"Checkpointer.save() got a replicated state (step has shape {state_step.shape}); pass "
          "one host copy (parallel.local_replica(state))."
        )
      if int(state_step) != step:
        raise ValueError(
          f"Checkpointer.save(step={step}) got a state whose step is {int(state_step)}; they "
          "must agree, or a resumed run would replay or skip batches."
        )
    return jax.tree.map(_host_leaf, state_sd)

  def restore(self, template: PyTree) -> tuple[PyTree, dict[str, Any], int] | None:
    """(state, data item, step) of the newest readable checkpoint; None when none is saved.

    `template` gives the structure, shapes and dtypes (real arrays or jax.ShapeDtypeStruct, e.g.
    from jax.eval_shape); the result holds numpy arrays, ready to be replicated.
    """
    found = self._reader.newest_readable(
      state_dict(template), with_data=True, on_corrupt=self._move_aside
    )
    self._manager.reload()  # steps process 0 set aside are gone for every process
    if found is None:
      return None
    step, state_sd, data = found
    self._last_save_time = time.monotonic()
    logging.info("Restored step %d from %s.", step, self._reader.path(step))
    return from_state_dict(template, state_sd), data, step

  def _move_aside(self, step: int, path: epath.Path) -> str:
    """Moves a corrupt step to `unreadable/`, so the run can save that step number again."""
    # Process 0 alone decides what to restore (CheckpointDir.newest_readable), so only it gets here;
    # the others reload their listing once it has decided.
    dest = self._directory / UNREADABLE / str(step)
    if dest.exists():
      dest = self._directory / UNREADABLE / f"{step}.{int(time.time())}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    path.rename(dest)
    self._reader.manager.reload()
    return f"; moved it to {dest}"

  def wait_until_finished(self) -> None:
    """Blocks until the last save is on disk (call before exiting or reading it elsewhere)."""
    self._manager.wait_until_finished()
    self._pending = False

  def close(self) -> None:
    """Finishes pending saves and releases orbax's threads (idempotent)."""
    if not self._closed:
      self._closed = True
      self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()


def _close_at_exit(ref: weakref.ref) -> None:
  ckpt = ref()
  if ckpt is None or ckpt._closed:  # pylint: disable=protected-access
    return
  if ckpt._pending:  # pylint: disable=protected-access
    logging.info("Finishing the checkpoint being written to %s before exiting.", ckpt.directory)
  ckpt.close()


def _run_before_thread_shutdown(fn: Callable[[], None]) -> None:
  """Runs `fn` at interpreter exit, before thread pools stop taking work.

  A run that ends by an exception (a non-finite loss, a failing eval) would otherwise exit with
  an asynchronous save in flight: orbax's commit then fails with "cannot schedule new futures after
  shutdown" and the checkpoint the error message points to never lands. `atexit` is too late for
  this (thread pools shut down before it runs); `threading._register_atexit` is the hook
  concurrent.futures itself uses, and hooks run newest first, so ours runs before its shutdown.
  """
  getattr(threading, "_register_atexit", atexit.register)(fn)
