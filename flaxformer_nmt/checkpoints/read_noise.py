"""What a failed checkpoint read leaves printed behind it, and the one hook that quiets it.

orbax reads a checkpoint's arrays as many asyncio tasks over tensorstore. When one read fails (a
cut file), the others still in flight finish after orbax has closed its loop: Python reports each
as an unraisable `RuntimeError: Event loop is closed`, and asyncio logs each sibling's own failure
as "Task (or Future) exception was never retrieved", each with a traceback. reader.py already
names the fault in one warning line and falls back to an older checkpoint; the tracebacks are only
noise.
"""

from __future__ import annotations

import logging as logging_lib
import os
import sys
from typing import Any

# Checkpoints this process has read (or tried to): the reports below are dropped only when they
# are about one of them.
_READ_PATHS: set[str] = set()


def _closed_loop(unraisable: Any) -> bool:
  return isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == (
    "Event loop is closed"
  )


class _UnretrievedReadFailures(logging_lib.Filter):
  """Drops asyncio's "Task (or Future) exception was never retrieved" records whose exception is
  about a checkpoint this process read: the sibling reads of one that failed."""

  def filter(self, record: logging_lib.LogRecord) -> bool:
    # asyncio names the object's class: "Task", "Future" or "_GatheringFuture exception was ...".
    if not str(record.msg).split("\n", 1)[0].endswith("exception was never retrieved"):
      return True
    error = record.exc_info[1] if record.exc_info else None
    return not (error is not None and any(p in str(error) for p in _READ_PATHS))


_FILTER = _UnretrievedReadFailures()


def quiet_failed_read_reports(path: str) -> None:
  """When a read fails, orbax's reads still in flight (tensorstore's callbacks) finish on an
  asyncio loop orbax has closed: Python reports each as an unraisable `RuntimeError: Event loop
  is closed` traceback, and asyncio logs each sibling read's own failure as "Task exception was
  never retrieved" with its traceback (20-35 tracebacks on a cut checkpoint, some while the
  failure is still being raised; orbax-checkpoint 0.12.8, tensorstore 0.1.86). That is noise
  after a fault that is handled and named in one warning line. Installed before every read:
  exactly those reports are dropped (the second only when it names a checkpoint this process
  read); any other goes where it went."""
  _READ_PATHS.add(os.path.abspath(path))
  asyncio_log = logging_lib.getLogger("asyncio")
  if _FILTER not in asyncio_log.filters:
    asyncio_log.addFilter(_FILTER)
  previous = sys.unraisablehook
  if getattr(previous, "_drops_closed_loop", False):
    return

  def hook(unraisable: Any) -> None:
    if not _closed_loop(unraisable):
      previous(unraisable)

  hook._drops_closed_loop = True  # type: ignore[attr-defined]
  sys.unraisablehook = hook
