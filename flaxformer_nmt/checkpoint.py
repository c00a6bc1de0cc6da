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

Layout under a workdir: `checkpoints/<step>/` (training) and `averaged/<step>/` (the mean of the
last K training checkpoints' params, named after the newest of them), both orbax step directories
with a `state` item and a `data` item (the averaged one stores `{"params": ...}` and a description).
`Checkpointer` writes the first during training; `CheckpointDir` reads either; `write` writes one
step at once (averaging).

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
from collections.abc import Callable, Sequence
from typing import Any

import flax.serialization
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from flaxformer_nmt.errors import CheckpointError, CheckpointMismatchError

CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"
UNREADABLE = "unreadable"
_STATE = "state"  # orbax item: the train state's PyTree (or {"params": ...} when averaged)
_DATA = "data"  # orbax item: JSON (input position, training time; the averaging description)
WHICH = ("auto", "latest", "averaged")
# Waits before the second and third attempt at a read that failed without showing corruption.
RETRY_DELAYS_S = (1.0, 5.0)
# Status codes (tensorstore) and messages with which a checkpoint's own files show it is damaged.
# A missing file (NOT_FOUND, "No such file") is not among them: see the module docstring.
_CORRUPTION_SIGNS = (
  "DATA_LOSS",
  "OUT_OF_RANGE",
  "Expecting value",
  "JSONDecodeError",
  "checksum",
)
_MISSING_SIGNS = ("NOT_FOUND", "No such file", "is missing")

PyTree = Any


class Unreadable(CheckpointError):
  """A checkpoint that exists but cannot be read. `corrupt`: its own files show damage."""

  def __init__(self, path: epath.Path, cause: object, *, corrupt: bool) -> None:
    self.path = path
    self.reason = " ".join(str(cause).split())[:300] or type(cause).__name__
    self.corrupt = corrupt
    self.missing = isinstance(cause, FileNotFoundError) or any(
      sign in str(cause) for sign in _MISSING_SIGNS
    )
    super().__init__(f"{path}: {self.reason}")


def _shows_corruption(e: BaseException) -> bool:
  """Positive evidence that a file which is present is damaged (never a missing file)."""
  if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
    return True
  if isinstance(e, OSError):
    return False  # ENOENT, EIO, ETIMEDOUT, ESTALE...: the storage, not the checkpoint
  message = str(e)
  if any(sign in message for sign in _MISSING_SIGNS):
    return False
  return any(sign in message for sign in _CORRUPTION_SIGNS)


def checkpoint_dir(workdir: str) -> str:
  """Where training checkpoints of `workdir` live."""
  return str(epath.Path(workdir) / CHECKPOINTS)


def averaged_dir(workdir: str) -> str:
  """Where `averaging.save_averaged` writes the averaged parameters of `workdir`."""
  return str(epath.Path(workdir) / AVERAGED)


# ----------------------------------------------------------------------------- pytree helpers


def state_dict(tree: PyTree) -> PyTree:
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
  """An orbax manager with our two items; read-only managers create and clean nothing.

  A read-only manager is this process's own: orbax's restore ends in a barrier across the
  processes of the job, which would make a read that one process does alone (process 0 choosing
  the step to resume) wait forever. Reads share nothing between processes, so none is needed.
  """
  directory = epath.Path(os.path.abspath(directory))  # orbax rejects relative paths
  local = ocp.options.MultiprocessingOptions(
    primary_host=jax.process_index(), active_processes={jax.process_index()}
  )
  options = ocp.CheckpointManagerOptions(
    max_to_keep=keep,
    save_interval_steps=0 if read_only else 1,  # our own `due` decides; orbax is forced
    create=not read_only,
    read_only=read_only,
    cleanup_tmp_directories=not read_only,
    enable_async_checkpointing=not read_only,
    **({"multiprocessing_options": local} if read_only else {}),
  )
  return ocp.CheckpointManager(
    directory,
    options=options,
    item_handlers={_STATE: ocp.PyTreeCheckpointHandler(), _DATA: ocp.JsonCheckpointHandler()},
  )


def _with_retries(path: epath.Path, read: Callable[[], Any]) -> Any:
  """`read()`, retried after a failure that does not show corruption; Unreadable in the end."""
  for attempt, delay in enumerate((*RETRY_DELAYS_S, None)):
    try:
      return read()
    except CheckpointMismatchError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (classified right here)
      corrupt = _shows_corruption(e)
      if corrupt or delay is None:
        raise Unreadable(path, e, corrupt=corrupt) from e
      logging.warning(
        "Reading %s failed (%s); attempt %d of %d in %.0fs.",
        path,
        " ".join(str(e).split())[:200],
        attempt + 2,
        len(RETRY_DELAYS_S) + 1,
        delay,
      )
      time.sleep(delay)
  raise AssertionError("unreachable")


class CheckpointDir:
  """Reads the orbax step directories under one folder (training checkpoints, or averaged ones).

  Read-only: it creates, cleans and moves nothing, so it is safe beside a training job.
  """

  def __init__(self, directory: str) -> None:
    self.directory = epath.Path(os.path.abspath(directory))
    self._manager: ocp.CheckpointManager | None = None

  @property
  def manager(self) -> ocp.CheckpointManager | None:
    if self._manager is None and self.directory.is_dir():
      self._manager = _manager(self.directory, read_only=True)
    return self._manager

  def steps(self) -> list[int]:
    """Committed steps, oldest first (none if the folder does not exist)."""
    return sorted(self.manager.all_steps()) if self.manager is not None else []

  def path(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def read(self, step: int, template: PyTree, *, with_data: bool = False) -> tuple[PyTree, Any]:
    """(arrays shaped like `template`, the JSON item or None) of one step, as host numpy.

    `template` is a state dict (nested dicts: `state_dict(...)`), possibly a subtree of what was
    saved (e.g. `{"params": ...}`); leaves may be arrays or jax.ShapeDtypeStruct. Raises
    CheckpointMismatchError (from metadata, before reading arrays) or Unreadable.
    """
    path, manager = self.path(step), self.manager
    items_wanted = (_STATE, _DATA) if with_data else (_STATE,)

    def require_items() -> None:
      for item in items_wanted:
        if not (path / item).is_dir():
          raise FileNotFoundError(f"its {item}/ directory is missing")

    _with_retries(path, require_items)
    self.check_matches(step, template)

    abstract = jax.tree.map(_abstract_leaf, template)
    restore_args = jax.tree.map(
      lambda a: ocp.RestoreArgs(restore_type=np.ndarray, dtype=a.dtype), abstract
    )
    items = {
      _STATE: ocp.args.PyTreeRestore(abstract, restore_args=restore_args, partial_restore=True)
    }
    if with_data:
      items[_DATA] = ocp.args.JsonRestore()
    restored = _with_retries(path, lambda: manager.restore(step, args=ocp.args.Composite(**items)))
    return restored[_STATE], (restored[_DATA] if with_data else None)

  def check_matches(self, step: int, template: PyTree) -> None:
    """CheckpointMismatchError if `step`'s parameter names or shapes differ from `template`'s.

    Reads the metadata only (no arrays), so a resume or an evaluation with the wrong --config
    stops before any data is read. Unreadable if the metadata cannot be read.
    """
    path = self.path(step)

    def read_metadata() -> Any:
      metadata = self.manager.item_metadata(step)[_STATE]
      if metadata is None:
        raise FileNotFoundError("its array metadata (state/_METADATA) is missing")
      return metadata

    metadata = _with_retries(path, read_metadata)
    saved = _flatten(getattr(metadata, "tree", metadata), metadata=True)
    wanted = _flatten(template)
    prefixes = {p.split("/")[0] for p in wanted}
    saved = {p: m for p, m in saved.items() if p.split("/")[0] in prefixes}
    _check_matches(path, saved, wanted)

  def newest_readable(
    self,
    template: PyTree,
    *,
    with_data: bool,
    on_corrupt: Callable[[int, epath.Path], str] | None = None,
  ) -> tuple[int, PyTree, Any] | None:
    """(step, tree, data) of the newest step that reads; None if there is none at all.

    A corrupt step is passed to `on_corrupt` (which may move it and says how in its return value)
    and skipped with a warning naming it; any other failure is a CheckpointError, nothing moved.
    In a multi-process run process 0 alone looks for that step (and sets corrupt ones aside), then
    every process reads the step it found, or all stop with one line.
    """
    if jax.process_count() == 1:
      return self._newest_readable_here(template, with_data=with_data, on_corrupt=on_corrupt)
    return self._newest_readable_agreed(template, with_data=with_data, on_corrupt=on_corrupt)

  def _newest_readable_here(
    self,
    template: PyTree,
    *,
    with_data: bool,
    on_corrupt: Callable[[int, epath.Path], str] | None,
  ) -> tuple[int, PyTree, Any] | None:
    steps = self.steps()[::-1]
    if not steps:
      return None
    bad: list[int] = []
    for step in steps:
      try:
        tree, data = self.read(step, template, with_data=with_data)
      except Unreadable as e:
        if not e.corrupt:
          raise CheckpointError(_not_moved_message(e, self.directory)) from e
        moved = on_corrupt(step, e.path) if on_corrupt else ""
        logging.warning(
          "Checkpoint %s is corrupt (%s)%s; falling back to the previous one.",
          e.path,
          e.reason,
          moved,
        )
        bad.append(step)
        continue
      if bad:
        logging.warning(
          "Resuming from step %d, not from the corrupt step %s: %d steps will be trained again.",
          step,
          ", ".join(map(str, bad)),
          bad[0] - step,
        )
      return step, tree, data
    raise CheckpointError(
      f"None of the {len(steps)} checkpoints in {self.directory} could be read (corrupt: steps "
      f"{', '.join(map(str, bad))}); see the warnings above."
    )

  def _newest_readable_agreed(
    self,
    template: PyTree,
    *,
    with_data: bool,
    on_corrupt: Callable[[int, epath.Path], str] | None,
  ) -> tuple[int, PyTree, Any] | None:
    """`newest_readable` for several processes: process 0 chooses, everyone reads that step."""
    found, failure = None, ""
    if jax.process_index() == 0:
      try:
        found = self._newest_readable_here(template, with_data=with_data, on_corrupt=on_corrupt)
      except CheckpointError as e:
        failure = str(e)
    code = -2 if failure else (found[0] if found else -1)
    chosen = int(multihost_utils.broadcast_one_to_all(np.asarray(code, np.int32)))
    if self.manager is not None:
      self.manager.reload()  # what process 0 set aside
    if chosen == -2:
      raise CheckpointError(
        failure or f"Process 0 could not restore from {self.directory}: see its log."
      )
    if chosen == -1:
      return None
    if found is None:
      try:
        found = (chosen, *self.read(chosen, template, with_data=with_data))
      except Unreadable as e:
        failure = _not_moved_message(e, self.directory)
    failed = np.asarray(multihost_utils.process_allgather(np.asarray(bool(failure)))).reshape(-1)
    if failed.any():
      which = ", ".join(str(i) for i in np.flatnonzero(failed))
      raise CheckpointError(
        failure
        or f"Process(es) {which} could not read checkpoint {self.path(chosen)}, which process 0 "
        "restores (see their logs); nothing was moved."
      )
    return found


def _not_moved_message(e: Unreadable, directory: epath.Path) -> str:
  """The one line for a checkpoint that failed to read without showing damage."""
  if e.missing:
    return (
      f"Could not read checkpoint {e.path} after {len(RETRY_DELAYS_S) + 1} attempts ({e.reason}). "
      "A missing file is not taken as damage (shared storage can be late to show one), so "
      "nothing was moved: rerun when the storage shows it, or move the step into "
      f"{directory / UNREADABLE} to resume from the previous checkpoint."
    )
  return (
    f"Could not read checkpoint {e.path} after {len(RETRY_DELAYS_S) + 1} attempts ({e.reason}); "
    "its files look intact, so nothing was moved. Rerun when the storage answers."
  )


def write(directory: str, step: int, tree: PyTree, data: Any, *, replace: bool = False) -> str:
  """Writes one step (`tree`'s arrays as host numpy, `data` as JSON) and waits until it is on disk.

  `replace` first deletes an existing step of that number. Returns the step's path. Every process
  of a multi-process run calls it (orbax writes from process 0).
  """
  manager = _manager(epath.Path(directory))
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
        **{_STATE: ocp.args.PyTreeSave(host), _DATA: ocp.args.JsonSave(data)}
      ),
      force=True,
    )
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
  The values come from `config_lib.validate`: `every_steps` and `every_secs` 0 mean "off".
  """

  def __init__(
    self, directory: str, *, keep: int, every_steps: int, every_secs: float = 0.0
  ) -> None:
    self._directory = epath.Path(os.path.abspath(directory))  # `--workdir=runs/x` is relative
    self._every_steps = every_steps
    self._every_secs = float(every_secs)
    self._manager = _manager(self._directory, keep=keep)
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
        **{_STATE: ocp.args.PyTreeSave(host_state), _DATA: ocp.args.JsonSave(data)}
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
    return flax.serialization.from_state_dict(template, state_sd), data, step

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
