"""JSON-line records and result files: what scripts, tests and a rerun read, never the log text.

Every mode ends by writing its figures to a result file (`write_result`) before it prints them as
its last line, so a closed terminal loses nothing. Record files (`train_metrics.jsonl`,
`dev_metrics.jsonl`, `results.jsonl`) grow by one line at a time (`append_jsonl`); a kill in the
middle of a write leaves a torn last line, which readers skip and the next append drops first, so
the record after it is never glued to it and lost. Only process 0 writes, so a multi-host run
leaves one copy of each. Which files a workdir holds, and where, is `workdir.Workdir`'s business.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
from absl import logging

from flaxformer_nmt.runtime import files


def _drop_torn_tail(path: str) -> None:
  """Cuts a last line without its newline (a write killed halfway) off `path`, with a warning.

  Reads backwards from the end in blocks, so a long record file costs one seek, not a read.
  """
  with open(path, "rb+") as f:
    end = f.seek(0, os.SEEK_END)
    if end == 0:
      return
    f.seek(end - 1)
    if f.read(1) == b"\n":
      return
    position = end
    while position > 0:
      start = max(position - 65536, 0)
      f.seek(start)
      block = f.read(position - start)
      newline = block.rfind(b"\n")
      if newline >= 0:
        keep = start + newline + 1
        break
      position = start
    else:
      keep = 0
    f.truncate(keep)
  logging.warning(
    "%s ended in a torn line (%d bytes, a write cut short): dropped it before appending.",
    path,
    end - keep,
  )


def append_jsonl(path: str, record: dict[str, Any]) -> None:
  """One JSON line appended to `path` (process 0 only); a torn last line is dropped first."""
  if jax.process_index() != 0:
    return
  if os.path.exists(path):
    _drop_torn_tail(path)
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps(record, sort_keys=True) + "\n")


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The records of a JSON-lines file ([] if absent); a line that is not JSON (torn) is skipped."""
  if not os.path.exists(path):
    return []
  records = []
  for line in files.iter_lines(path):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict):
      records.append(record)
  return records


def last_record_of_step(path: str, step: int) -> dict[str, Any] | None:
  """The last record of `path` logged at `step` (a step logged twice, before and after a resume,
  counts as its later line), without its "step" field; None if there is none."""
  found = None
  for record in read_jsonl(path):
    if record.get("step") == step:
      found = {k: v for k, v in record.items() if k != "step"}
  return found


def write_result(
  result_path: str, log_path: str, result: dict[str, Any], *, echo: bool = True
) -> None:
  """Saves a mode's final figures to `result_path`, appends them with the time to `log_path`,
  then (if `echo`) prints them as one JSON line. Process 0 only.

  The file comes first: a job whose stdout is gone (a closed pipe, a dropped session) still leaves
  its result behind.
  """
  if jax.process_index() != 0:
    return
  line = json.dumps(result, sort_keys=True)
  files.write_text(result_path, line + "\n")
  append_jsonl(log_path, {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **result})
  if echo:
    print_result(result)


def read_result(result_path: str) -> dict[str, Any] | None:
  """A result file's figures, or None if it is missing or not a JSON object (torn)."""
  try:
    with open(result_path, encoding="utf-8") as f:
      found = json.load(f)
  except (OSError, ValueError):
    return None
  return found if isinstance(found, dict) else None


def print_result(result: dict[str, Any]) -> None:
  """A mode's figures as the one JSON line that ends its output (process 0 only)."""
  if jax.process_index() == 0:
    print(json.dumps(result, sort_keys=True), flush=True)
