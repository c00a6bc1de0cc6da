"""One training job per workdir: its lock file (`<workdir>/train.lock`) names the job that holds it.

Two jobs in one workdir would overwrite each other's checkpoints and interleave their data
positions, so the second one stops at once with one line naming the holder. A lock left by a job
that was killed (kill -9, a lost machine) is stale and is taken over:

* on the same host, when the recorded process no longer exists (checked by pid and process start
  time, so a reused pid does not count as the holder);
* from another host, whose processes cannot be checked (a new Colab runtime resuming a workdir on
  Google Drive, a job moved to another machine), when the lock's heartbeat has stopped: a live
  holder touches the file every `HEARTBEAT_S` (10) seconds from a thread, so a long evaluation does
  not make it look dead. A lock untouched for `STALE_AFTER_S` (60) seconds by this host's clock is
  stale at once; a fresher one is watched until it is touched (the holder lives: the new job stops
  with one line) or has been silent for `STALE_AFTER_S` seconds (taken over). So the new job waits
  at most a minute, and only when the old one stopped less than a minute ago.

A holder also checks, at every heartbeat, that the file still names it. If a slow shared filesystem
hid its heartbeats long enough for another job to take over, the holder learns it at its next beat
and stops before its next checkpoint (`check_held`), so two jobs never both write checkpoints.

Who may judge the record at all is decided by the OS: a job first takes an exclusive `flock` on the
file, which one process at a time can hold and which the kernel frees when its holder dies. So of
many jobs started at once on a stale lock exactly one takes it over (the others stop with one
line). Across hosts `flock` works where the filesystem shares locks (NFS); where it does not
(FUSE mounts such as Google Drive), the heartbeat above and the check at each beat are what keep
two jobs apart. In a multi-process run only process 0 holds the lock; the others learn the outcome
from it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.runtime import files, parallel

if TYPE_CHECKING:  # only its lock_path is read; importing it (and orbax) would slow every start
  from flaxformer_nmt.run.folder import Workdir

HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
POLL_S = 1.0  # how often a lock from another host is looked at while it is watched


def _process_start(pid: int) -> str | None:
  """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), or None."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      stat = f.read()
  except OSError:
    return None
  return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name, which may hold ")"


def _alive(holder: dict[str, Any]) -> bool:
  pid = int(holder.get("pid", -1))
  if os.path.isdir("/proc"):
    start = _process_start(pid)
    return start is not None and start == holder.get("process_start", start)
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class WorkdirLock:
  """Context manager: holds `<workdir>/train.lock` (the workdir must exist) while a job trains."""

  def __init__(self, workdir: Workdir) -> None:
    self.path = workdir.lock_path
    self._me = {
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "process_start": _process_start(os.getpid()),
      "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
      "token": uuid.uuid4().hex,  # this job's, whatever its host and pid
    }
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._held = False
    self._fd: int | None = None  # holds the OS lock (flock) while held
    self._created = False  # whether this job created the lock file (then it held no record)
    self.lost_to: dict[str, Any] | None = None  # set by the heartbeat if another job took over

  def _holder(self) -> dict[str, Any] | None:
    """The current holder's record; {} if the file is unreadable or half-written; None if gone."""
    try:
      with open(self.path) as f:
        text = f.read()
    except FileNotFoundError:
      return None
    try:
      holder = json.loads(text)
      return holder if isinstance(holder, dict) else {}
    except json.JSONDecodeError:
      return {}

  def _signature(self) -> tuple[int, str] | None:
    """(mtime in ns, content) of the lock file, or None if gone: what a live holder changes."""
    try:
      with open(self.path) as f:
        return os.fstat(f.fileno()).st_mtime_ns, f.read()
    except FileNotFoundError:
      return None

  def _stale(self, holder: dict[str, Any]) -> bool:
    """Whether `holder` is gone: by its pid on this host, by its heartbeat from another one."""
    if holder.get("host") == self._me["host"] and "pid" in holder:
      return not _alive(holder)
    first = self._signature()
    if first is None:
      return True
    start = time.monotonic()
    if time.time() - first[0] / 1e9 <= STALE_AFTER_S:
      logging.info(
        "%s: held by host %s; waiting up to %.0fs for its heartbeat to tell whether it is alive.",
        self.path,
        holder.get("host", "?"),
        STALE_AFTER_S,
      )
    while time.time() - first[0] / 1e9 <= STALE_AFTER_S:
      if time.monotonic() - start > STALE_AFTER_S:
        return True  # silent for the whole window, whatever the two hosts' clocks say
      time.sleep(POLL_S)
      now = self._signature()
      if now != first:
        return now is None  # touched or rewritten: alive; removed: free
    return True

  def _refusal(self, holder: dict[str, Any]) -> errors.WorkdirLockedError:
    return errors.WorkdirLockedError(
      f"{self.path}: another training job holds this workdir (host "
      f"{holder.get('host', '?')}, pid {holder.get('pid', '?')}, started "
      f"{holder.get('started', '?')}); stop it, or train in another --workdir."
    )

  def _os_lock(self) -> int | None:
    """An open descriptor of the lock file holding the OS's exclusive `flock` on it, or None
    where the filesystem has no flock (then the record and heartbeat alone decide).

    The OS grants the lock to one process at a time and frees it when its holder dies, however it
    dies, so same-host contenders cannot both win. A holder removes the file when it is done, so
    a descriptor opened just before that removal may lock a file that is gone: the lock counts
    only if the path still names the locked file.
    """
    for _ in range(10):
      try:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._created = True
      except FileExistsError:
        try:
          fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
          continue  # removed meanwhile: create it
        self._created = False
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        os.close(fd)
        raise self._refusal(self._holder() or {}) from None
      except OSError as e:  # ENOLCK, EOPNOTSUPP: e.g. some FUSE mounts
        os.close(fd)
        logging.info("%s: no OS file lock here (%s); the heartbeat alone decides.", self.path, e)
        return None
      try:
        same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if same:
        return fd
      os.close(fd)  # the previous holder removed the file between our open and our lock
    raise errors.WorkdirLockedError(f"{self.path}: could not take the workdir's lock; try again.")

  def _acquire(self) -> None:
    """Takes the OS lock, then judges the record left in the file: none, ours to take over (its
    job is gone), or a live job on another host (which this host's OS lock cannot see)."""
    self._fd = self._os_lock()
    try:
      holder = self._holder()
      # A record: a job that ended without removing it, or one on another host. A file this job
      # did not create counts even when empty or half-written: another host may be writing it.
      if holder or (holder is not None and not self._created):
        if not self._stale(holder):
          raise self._refusal(holder)
        logging.warning(
          "Took over the lock of a job that is gone (host %s, pid %s, started %s).",
          holder.get("host", "?"),
          holder.get("pid", "?"),
          holder.get("started", "?"),
        )
      record = json.dumps(self._me).encode()
      if self._fd is None:
        with files.atomic_path(self.path) as tmp, open(tmp, "wb") as f:
          f.write(record)
      else:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, record, 0)
        os.fsync(self._fd)
    except BaseException:
      self._release_os_lock()
      raise

  def _release_os_lock(self) -> None:
    if self._fd is not None:
      os.close(self._fd)  # frees the flock
      self._fd = None

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      holder = self._holder()
      if holder is not None and holder and holder.get("token") != self._me["token"]:
        self.lost_to = holder
        logging.error(
          "%s now names another job (host %s, pid %s): this one stops before its next checkpoint.",
          self.path,
          holder.get("host", "?"),
          holder.get("pid", "?"),
        )
        return
      try:
        os.utime(self.path)
      except OSError:
        pass  # a filesystem hiccup (or the file is briefly gone); the next beat tries again

  def check_held(self) -> None:
    """WorkdirLockedError if another job took this workdir over (every process learns it from
    process 0; a collective in multi-process runs, so call it at the same step everywhere)."""
    lost = self.lost_to or {}
    if parallel.broadcast_from_main(self.lost_to is not None):
      raise errors.WorkdirLockedError(
        f"{self.path}: another job (host {lost.get('host', '?')}, pid {lost.get('pid', '?')}) "
        "took this workdir over while this one ran; stopped without saving. Run one job per "
        "workdir."
      )

  def __enter__(self) -> WorkdirLock:
    failed, bug = "", None
    if parallel.is_main_process():
      try:
        self._acquire()
        self._held = True
      except errors.WorkdirLockedError as e:
        failed = str(e)
      except Exception as e:  # pylint: disable=broad-except  (re-raised below, after the broadcast)
        bug = e
    # Everyone learns the outcome together: a process left alone would wait in a collective.
    if parallel.broadcast_from_main(bool(failed) or bug is not None):
      if bug is not None:
        raise bug
      raise errors.WorkdirLockedError(
        failed or f"{self.path}: held by another job (see process 0)."
      )
    if self._held:
      self._thread = threading.Thread(target=self._heartbeat, name="workdir-lock", daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc_info: object) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._held and (self._holder() or {}).get("token") == self._me["token"]:
      os.remove(self.path)  # before the OS lock is freed: see `_os_lock`
    self._release_os_lock()
    self._held = False
