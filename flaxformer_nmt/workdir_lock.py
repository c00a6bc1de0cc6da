"""One training job per workdir: `<workdir>/train.lock` names the job that holds it.

Two jobs in one workdir would overwrite each other's checkpoints and interleave their data
positions, so the second one stops at once with one line naming the holder. A lock left by a job
that was killed (kill -9, a lost machine) is stale and is taken over:

* on the same host, when the recorded process no longer exists (checked by pid and process start
  time, so a reused pid does not count as the holder);
* from another host, whose processes cannot be checked, when the lock's heartbeat is older than
  `STALE_AFTER_S` (a live holder touches the file every `HEARTBEAT_S` seconds from a thread, so a
  long evaluation does not make it look dead).

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
from typing import Any

from absl import logging

from flaxformer_nmt import errors, parallel

LOCK_NAME = "train.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0


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
    }
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._held = False

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

  def _stale(self, holder: dict[str, Any]) -> bool:
    try:
      age = time.time() - os.path.getmtime(self.path)
    except FileNotFoundError:
      return True
    if holder.get("host") == self._me["host"] and "pid" in holder:
      return not _alive(holder)
    return age > STALE_AFTER_S  # another host (or an unreadable record): trust the heartbeat

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
      try:
        os.utime(self.path)
      except OSError:
        pass  # a filesystem hiccup; the next beat tries again

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
    if self._held and (self._holder() or {}).get("pid") == self._me["pid"]:
      os.remove(self.path)
    self._held = False
