"""A run's best dev figure (`config.best_metric`) and early stopping (`early_stopping_patience`).

After each dev evaluation the tracker compares the evaluation's figure with the best so far:
`dev_bleu` counts higher as better, `dev_loss` lower, and only a strict improvement counts. With
EMA on, an evaluation scores the raw and the averaged parameters, and the better of the two is
its figure (and the parameters `best/` receives). `patience` evaluations in a row without an
improvement exhaust the run.

Nothing of this is stored in the train checkpoints: the learning curve is. On resume the tracker
replays `<workdir>/dev_metrics.jsonl` up to the restored step (a run killed after an evaluation
but before its next checkpoint trains and evaluates those steps again, identically), so the best
value and the count of evaluations without improvement continue exactly. `Keeper.offer` writes an
improvement's parameters to `<workdir>/best/` before the training loop logs the evaluation, so a
kill between the two leaves an evaluation that the resumed run makes again (and finds in `best/`
already), never a logged best whose parameters were not written.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable
from typing import Any

import numpy as np
from absl import logging

from flaxformer_nmt.checkpoints import checkpointer, reader
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import parallel
from flaxformer_nmt.training import optim

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


class Keeper:
  """A training run's tracker and its `<workdir>/best/` (config.best_metric on).

  Every process holds one and calls `offer` at each evaluation (process 0's tracker decides, and
  every process enters the write together); only process 0 reads the learning curve.
  """

  def __init__(self, metric: str, patience: int, workdir: Workdir, start_step: int) -> None:
    self.workdir = workdir
    self.tracker = Tracker(metric, patience)
    if parallel.is_main_process():
      finish_replacement(workdir)  # a replacement that a kill interrupted
      self.tracker.replay(workdir.dev_records(), start_step)
    count = parallel.broadcast_from_main(
      np.asarray(self.tracker.evals_without_improvement, np.int32)
    )
    self.tracker.evals_without_improvement = int(count)
    t = self.tracker
    if t.value is not None:
      logging.info(
        "Best %s so far: %.4g at step %d (%s); %d evaluation(s) since.",
        t.metric,
        t.value,
        t.step,
        t.parameters,
        t.evals_without_improvement,
      )
      saved = reader.CheckpointDir(workdir.best).steps()
      if t.step not in saved:  # best_metric switched on (or changed) for a run under way
        logging.warning(
          "%s holds no parameters of step %d, the learning curve's best %s; it receives the "
          "next evaluation that improves on it.",
          workdir.best,
          t.step,
          t.metric,
        )

  def offer(self, step: int, dev: dict[str, float], state: Any, lock: Any = None) -> None:
    """Takes in the evaluation `dev` of `step`; an improvement's parameters (`state`'s raw ones
    or their EMA, this process's replica) go to <workdir>/best/ at once."""
    tracker = self.tracker
    before = tracker.evals_without_improvement
    improved = tracker.update(step, dev)
    choice = {None: 0, "params": 1, "ema": 2}
    decided = int(parallel.broadcast_from_main(np.asarray(choice[improved], np.int32)))
    tracker.evals_without_improvement = 0 if decided else before + 1  # process 0's count
    if not decided:
      logging.info(
        "No improvement of %s on the best, %.4g at step %s (%d evaluation(s) without).",
        tracker.metric,
        tracker.value if tracker.value is not None else float("nan"),
        tracker.step,
        tracker.evals_without_improvement,
      )
      return
    state = parallel.local_replica(state)
    info = {
      "metric": tracker.metric,
      "value": tracker.value,
      "step": step,
      "parameters": "params" if decided == 1 else "ema",
    }
    directory = self.workdir.best
    if parallel.broadcast_from_main(_already_saved(directory, info)):
      # A resumed run evaluating a step again, identically: best/ holds it already (a kill may
      # have come before best_result.json named it), so only the record is written.
      logging.info(
        "%s already holds step %d with %s %.4g.", directory, step, tracker.metric, tracker.value
      )
    else:
      if lock is not None:
        lock.check_held()
      params = state.params if decided == 1 else optim.ema_of(state.opt_state)
      write_best(self.workdir, step, params, info)
      logging.info(
        "New best %s %.4g (%s) at step %d: saved to %s.",
        tracker.metric,
        tracker.value,
        info["parameters"],
        step,
        directory,
      )
    path = self.workdir.best_step(step)
    self.workdir.write_result({"mode": "best", "path": path, **tracker.summary()}, echo=False)

  def exhausted(self, step: int) -> bool:
    """Whether config.early_stopping_patience evaluations in a row brought no improvement."""
    t = self.tracker
    if not t.exhausted:
      return False
    logging.info(
      "Stopping early at step %d: %d evaluations without improving %s (best %.4g at step %s).",
      step,
      t.evals_without_improvement,
      t.metric,
      t.value if t.value is not None else float("nan"),
      t.step,
    )
    return True


def _already_saved(directory: str, info: dict[str, Any]) -> bool:
  """Whether best/ holds `info`'s step with its figure, as the step's own JSON item says
  (process 0 reads it)."""
  if not parallel.is_main_process():
    return False
  best = reader.CheckpointDir(directory)
  if info["step"] not in best.steps():
    return False
  try:
    saved = best.read_data(info["step"])
  except reader.Unreadable:
    return False
  return all(saved.get(k) == info[k] for k in ("step", "value", "parameters", "metric"))


# A new best of a step that best/ already holds (a resumed run whose evaluation came out another
# way) is written beside it first (best/.incoming), then swapped in by two renames; a kill between
# them leaves the new one in best/.incoming, which `finish_replacement` moves into place at the
# next start. The folders are the Workdir's (run/folder.py).


def write_best(folder: Workdir, step: int, params: Any, info: dict[str, Any]) -> None:
  """Writes `params` as best/<step> and removes every other step once it is complete, so best/
  always holds a complete best: the previous one until the new one is in place. Every process
  calls it (orbax writes from process 0)."""
  if step not in reader.CheckpointDir(folder.best).steps():
    checkpointer.write(folder.best, step, {"params": params}, info, only=True)
    return
  checkpointer.write(folder.best_incoming, step, {"params": params}, info, replace=True, only=True)
  if parallel.is_main_process():
    finish_replacement(folder)
  parallel.broadcast_from_main(True)  # the others wait for the swap


def finish_replacement(folder: Workdir) -> None:
  """Moves a complete step from best/.incoming into best/ (the step it replaces is renamed
  aside first and deleted after), then keeps only the newest step. Process 0 only."""
  incoming = reader.CheckpointDir(folder.best_incoming)
  for step in incoming.steps()[-1:]:
    target = folder.best_step(step)
    if os.path.isdir(target):
      shutil.rmtree(folder.best_outgoing, ignore_errors=True)
      os.rename(target, folder.best_outgoing)
    os.rename(str(incoming.path(step)), target)
    logging.info("Replaced %s with the new evaluation of that step.", target)
  for leftover in (folder.best_incoming, folder.best_outgoing):
    shutil.rmtree(leftover, ignore_errors=True)
  for step in reader.CheckpointDir(folder.best).steps()[:-1]:
    shutil.rmtree(folder.best_step(step), ignore_errors=True)
