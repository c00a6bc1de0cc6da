"""Checkpoints: save the train state and resume it exactly (averaging: averaging.py).

A run of the big model spans days of preemptible accelerators, so the contract is: an interrupted
run, resumed, is bitwise the run that was never interrupted, and nothing already saved is lost.
What that takes here:

* Everything that determines the rest of the run is saved together, in orbax's format (no home-made
  one): the train state (step, params, Adam moments, base dropout key) as a PyTree item, and the
  input pipeline's position as a JSON item. Arrays are host numpy copies of replica 0, so a
  checkpoint does not depend on how many devices wrote it or will read it.
* Orbax writes each step into a temporary directory and renames it when complete, and deletes old
  steps (beyond `keep`) only after the new one is committed; a kill at any moment leaves the
  previous checkpoints intact (leftover temporary directories are cleaned at the next start).
* A checkpoint that is there but cannot be read (truncated or missing files: a full disk, a broken
  copy) is moved aside to `<dir>/unreadable/<step>` with a warning naming it, and the previous one
  is restored. Moving, not deleting, keeps it for inspection; moving at all lets the resumed run
  save that step number again, and a rerun does not trip on it forever.
* A checkpoint of another model (trained as base, resumed as big) is not "unreadable": falling
  back past it would silently train something else, so it is a one-line error naming the first
  mismatching parameter and both shapes, found from the checkpoint's metadata before any array is
  read.

Layout under a workdir: `checkpoints/<step>/` (training) and `averaged/<step>/` (the mean of the
last K training checkpoints' params, named after the newest of them), both orbax step directories
with a `state` item and a `data` item (the averaged one stores `{"params": ...}` and a description).

Multi-process runs (`jax.distributed`): every process calls `save` and `restore`; orbax writes numpy
arrays and JSON from process 0 only, and synchronises the processes around each save. Everything
passed to `save` must therefore be identical on all processes, the data position included (a
global position, not a per-host one). The time-based save decision is taken on process 0 and
broadcast, since host clocks differ and a save that only some processes enter deadlocks.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import flax.serialization
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from flaxformer_nmt.preemption import PreemptionGuard  # re-exported: train.py uses it from here

__all__ = [
    "AVERAGED", "CHECKPOINTS", "CheckpointError", "CheckpointMismatchError", "Checkpointer",
    "PreemptionGuard", "UNREADABLE", "WHICH", "averaged_dir", "checkpoint_dir",
]

CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"
UNREADABLE = "unreadable"
_STATE = "state"  # orbax item: the train state's PyTree (or {"params": ...} when averaged)
_DATA = "data"  # orbax item: JSON (input position; the averaging description)
WHICH = ("auto", "latest", "averaged")

PyTree = Any


class CheckpointError(Exception):
  """A checkpoint problem the user must resolve; the message is one line naming the path."""


class CheckpointMismatchError(CheckpointError, ValueError):
  """A checkpoint's shapes or parameter names differ from the model's (another configuration)."""


class _Unreadable(Exception):
  """A checkpoint directory that exists but cannot be read; the reason is one line."""

  def __init__(self, path: epath.Path, cause: object) -> None:
    self.path = path
    self.reason = " ".join(str(cause).split())[:300] or type(cause).__name__
    super().__init__(f"{path}: {self.reason}")


def checkpoint_dir(workdir: str) -> str:
  """Where training checkpoints of `workdir` live."""
  return str(epath.Path(workdir) / CHECKPOINTS)


def averaged_dir(workdir: str) -> str:
  """Where `averaging.save_averaged` writes the averaged parameters of `workdir`."""
  return str(epath.Path(workdir) / AVERAGED)


# ----------------------------------------------------------------------------- pytree helpers


def _state_dict(tree: PyTree) -> PyTree:
  """Plain nested dicts (dataclass fields, optax namedtuples by name, tuples by index).

  Storing this rather than the Python objects keeps checkpoints readable if TrainState or optax's
  state classes change, and gives parameter paths like `params/encoder/layer_0/...` in errors.
  """
  return flax.serialization.to_state_dict(tree)


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


def _abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
  dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
  return jax.ShapeDtypeStruct(np.shape(x), dtype)


def _path_str(path: Sequence[Any]) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _flatten(tree: PyTree, *, metadata: bool = False) -> dict[str, Any]:
  """`{"params/encoder/...": leaf}`; for orbax metadata trees, every non-container is a leaf."""
  is_leaf = (lambda x: not isinstance(x, (dict, list, tuple))) if metadata else None
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {_path_str(path): leaf for path, leaf in flat}


def _check_matches(ckpt: epath.Path, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
  """Raises CheckpointMismatchError naming the first parameter whose name or shape differs.

  `params/...` are checked first: a user who changed the model size wants to hear about a weight
  matrix, not about the Adam moment that happens to sort first.
  """
  order = [p for p in wanted if p.startswith("params/")]
  order += [p for p in wanted if not p.startswith("params/")]
  hint = "was it trained with another --config or model size?"
  for path in order:
    want = tuple(wanted[path].shape)
    if path not in saved:
      raise CheckpointMismatchError(
          f"Checkpoint {ckpt} does not match the model: it has no {path} (shape {want} in the "
          f"model); {hint}"
      )
    have = tuple(getattr(saved[path], "shape", ()) or ())
    if have != want:
      raise CheckpointMismatchError(
          f"Checkpoint {ckpt} does not match the model: {path} has shape {have} in the checkpoint "
          f"but {want} in the model; {hint}"
      )
  extra = [p for p in saved if p not in wanted]
  if extra:
    shape = tuple(getattr(saved[extra[0]], "shape", ()) or ())
    raise CheckpointMismatchError(
        f"Checkpoint {ckpt} does not match the model: it has {extra[0]} (shape {shape}), which the "
        f"model lacks; {hint}"
    )


# ----------------------------------------------------------------------------- reading


def _manager(
    directory: epath.Path, *, keep: int | None = None, read_only: bool = False
) -> ocp.CheckpointManager:
  """An orbax manager with our two items; read-only managers create and clean nothing."""
  directory = epath.Path(os.path.abspath(directory))  # orbax rejects relative paths
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      save_interval_steps=0 if read_only else 1,  # our own should_save decides; orbax is forced
      create=not read_only,
      read_only=read_only,
      cleanup_tmp_directories=not read_only,
      enable_async_checkpointing=not read_only,
  )
  return ocp.CheckpointManager(
      directory,
      options=options,
      item_handlers={_STATE: ocp.PyTreeCheckpointHandler(), _DATA: ocp.JsonCheckpointHandler()},
  )


def _step_path(manager: ocp.CheckpointManager, step: int) -> epath.Path:
  return epath.Path(manager.directory) / str(step)


def _read_step(
    manager: ocp.CheckpointManager, step: int, template_sd: PyTree, *, with_data: bool
) -> tuple[PyTree, Any]:
  """Reads one step as host arrays shaped like `template_sd` (a subtree of the saved state).

  Raises CheckpointMismatchError (from metadata, before reading arrays) or _Unreadable.
  """
  path = _step_path(manager, step)
  for item in (_STATE, _DATA) if with_data else (_STATE,):
    if not (path / item).is_dir():
      raise _Unreadable(path, f"its {item}/ directory is missing")
  try:
    metadata = manager.item_metadata(step)[_STATE]
  except Exception as e:  # pylint: disable=broad-except  (any failure to read is "unreadable")
    raise _Unreadable(path, e) from e
  if metadata is None:
    raise _Unreadable(path, "its array metadata (state/_METADATA) is missing")
  saved = _flatten(getattr(metadata, "tree", metadata), metadata=True)
  wanted = _flatten(template_sd)
  prefixes = {p.split("/")[0] for p in wanted}
  saved = {p: m for p, m in saved.items() if p.split("/")[0] in prefixes}
  _check_matches(path, saved, wanted)

  abstract = jax.tree.map(_abstract_leaf, template_sd)
  restore_args = jax.tree.map(
      lambda a: ocp.RestoreArgs(restore_type=np.ndarray, dtype=a.dtype), abstract
  )
  items = {
      _STATE: ocp.args.PyTreeRestore(abstract, restore_args=restore_args, partial_restore=True)
  }
  if with_data:
    items[_DATA] = ocp.args.JsonRestore()
  try:
    restored = manager.restore(step, args=ocp.args.Composite(**items))
  except Exception as e:  # pylint: disable=broad-except
    raise _Unreadable(path, e) from e
  return restored[_STATE], (restored[_DATA] if with_data else None)


def _newest_readable(
    manager: ocp.CheckpointManager,
    template_sd: PyTree,
    *,
    with_data: bool,
    on_unreadable: Callable[[int, epath.Path], str] | None = None,
) -> tuple[int, PyTree, Any] | None:
  """The newest step that reads, warning about (and handing over) each unreadable newer one."""
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    return None
  bad: list[str] = []
  for step in steps:
    try:
      state_sd, data = _read_step(manager, step, template_sd, with_data=with_data)
    except _Unreadable as e:
      moved = on_unreadable(step, e.path) if on_unreadable else ""
      logging.warning(
          "Checkpoint %s is unreadable (%s)%s; falling back to the previous one.",
          e.path, e.reason, moved,
      )
      bad.append(str(e.path))
      continue
    return step, state_sd, data
  raise CheckpointError(
      f"None of the {len(steps)} checkpoints in {manager.directory} could be read "
      f"({', '.join(bad)}); see the warnings above."
  )


# ----------------------------------------------------------------------------- training


class Checkpointer:
  """Saves the train state every N steps / S seconds, keeps the last K, resumes the newest.

  `save` returns as soon as orbax has started writing (asynchronously), so training goes on while
  the big model's gigabytes go to disk; `wait_until_finished` or `close` make it durable. If the
  program ends without either (an exception), an exit hook finishes the write; only a kill -9
  or a crash of the interpreter leaves it unfinished, and then the previous checkpoints remain.
  """

  def __init__(
      self, directory: str, *, keep: int, every_steps: int, every_secs: float = 0.0
  ) -> None:
    if keep < 1:
      raise ValueError(f"config.keep_checkpoints must be >= 1, got {keep}.")
    if every_steps < 0:
      raise ValueError(f"config.checkpoint_every_steps must be >= 0 (0: off), got {every_steps}.")
    if every_secs < 0:
      raise ValueError(f"config.checkpoint_every_secs must be >= 0 (0: off), got {every_secs}.")
    self._directory = epath.Path(os.path.abspath(directory))  # `--workdir=runs/x` is relative
    if self._directory.exists() and not self._directory.is_dir():
      raise ValueError(f"Checkpoint directory {directory} exists and is not a directory.")
    self._every_steps = every_steps
    self._every_secs = float(every_secs)
    self._manager = _manager(self._directory, keep=keep)
    self._last_save_time = time.monotonic()
    self._quarantines = 0
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

  def should_save(self, step: int, *, check_clock: bool = True) -> bool:
    """Every `every_steps` steps, or once `every_secs` seconds have passed since the last save.

    `check_clock=False` skips the time-based test: with several processes it is a collective, and
    the training loop takes it only at steps where it waits for the device anyway.
    """
    latest = self.latest_step()
    if step <= 0 or (latest is not None and step <= latest):
      return False
    if self._every_steps and step % self._every_steps == 0:
      return True
    if not self._every_secs or not check_clock:
      return False
    due = time.monotonic() - self._last_save_time >= self._every_secs
    if jax.process_count() > 1:
      # One clock decides for everyone (see the module docstring).
      due = bool(multihost_utils.broadcast_one_to_all(np.asarray(due)))
    return due

  def save(
      self, step: int, state: PyTree, data_state: dict[str, Any], *, force: bool = False
  ) -> bool:
    """Starts saving `state` (a host copy, not replicated) and the input position, if due.

    `force` saves regardless of the schedule (end of training, preemption). A step already saved
    is not written twice. Returns whether a save was started.
    """
    step = int(step)
    if not force and not self.should_save(step):
      return False
    latest = self.latest_step()
    if latest is not None and step <= latest:
      if step < latest:
        logging.warning(
            "Not saving step %d: %s already holds step %d.", step, self._directory, latest
        )
      return False
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
            **{_STATE: ocp.args.PyTreeSave(host_state), _DATA: ocp.args.JsonSave(data)}
        ),
        force=True,
    )
    self._last_save_time = time.monotonic()
    self._pending = True
    logging.info("Saving checkpoint for step %d to %s.", step, _step_path(self._manager, step))
    return True

  @staticmethod
  def _host_state(step: int, state: PyTree) -> PyTree:
    """Numpy copies of the state's leaves, after checking it is what a checkpoint should hold."""
    state_sd = _state_dict(state)
    if isinstance(state_sd, dict) and "step" in state_sd:
      state_step = np.asarray(jax.device_get(state_sd["step"]))
      if state_step.ndim:
        raise ValueError(
            f"Checkpointer.save() got a replicated state (step has shape {state_step.shape}); pass "
            "the host copy of replica 0 (parallel.local_replica(state))."
        )
      if int(state_step) != step:
        raise ValueError(
            f"Checkpointer.save(step={step}) got a state whose step is {int(state_step)}; they "
            "must agree, or a resumed run would replay or skip batches."
        )
    return jax.tree.map(_host_leaf, state_sd)

  def restore(self, template: PyTree) -> tuple[PyTree, dict[str, Any], int] | None:
    """(state, data position, step) of the newest readable checkpoint; None when none is saved.

    `template` gives the structure, shapes and dtypes (real arrays or jax.ShapeDtypeStruct, e.g.
    from jax.eval_shape); the result holds numpy arrays, ready to be replicated.
    """
    template_sd = _state_dict(template)
    found = _newest_readable(
        self._manager, template_sd, with_data=True, on_unreadable=self._move_aside
    )
    if found is None:
      return None
    step, state_sd, data = found
    self._last_save_time = time.monotonic()
    logging.info("Restored step %d from %s.", step, _step_path(self._manager, step))
    return flax.serialization.from_state_dict(template, state_sd), data, step

  def _move_aside(self, step: int, path: epath.Path) -> str:
    """Moves an unreadable step to `unreadable/`, so the run can save that step number again."""
    dest = self._directory / UNREADABLE / str(step)
    if dest.exists():
      dest = self._directory / UNREADABLE / f"{step}.{int(time.time())}"
    if jax.process_index() == 0:
      dest.parent.mkdir(parents=True, exist_ok=True)
      path.rename(dest)
    if jax.process_count() > 1:
      self._quarantines += 1
      ocp.multihost.sync_global_processes(f"flaxformer_nmt_unreadable_{step}_{self._quarantines}")
    self._manager.reload()
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


# ----------------------------------------------------------------------------- inference
