"""Reading checkpoints: orbax step directories, retries, and what counts as damage.

Split from checkpointer.py (which saves, resumes and writes): everything here only reads, so it is
safe beside a training job, and every read is this process's own (no barrier across the processes
of a job; see `open_manager`). Its rules, in checkpointer.py's docstring: a read that fails is
retried; only positive evidence that a present file is damaged marks a step corrupt; a missing
file never does; a checkpoint of another model is a one-line mismatch error, found from metadata.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from flaxformer_nmt.checkpoints import read_noise
from flaxformer_nmt.checkpoints.trees import (  # noqa: F401  (reader.state_dict: its callers)
  abstract_leaf,
  check_matches_model,
  flatten,
  from_state_dict,
  state_dict,
)
from flaxformer_nmt.errors import CheckpointError, CheckpointMismatchError

UNREADABLE = "unreadable"
STATE_ITEM = "state"  # orbax item: the train state's PyTree (or {"params": ...} when averaged)
DATA_ITEM = "data"  # orbax item: JSON (input position, training time; the averaging description)
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


# ----------------------------------------------------------------------------- reading


def open_manager(
  directory: epath.Path,
  *,
  keep: int | None = None,
  read_only: bool = False,
  barrier_prefix: str | None = None,
) -> ocp.CheckpointManager:
  """An orbax manager with our two items; read-only managers create and clean nothing.

  A read-only manager is this process's own: orbax's restore ends in a barrier across the
  processes of the job, which would make a read that one process does alone (process 0 choosing
  the step to resume) wait forever. Reads share nothing between processes, so none is needed.

  A writing manager names its barriers with `barrier_prefix` (the same on every process). Orbax's
  barrier names are fixed strings, and two managers of one process synchronising at once under
  the same name fail ("Barrier ... is already ongoing"): the training checkpoint's asynchronous
  save finishing in its thread while `best/` is written in the main thread did, in a two-process
  run. Each writer passes its own prefix.
  """
  directory = epath.Path(os.path.abspath(directory))  # orbax rejects relative paths
  if read_only:
    processes = ocp.options.MultiprocessingOptions(
      primary_host=jax.process_index(), active_processes={jax.process_index()}
    )
  else:
    processes = ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=barrier_prefix)
  options = ocp.CheckpointManagerOptions(
    max_to_keep=keep,
    save_interval_steps=0 if read_only else 1,  # our own `due` decides; orbax is forced
    create=not read_only,
    read_only=read_only,
    cleanup_tmp_directories=not read_only,
    enable_async_checkpointing=not read_only,
    multiprocessing_options=processes,
  )
  return ocp.CheckpointManager(
    directory,
    options=options,
    item_handlers={
      STATE_ITEM: ocp.PyTreeCheckpointHandler(),
      DATA_ITEM: ocp.JsonCheckpointHandler(),
    },
  )


def _with_retries(path: epath.Path, read: Callable[[], Any]) -> Any:
  """`read()`, retried after a failure that does not show corruption; Unreadable in the end."""
  read_noise.quiet_failed_read_reports(str(path))
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


# Each step's flattened array metadata, by the identity of its _METADATA file: the checks before
# a restore (`check_fits`, then `read`) read it once per command, not once each (~0.15 s).
_METADATA_SEEN: dict[tuple[str, int, int, int], dict[str, Any]] = {}


def _metadata_identity(step_path: epath.Path) -> tuple[str, int, int, int] | None:
  """(path, inode, size, mtime) of a step's state/_METADATA; None if it cannot be stat-ed."""
  metadata = os.path.join(os.fspath(step_path), STATE_ITEM, "_METADATA")
  try:
    st = os.stat(metadata)
  except (OSError, TypeError):
    return None
  return (metadata, st.st_ino, st.st_size, st.st_mtime_ns)


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
      self._manager = open_manager(self.directory, read_only=True)
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
    items_wanted = (STATE_ITEM, DATA_ITEM) if with_data else (STATE_ITEM,)

    def require_items() -> None:
      for item in items_wanted:
        if not (path / item).is_dir():
          raise FileNotFoundError(f"its {item}/ directory is missing")

    _with_retries(path, require_items)
    self.check_matches(step, template)

    abstract = jax.tree.map(abstract_leaf, template)
    restore_args = jax.tree.map(
      lambda a: ocp.RestoreArgs(restore_type=np.ndarray, dtype=a.dtype), abstract
    )
    items = {
      STATE_ITEM: ocp.args.PyTreeRestore(abstract, restore_args=restore_args, partial_restore=True)
    }
    if with_data:
      items[DATA_ITEM] = ocp.args.JsonRestore()
    restored = _with_retries(path, lambda: manager.restore(step, args=ocp.args.Composite(**items)))
    return restored[STATE_ITEM], (restored[DATA_ITEM] if with_data else None)

  def read_data(self, step: int) -> Any:
    """The JSON item of one step alone (how an average or best/ describes itself)."""
    args = ocp.args.Composite(**{DATA_ITEM: ocp.args.JsonRestore()})
    return _with_retries(self.path(step), lambda: self.manager.restore(step, args=args))[DATA_ITEM]

  def _saved_paths(self, step: int) -> dict[str, Any]:
    """`{"params/encoder/...": metadata}` of every array `step` holds, from its metadata alone
    (read once per checkpoint and process). Unreadable if it cannot be read."""
    path = self.path(step)
    identity = _metadata_identity(path)
    saved = _METADATA_SEEN.get(identity) if identity is not None else None
    if saved is None:

      def read_metadata() -> Any:
        metadata = self.manager.item_metadata(step)[STATE_ITEM]
        if metadata is None:
          raise FileNotFoundError("its array metadata (state/_METADATA) is missing")
        return metadata

      metadata = _with_retries(path, read_metadata)
      saved = flatten(getattr(metadata, "tree", metadata), metadata=True)
      if identity is not None:
        _METADATA_SEEN[identity] = saved
    return saved

  def holds(self, step: int, part: str) -> bool:
    """Whether `step`'s state has a top-level `part` ("loss_scale": saved by a float16 run)."""
    return any(p.split("/")[0] == part for p in self._saved_paths(step))

  def check_matches(self, step: int, template: PyTree) -> None:
    """CheckpointMismatchError if `step`'s parameter names or shapes differ from `template`'s.

    Reads the metadata only (no arrays), so a resume or an evaluation with the wrong --config
    stops before any data is read. Unreadable if the metadata cannot be read.
    """
    path, saved = self.path(step), self._saved_paths(step)
    wanted = flatten(template)
    prefixes = {p.split("/")[0] for p in wanted}
    saved = {p: m for p, m in saved.items() if p.split("/")[0] in prefixes}
    # A template deep inside the state (the EMA in opt_state/1/ema/...) is compared with what
    # was saved under that same node only, not with its siblings (Adam's moments).
    common = os.path.commonprefix([p.split("/")[:-1] for p in wanted]) if wanted else []
    if len(common) > 1:
      node = "/".join(common) + "/"
      saved = {p: m for p, m in saved.items() if p.startswith(node)}
    check_matches_model(path, saved, wanted)

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
      if bad and on_corrupt is not None:  # training resumes: say what it costs
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
    found, failure, bug = None, "", None
    if jax.process_index() == 0:
      try:
        found = self._newest_readable_here(template, with_data=with_data, on_corrupt=on_corrupt)
      except CheckpointError as e:
        failure = str(e)
      except Exception as e:  # pylint: disable=broad-except  (re-raised below, after the others learn it)
        bug = e
    code = -3 if bug else -2 if failure else (found[0] if found else -1)
    chosen = int(multihost_utils.broadcast_one_to_all(np.asarray(code, np.int32)))
    if bug is not None:
      raise bug
    if chosen == -3:  # not a user error: the others must stop too, not wait for process 0
      raise RuntimeError(
        f"Process 0 failed choosing a checkpoint in {self.directory}: see its log."
      )
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
