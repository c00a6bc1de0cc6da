"""A run's best dev figure (`config.best_metric`) and early stopping (`early_stopping_patience`).

After each dev evaluation the tracker compares the evaluation's figure with the best so far:
`dev_bleu` counts higher as better, `dev_loss` lower, and only a strict improvement counts. With
EMA on, an evaluation scores the raw and the averaged parameters, and the better of the two is
its figure (and the parameters `best/` receives). `patience` evaluations in a row without an
improvement exhaust the run.

Nothing of this is stored in the train checkpoints: the learning curve is. On resume the tracker
replays `<workdir>/dev_metrics.jsonl` up to the restored step (a run killed after an evaluation
but before its next checkpoint trains and evaluates those steps again, identically), so the best
value and the count of evaluations without improvement continue exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

EMA_PREFIX = "ema_"  # dev figures of the EMA parameters: ema_dev_bleu, ema_dev_loss, ...
HIGHER_IS_BETTER = {"dev_bleu": True, "dev_loss": False}


@dataclasses.dataclass
class Tracker:
  """The best `metric` so far, where it was reached, and evaluations since."""

  metric: str  # "dev_bleu" or "dev_loss"
  patience: int = 0  # 0: never exhausted
  value: float | None = None
  step: int | None = None
  parameters: str = ""  # "params" or "ema": which of an evaluation's parameters reached it
  evals_without_improvement: int = 0

  def figure(self, dev: dict[str, float]) -> tuple[float, str] | None:
    """(value, "params" or "ema") of an evaluation: the better of its raw and EMA figures."""
    found = [(dev[self.metric], "params")] if self.metric in dev else []
    if EMA_PREFIX + self.metric in dev:
      found.append((dev[EMA_PREFIX + self.metric], "ema"))
    if not found:
      return None
    sign = 1.0 if HIGHER_IS_BETTER[self.metric] else -1.0
    return max(found, key=lambda f: sign * f[0])  # the raw parameters win a tie

  def improves(self, value: float) -> bool:
    if self.value is None:
      return True
    return value > self.value if HIGHER_IS_BETTER[self.metric] else value < self.value

  def update(self, step: int, dev: dict[str, float]) -> str | None:
    """Takes in one evaluation; returns which parameters improved the best ("params" / "ema"),
    or None if none did."""
    found = self.figure(dev)
    if found is not None and self.improves(found[0]):
      self.value, self.parameters = found
      self.step, self.evals_without_improvement = step, 0
      return self.parameters
    self.evals_without_improvement += 1
    return None

  @property
  def exhausted(self) -> bool:
    return bool(self.patience) and self.evals_without_improvement >= self.patience

  def replay(self, records: Iterable[dict[str, Any]], up_to_step: int) -> None:
    """Takes in the logged evaluations of steps <= up_to_step, in step order (a step evaluated
    twice, before and after a resume, counts once: the later record)."""
    by_step = {int(r["step"]): r for r in records if "step" in r and int(r["step"]) <= up_to_step}
    for step in sorted(by_step):
      self.update(step, by_step[step])

  def summary(self) -> dict[str, Any]:
    """The figures a result JSON carries: best_metric, best_value, best_step, best_parameters."""
    return {
      "best_metric": self.metric,
      "best_value": self.value,
      "best_step": self.step,
      "best_parameters": self.parameters,
      "evals_without_improvement": self.evals_without_improvement,
    }
