"""Console progress, TensorBoard scalars and result files for long-running work.

Only process 0 writes TensorBoard files, results and JSON lines, so a multi-host run produces one
set of each.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
from absl import logging

RESULTS_LOG = "results.jsonl"


def write_text_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` via a temporary file and a rename: never a half-written file."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def result_path(workdir: str, mode: str) -> str:
  """`<workdir>/<mode>_result.json`: the latest final figures of a mode."""
  return os.path.join(workdir, f"{mode}_result.json")


def write_result(workdir: str, result: dict[str, Any], *, echo: bool = True) -> None:
  """Saves a mode's final figures in the workdir, then (if `echo`) prints them as one JSON line.

  The file comes first: a job whose stdout is gone (a closed pipe, a dropped session) still leaves
  its result in `<workdir>/<mode>_result.json`, and `<workdir>/results.jsonl` keeps every result
  with the time it was written. Process 0 only.
  """
  if jax.process_index() != 0:
    return
  line = json.dumps(result, sort_keys=True)
  write_text_atomic(result_path(workdir, result["mode"]), line + "\n")
  with open(os.path.join(workdir, RESULTS_LOG), "a", encoding="utf-8") as f:
    f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **result}, sort_keys=True)
            + "\n")
  if echo:
    print(line, flush=True)


class MetricWriter:
  """TensorBoard scalars via tensorboardX (no TensorFlow needed); a no-op off process 0."""

  def __init__(self, logdir: str) -> None:
    self._writer = None
    if jax.process_index() == 0:
      from tensorboardX import SummaryWriter  # imported lazily: heavy, and process 0 only

      self._writer = SummaryWriter(logdir=logdir)

  def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
    if self._writer is None:
      return
    for name, value in values.items():
      self._writer.add_scalar(f"{prefix}{name}", float(value), step)
    self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()


class TrainClock:
  """Seconds spent training (evaluations excluded), continued across resumes.

  The checkpoint stores `seconds()`, so a resumed run's learning curve (dev figures against
  minutes of training) and its `max_train_minutes` budget continue where the last run stopped.
  """

  def __init__(self, seconds_before: float = 0.0) -> None:
    self._before = float(seconds_before)
    self._start = time.monotonic()
    self._excluded = 0.0

  def seconds(self) -> float:
    return self._before + time.monotonic() - self._start - self._excluded

  def exclude(self, seconds: float) -> None:
    """Takes time spent on something else (an evaluation) out of the training time."""
    self._excluded += seconds


class Progress:
  """Rate and ETA over the steps run in this process (resumed runs don't inflate the rate)."""

  def __init__(self, first_step: int, total_steps: int) -> None:
    self.first_step = first_step
    self.total_steps = total_steps
    self.start = time.monotonic()

  def eta(self, step: int, budget_left: float | None = None) -> str:
    """Time to the last step, or to the end of a wall-clock budget if that comes first."""
    done = step - self.first_step
    if done <= 0:
      return "?"
    seconds = (time.monotonic() - self.start) / done * (self.total_steps - step)
    if budget_left is not None:
      seconds = max(min(seconds, budget_left), 0.0)
    return format_seconds(seconds)


def format_seconds(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def log_train(step: int, total: int, metrics: dict[str, float], eta: str) -> None:
  logging.info(
      "step %d/%d  loss %.4f  nll %.4f  lr %.3g  |g| %.3g  %.0f tgt tok/s  ETA %s",
      step, total, metrics["loss"], metrics["nll"], metrics["learning_rate"],
      metrics["grad_norm"], metrics["target_tokens_per_s"], eta,
  )
