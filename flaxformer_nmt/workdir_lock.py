"""One training job per workdir: `<workdir>/train.lock` names the job that holds it.

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

Taking over is safe against a third job doing the same: the stale file is first renamed away (only
one rename of it can succeed), then the new lock is created with O_EXCL. In a multi-process run only
process 0 holds the lock; the others learn the outcome from it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from absl import logging

from flaxformer_nmt import errors, parallel

LOCK_NAME = "train.lock"
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

  def __init__(self, workdir: str) -> None:
    self.path = os.path.join(workdir, LOCK_NAME)
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

  def _try_create(self) -> bool:
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      json.dump(self._me, f)
    return True

  def _acquire(self) -> None:
    for _ in range(3):  # another job may win a race for a stale lock; then it is the holder
      if self._try_create():
        return
      holder = self._holder()
      if holder is None:
        continue  # released meanwhile
      if not self._stale(holder):
        raise errors.WorkdirLockedError(
          f"{self.path}: another training job holds this workdir (host "
          f"{holder.get('host', '?')}, pid {holder.get('pid', '?')}, started "
          f"{holder.get('started', '?')}); stop it, or train in another --workdir."
        )
      aside = f"{self.path}.stale-{os.getpid()}-{int(time.time())}"
      try:
        os.rename(self.path, aside)
      except FileNotFoundError:
        continue  # someone else took it over first
      os.remove(aside)
      logging.warning(
        "Took over the lock of a job that is gone (host %s, pid %s, started %s).",
        holder.get("host", "?"),
        holder.get("pid", "?"),
        holder.get("started", "?"),
      )
    raise errors.WorkdirLockedError(f"{self.path}: could not take the workdir's lock; try again.")

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
    failed = ""
    if parallel.is_main_process():
      try:
        self._acquire()
        self._held = True
      except errors.WorkdirLockedError as e:
        failed = str(e)
    # Everyone learns the outcome together: a process left alone would wait in a collective.
    if parallel.broadcast_from_main(len(failed) > 0):
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
      os.remove(self.path)
    self._held = False
