"""Console progress, metrics (TensorBoard and JSON lines) and result files for long-running work.

Only process 0 writes TensorBoard files, metrics, results and JSON lines, so a multi-host run
produces one set of each. Scripts and tests read the JSON lines (`<workdir>/train_metrics.jsonl`,
`dev_metrics.jsonl`, `<mode>_result.json`, `results.jsonl`), never the log text.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
from absl import logging

from flaxformer_nmt.runtime import files

RESULTS_LOG = "results.jsonl"


def append_jsonl(path: str, record: dict[str, Any]) -> None:
  """One JSON line appended to `path` (process 0 only)."""
  if jax.process_index() == 0:
    with open(path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The records of a JSON-lines file ([] if absent); a torn last line (a kill) is skipped."""
  if not os.path.exists(path):
    return []
  records = []
  for line in files.iter_lines(path):
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return records


def metrics_path(workdir: str, split: str) -> str:
  """`<workdir>/<split>_metrics.jsonl`: train figures at each log step, dev at each evaluation."""
  return os.path.join(workdir, f"{split}_metrics.jsonl")


def result_path(workdir: str, mode: str) -> str:
  """`<workdir>/<mode>_result.json`: the latest final figures of a mode."""
  return os.path.join(workdir, f"{mode}_result.json")


def summarize_train(history: list[dict[str, float]], seconds: float) -> dict[str, float]:
  """The train figures of a log step from the per-step metrics since the last one."""
  tokens = sum(m["tokens"] for m in history)
  return {
    "loss": sum(m["loss_sum"] for m in history) / max(tokens, 1.0),
    "nll": sum(m["nll_sum"] for m in history) / max(tokens, 1.0),
    "learning_rate": history[-1]["learning_rate"],
    "grad_norm": history[-1]["grad_norm"],
    "param_norm": history[-1]["param_norm"],
    "target_tokens_per_s": tokens / max(seconds, 1e-9),
    "source_tokens_per_s": sum(m["source_tokens"] for m in history) / max(seconds, 1e-9),
    "skipped_steps": sum(m["nonfinite"] for m in history),
  }


def write_result(workdir: str, result: dict[str, Any], *, echo: bool = True) -> None:
  """Saves a mode's final figures in the workdir, then (if `echo`) prints them as one JSON line.

  The file comes first: a job whose stdout is gone (a closed pipe, a dropped session) still leaves
  its result in `<workdir>/<mode>_result.json`, and `<workdir>/results.jsonl` keeps every result
  with the time it was written. Process 0 only.
  """
  if jax.process_index() != 0:
    return
  line = json.dumps(result, sort_keys=True)
  files.write_text(result_path(workdir, result["mode"]), line + "\n")
  append_jsonl(
    os.path.join(workdir, RESULTS_LOG), {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **result}
  )
  if echo:
    print_result(result)


def print_result(result: dict[str, Any]) -> None:
  """A mode's figures as the one JSON line that ends its output (process 0 only)."""
  if jax.process_index() == 0:
    print(json.dumps(result, sort_keys=True), flush=True)


class MetricWriter:
  """Scalars to TensorBoard (tensorboardX: no TensorFlow needed) and to `<split>_metrics.jsonl`.

  A no-op off process 0.
  """

  def __init__(self, workdir: str) -> None:
    self._workdir = workdir
    self._writer = None
    if jax.process_index() == 0:
      from tensorboardX import SummaryWriter  # imported lazily: heavy, and process 0 only

      self._writer = SummaryWriter(logdir=workdir)

  def scalars(self, step: int, values: dict[str, float], split: str) -> None:
    """`values` of `step` under `split` ("train" or "dev")."""
    if self._writer is None:
      return
    for name, value in values.items():
      self._writer.add_scalar(f"{split}/{name}", float(value), step)
    self._writer.flush()
    append_jsonl(metrics_path(self._workdir, split), {"step": step, **values})

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()

  def __enter__(self) -> MetricWriter:
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
  wait = metrics.get("input_wait_fraction")
  logging.info(
    "step %d/%d  loss %.4f  nll %.4f  lr %.3g  |g| %.3g  %.0f tgt tok/s%s  ETA %s",
    step,
    total,
    metrics["loss"],
    metrics["nll"],
    metrics["learning_rate"],
    metrics["grad_norm"],
    metrics["target_tokens_per_s"],
    "" if wait is None else f"  input wait {wait:.0%}",
    eta,
  )
