"""The training loop: the set-up once, then orchestration only (the maths is in steps.py, the
moving parts in trainer.py, devices in runtime/parallel.py).

`train_and_evaluate` takes the workdir's lock, builds the command's one `Components` (from the
vocabulary a resumed run or a fine-tuning source already has, or from the one the data trains),
checks that the checkpoints fit it, reads the data, and runs the `Trainer` to the last step; then
it scores the test set. `finished_result` lets a rerun of a finished command return its saved
figures without decoding again.
"""

from __future__ import annotations

import json
from typing import Any

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.config import run_config
from flaxformer_nmt.data import pipeline as data_lib
from flaxformer_nmt.data.tokenizer import open_vocabulary
from flaxformer_nmt.decoding import evaluation
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.run import command, identity
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import files, parallel
from flaxformer_nmt.training import init_from
from flaxformer_nmt.training.lock import WorkdirLock
from flaxformer_nmt.training.preemption import PreemptionGuard
from flaxformer_nmt.training.state import TrainSetup, check_resume_fits
from flaxformer_nmt.training.trainer import Trainer


def finished_result(config: ml_collections.ConfigDict, workdir: Workdir) -> dict[str, Any] | None:
  """The saved final figures of a workdir that this very config trained to the end, or None.

  Rerunning a finished training command (a notebook cell after a runtime reset, a repeated job)
  returns them instead of decoding the test set again. Only a complete result counts: the run
  reached config.num_train_steps (or stopped early), its test decoding finished (not "pending",
  not preempted), the newest checkpoint is that step, and `config.json` equals this config (so a
  larger num_train_steps, another beam or another test set trains or scores anew). Process 0
  decides.
  """
  found = None
  if parallel.is_main_process():
    saved = workdir.read_result("train") or {}
    same_config = _same_config(workdir.saved_config_text(), config)
    complete = (
      saved.get("mode") == "train"
      and (saved.get("step") == config.num_train_steps or saved.get("stopped_early"))
      and "test_set" in saved
      and not saved.get("preempted")
    )
    if complete and same_config:
      saved_steps = workdir.training_steps()
      found = saved if saved_steps and saved_steps[-1] == saved["step"] else None
  if not parallel.broadcast_from_main(found is not None):
    return None
  return found if found is not None else workdir.read_result("train")  # the same shared file


def _same_config(saved_text: str | None, config: ml_collections.ConfigDict) -> bool:
  """Whether a run's saved config.json is `config`: the same text, or the same but for fields
  added since it was saved (config.run_config.ADDED_FIELDS) that `config` leaves at the value that
  reproduces the old behaviour, and for "auto" where that means the run's own value
  (config.run_config.AUTO_MEANS_THE_RUNS)."""
  if saved_text is None:
    return False
  if saved_text == config.to_json_best_effort(indent=2):
    return True
  saved, current = json.loads(saved_text), json.loads(config.to_json_best_effort())
  command.absolute_paths(saved)  # a run saved before: its relative paths, as the command read them
  if saved == current:
    return True
  for path, old_value in run_config.ADDED_FIELDS.items():
    saved_node, current_node, name = _groups(saved, current, path)
    if name not in saved_node and current_node.get(name) == old_value:
      current_node.pop(name, None)
  for path in run_config.AUTO_MEANS_THE_RUNS:  # "auto" given to a run means the run's value
    saved_node, current_node, name = _groups(saved, current, path)
    if current_node.get(name) == "auto":
      if name in saved_node:
        current_node[name] = saved_node[name]
      else:  # saved before the field: model.attention was ours then, as "auto" now means
        current_node.pop(name, None)
  return saved == current


def _groups(saved: dict[str, Any], current: dict[str, Any], path: str) -> tuple[dict, dict, str]:
  """The two configs' groups holding dotted `path`'s field ({} where absent), and its name."""
  *groups, name = path.split(".")
  for group in groups:
    saved, current = saved.get(group, {}), current.get(group, {})
  return saved, current, name


def _components_before_data(
  config: ml_collections.ConfigDict, workdir: Workdir
) -> tuple[Components | None, init_from.Source | None]:
  """The command's Components when the vocabulary exists before any data is read (a resumed
  run's; a fine-tuning source's), checked against the checkpoints it will read; else None (the
  data trains the vocabulary). Also the fine-tuning source, when there is one to start from."""
  if workdir.training_steps():
    if config.get("init_from"):
      init_from.log_ignored(config.init_from, workdir)
    components = Components.load(config, workdir)
    check_resume_fits(config, workdir, components)
    return components, None
  if not config.get("init_from"):
    rank = int(config.optim.get("lora_rank", 0))
    if rank:
      raise errors.ConfigError(
        f"config.optim.lora_rank={rank} adapts a trained model, but config.init_from is empty "
        f"and {workdir.path} has no checkpoint to resume: name the run (or import) to fine-tune."
      )
    return None, None
  source = init_from.check(config, workdir)
  components = Components(config, open_vocabulary(source.vocabulary, int(config.data.vocab_size)))
  init_from.check_fits(source, components)
  init_from.adopt_vocabulary(config, workdir, source)  # before the data looks for one
  return components, source


def _final_dev_figures(trainer: Trainer) -> dict[str, float]:
  """The dev figures of the last step: this process's evaluation, or, when the last step was
  evaluated before a restart (a run killed while it scored the test set), its saved record."""
  if trainer.last_dev:
    return trainer.last_dev
  path = trainer.workdir.metrics_path("dev")
  return files.last_record_of_step(path, trainer.step) or {}


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: Workdir, config_name: str = ""
) -> dict[str, Any]:
  """Trains (resuming from the workdir's latest checkpoint) and returns the final figures.

  `config` is validated (`modes.train`, the entry of the command and of the API, does it once);
  `config_name` is what --config named (recorded in run.json, for messages).
  """
  workdir.create()
  with WorkdirLock(workdir) as lock:  # before any work: a second job stops at once
    components, source = _components_before_data(config, workdir)
    tokenizer = components.tokenizer if components is not None else None
    data = data_lib.make_data(config, workdir, tokenizer=tokenizer)
    if components is None:
      components = Components(config, data.tokenizer)
    setup = TrainSetup(components)
    with Trainer(setup, data, workdir, lock, source) as trainer, PreemptionGuard() as guard:
      # Written once the checkpoint is known to fit this config: a refused resume changes nothing.
      if parallel.is_main_process():
        workdir.keep_vocabulary(config)  # before config.json: which makes the copy the run's
        workdir.write_config(config)
        workdir.write_run_record(
          config_name, identity.training_data(config, workdir.training_data())
        )
      return _train(config, workdir, trainer, guard)


def _train(
  config: ml_collections.ConfigDict, workdir: Workdir, trainer: Trainer, guard: PreemptionGuard
) -> dict[str, Any]:
  """The loop itself, from the restored step to the last, then the test set's scores."""
  trainer.evaluate_if_missed()
  last = trainer.step >= config.num_train_steps
  if last:
    logging.info(
      "Already trained to step %d (num_train_steps=%d).", trainer.step, config.num_train_steps
    )
  stopped_early = trainer.exhausted()
  last = last or stopped_early
  if not last and trainer.budget_reached(before_this_run=True):  # every process asks, together
    # A run that stopped at its budget, rerun: it would otherwise train one step past it.
    logging.info(
      "Already used config.max_train_minutes=%g (step %d).", config.max_train_minutes, trainer.step
    )
    last = True
  total = config.num_train_steps
  while not last:
    step = trainer.train_step()
    stop = guard.should_stop(step)  # every step: multi-host runs agree on it collectively
    last = step == total
    if not last and trainer.budget_reached():
      logging.info(
        "Reached config.max_train_minutes=%g at step %d.", config.max_train_minutes, step
      )
      last, total = True, step  # finish as at the last step: log, save, evaluate, score
    log_step = last or step % config.log_every_steps == 0
    if log_step:
      trainer.log(total)
    # A clock-based save is decided collectively, so only where every process asks: each
    # step in a single process, at log steps in several (see Trainer.budget_reached).
    trainer.save(force=last or stop, check_clock=log_step or not trainer.multi_process)
    if stop:
      # No evaluation on the way out: the grace period before a hard kill is for saving.
      trainer.checkpoints.wait_until_finished()
      logging.warning("%s", guard.message(step))
      return {"mode": "train", "step": step, "preempted": True}
    if last or step % config.eval_every_steps == 0:
      trainer.evaluate()
      if not last and trainer.exhausted():
        stopped_early = last = True
        trainer.save(force=True, check_clock=False)

  result: dict[str, Any] = {"mode": "train", "step": trainer.step, **_final_dev_figures(trainer)}
  result.update(parameters=trainer.parameters, trained_parameters=trainer.trained_parameters)
  if trainer.keeper is not None:
    result.update(trainer.keeper.tracker.summary(), stopped_early=stopped_early)
  # The training figures are on disk before the (long) test decoding starts.
  workdir.write_result(dict(result, test="pending"), echo=False)
  result.update(
    evaluation.score_test_set(
      Session(
        trainer.components,
        trainer.p_state.params,
        tag=f"step{trainer.step}",
        step=trainer.step,
        folder=workdir,
        replicated=True,
      ),
      trainer.data,
      workdir.eval_dir,
    )
  )
  return result
