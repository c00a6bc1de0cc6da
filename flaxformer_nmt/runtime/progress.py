"""Rate and ETA for long work (training, translation, vocabulary training)."""

from __future__ import annotations

import time


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
