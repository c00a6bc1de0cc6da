"""What the training loop reports while it runs: per-log-step figures, TensorBoard and
`<split>_metrics.jsonl` scalars, console lines, and the clock a run's time budget reads."""

from __future__ import annotations

import math
import time

import jax
from absl import logging

from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import files


def summarize_train(history: list[dict[str, float]], seconds: float) -> dict[str, float]:
  """The train figures of a log step from the per-step metrics since the last one.

  The loss and the gradient norm are those of the steps whose figures are finite: a float16
  overflow (a finite loss, a gradient of inf) or a step skipped under skip_nonfinite would
  otherwise write inf or NaN into train_metrics.jsonl for the whole window. A window of skipped
  steps alone reports what they were.
  """
  tokens = sum(m["tokens"] for m in history)
  finite_loss = [m for m in history if math.isfinite(m["loss_sum"])] or history
  loss_tokens = sum(m["tokens"] for m in finite_loss)
  finite_grad = [m for m in history if math.isfinite(m["grad_norm"])] or history
  summary = {
    "loss": sum(m["loss_sum"] for m in finite_loss) / max(loss_tokens, 1.0),
    "nll": sum(m["nll_sum"] for m in finite_loss) / max(loss_tokens, 1.0),
    "learning_rate": history[-1]["learning_rate"],
    "grad_norm": finite_grad[-1]["grad_norm"],  # the last applied update's
    "param_norm": history[-1]["param_norm"],
    "target_tokens_per_s": tokens / max(seconds, 1e-9),
    "source_tokens_per_s": sum(m["source_tokens"] for m in history) / max(seconds, 1e-9),
    # Updates skipped since the last log: non-finite steps (config.skip_nonfinite) and float16
    # overflows.
    "skipped_steps": sum(m["nonfinite"] + m.get("overflow", 0.0) for m in history),
  }
  if "loss_scale" in history[-1]:  # float16 (training/loss_scale.py)
    summary["loss_scale"] = history[-1]["loss_scale"]  # the last step's
    summary["skipped_steps_total"] = history[-1]["skipped_steps_total"]  # over the whole run
  return summary


class MetricWriter:
  """Scalars to TensorBoard (tensorboardX: no TensorFlow needed) and to `<split>_metrics.jsonl`.

  A no-op off process 0.
  """

  def __init__(self, workdir: Workdir) -> None:
    self._workdir = workdir
    self._writer = None
    if jax.process_index() == 0:
      from tensorboardX import SummaryWriter  # imported lazily: heavy, and process 0 only

      self._writer = SummaryWriter(logdir=workdir.tensorboard_dir)

  def scalars(self, step: int, values: dict[str, float], split: str) -> None:
    """`values` of `step` under `split` ("train" or "dev")."""
    if self._writer is None:
      return
    for name, value in values.items():
      self._writer.add_scalar(f"{split}/{name}", float(value), step)
    self._writer.flush()
    files.append_jsonl(self._workdir.metrics_path(split), {"step": step, **values})

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

  def seconds_before(self) -> float:
    """The training time of the earlier runs (the checkpoint's), without this process's start-up."""
    return self._before

  def exclude(self, seconds: float) -> None:
    """Takes time spent on something else (an evaluation) out of the training time."""
    self._excluded += seconds


def log_train(step: int, total: int, metrics: dict[str, float], eta: str) -> None:
  wait = metrics.get("input_wait_fraction")
  scale = metrics.get("loss_scale")  # float16 runs
  logging.info(
    "step %d/%d%s  loss %.4f  nll %.4f  lr %.3g  |g| %.3g%s  %.0f tgt tok/s%s  ETA %s",
    step,
    total,
    "" if "epoch" not in metrics else f"  epoch {metrics['epoch']:.2f}",
    metrics["loss"],
    metrics["nll"],
    metrics["learning_rate"],
    metrics["grad_norm"],
    "" if scale is None else f"  loss scale {scale:g}",
    metrics["target_tokens_per_s"],
    "" if wait is None else f"  input wait {wait:.0%}",
    eta,
  )
