"""One training run's moving parts, and what the loop does with them at a step: `Trainer`.

A run is fully determined by its config, seed and global device count: the batches come from a
seeded, resumable pipeline with one stream per device, dropout keys derive from (seed, step,
device), and each checkpoint stores the state and every stream's position, so rerunning the
command after a preemption continues the same run, and 2 processes of 4 devices run exactly what
1 process of 8 runs.

Multi-process runs: every process executes the same loop, step for step, and every collective
(the pmapped steps, decoding, checkpoint saves, the gathering of data positions, decisions taken
by process 0's clock) is entered by all of them at the same step. Host reads of device values go
through `parallel.local_replica`, which needs no other process. Only process 0 writes files and
logs.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import checkpointer
from flaxformer_nmt.data import pipeline as data_lib
from flaxformer_nmt.data import prefetch, streams
from flaxformer_nmt.decoding import evaluation
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import console, files, parallel
from flaxformer_nmt.training import best, init_from, lora, metrics, optim, steps
from flaxformer_nmt.training.lock import WorkdirLock
from flaxformer_nmt.training.state import TrainSetup


def _host_metrics(device_metrics: list[dict[str, Any]]) -> list[dict[str, float]]:
  # psum'd on device, so every replica holds the global value: read one this process holds.
  return [jax.tree.map(float, parallel.local_replica(m)) for m in device_metrics]


def _global_data_state(train_iter: streams.DeviceStreams) -> dict[str, Any]:
  """Every stream's input position, for the checkpoint (a collective in multi-process runs).

  Each process holds its own devices' streams; orbax writes the checkpoint's JSON from process 0,
  which must therefore see all of them. Every process calls this at the same step.
  """
  local = np.array(
    [[p["epoch"], p["index"], p["size"]] for p in train_iter.get_state()], np.int32
  )  # [local streams, 3]
  everyone = parallel.all_gather_host(local).reshape(-1, 3)  # [streams, 3], process-major
  fields = ("epoch", "index", "size")
  return {"streams": [dict(zip(fields, map(int, row), strict=True)) for row in everyone]}


def _epochs_read(train_iter: Any) -> float | None:
  """How many passes over the training data this process's streams have read (their mean, with
  the fraction of the current one), for the training line; None if the iterator has no
  position. Local: no collective."""
  try:
    states = train_iter.get_state()
  except AttributeError:
    return None
  passes = [p["epoch"] + p["index"] / max(p["size"], 1) for p in states]
  return float(np.mean(passes)) if passes else None


def _restore_data_state(train_iter: streams.DeviceStreams, saved: dict[str, Any]) -> None:
  positions, exact = streams.resume_positions(
    saved, train_iter.first_stream, train_iter.stream_sizes, jax.device_count()
  )
  if not exact:
    logging.warning(
      "The checkpoint's input positions do not match this run's %d data streams (one per "
      "device; was it trained on another number of devices?). The input continues at epoch %d "
      "without skipping data, but the batches differ from an uninterrupted run's.",
      jax.device_count(),
      positions[0]["epoch"],
    )
  train_iter.set_state(positions)


class Trainer:
  """One training run's moving parts: the replicated state, metrics in flight, clock, writers.

  `train_and_evaluate` drives it; each method is one thing the loop does at a step.
  """

  def __init__(
    self,
    setup: TrainSetup,
    data: data_lib.Data,
    workdir: Workdir,
    lock: WorkdirLock | None = None,
    source: init_from.Source | None = None,
  ) -> None:
    """`source`: start from its parameters (config.init_from) when there is nothing to resume."""
    self.components: Components = setup.components
    self.data = data
    self.workdir = workdir
    self.lock = lock  # checked before each checkpoint: never write one for a workdir lost
    self._compiled = False  # the train step: compiled by its first call (train_step says so)
    self.config = config = setup.config
    model = self.components.model
    logging.info(
      "Devices: %d (%d processes x %d local, %s); %d rows of %d tokens per device per update, "
      "in %d micro-batch(es).",
      data.num_devices,
      data.process_count,
      jax.local_device_count(),
      jax.devices()[0].platform,
      data.global_rows // data.num_devices,
      data.max_len,
      config.optim.accumulate_steps,
    )
    self.checkpoints = checkpointer.Checkpointer(
      workdir.checkpoints,
      keep=config.keep_checkpoints,
      every_steps=config.checkpoint_every_steps,
      every_secs=config.checkpoint_every_secs,
    )
    restored = self.checkpoints.restore(setup.abstract_state())
    trained_seconds = 0.0
    if restored is None:
      state = setup.initial_state()
      if source is not None:  # fine-tuning: step 0, fresh Adam moments and data position
        params = init_from.load_params(source, self.components.abstract_params, workdir)
        # Fresh Adam moments (or adapters), and a parameter average that starts at the source's.
        state = setup.start_from(state, jax.device_get(params))
    else:
      state, data_state, step = restored
      _restore_data_state(data.train, data_state)
      trained_seconds = float(data_state.get("train_seconds", 0.0))
      logging.info("Resumed from step %d in %s.", step, self.checkpoints.directory)
    # What the result reports: every parameter, and those the optimizer updates (LoRA: adapters).
    self.parameters = lora.count(state.params)
    self.trained_parameters = lora.count(steps.trainable(state))
    if state.lora is not None:
      logging.info(
        "LoRA: %d adapter parameters train (%.3f%% of the model's %d; rank %d on %s, scale %g, "
        "adapter dropout %g); the other weights are frozen.",
        lora.count(state.lora.adapters),
        100 * lora.count(state.lora.adapters) / lora.count(state.params),
        lora.count(state.params),
        setup.lora_rank,
        ",".join(setup.lora_targets),
        setup.lora_scale,
        setup.train_model.cfg.lora_dropout,
      )
    self.start_step = self.step = int(state.step)
    self.p_train_step = parallel.pmap_train_step(
      steps.train_step,
      model=setup.train_model,
      tx=setup.tx,
      schedule=setup.schedule,
      label_smoothing=config.label_smoothing,
      accumulate_steps=config.optim.accumulate_steps,
      skip_nonfinite=config.skip_nonfinite,
      loss_scale_period=int(config.optim.get("loss_scale_period", 2000)),
      lora_scale=setup.lora_scale,
    )
    self.p_eval_step = parallel.pmap_eval_step(
      steps.eval_step, model=model, label_smoothing=config.label_smoothing
    )
    self.p_state = parallel.replicate(state)
    self.multi_process = jax.process_count() > 1
    self.writer = metrics.MetricWriter(workdir)
    self.progress = console.Progress(self.start_step, config.num_train_steps)
    self.clock = metrics.TrainClock(trained_seconds)  # process 0's decides for everyone
    self.pending: list[dict[str, Any]] = []  # device metrics not yet fetched (async dispatch)
    self._last_log_seconds = self.clock.seconds()
    self._last_input_wait = self._input_wait()
    self.last_dev: dict[str, float] = {}
    self.keeper = None  # config.best_metric's tracker and <workdir>/best/
    if config.best_metric:
      self.keeper = best.Keeper(
        config.best_metric, config.early_stopping_patience, workdir, self.start_step
      )

  def __enter__(self) -> Trainer:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.writer.close()
    self.checkpoints.close()
    if isinstance(self.data.train, prefetch.Prefetcher):
      self.data.train.close()

  def train_step(self) -> int:
    """Dispatches the next step and returns its number (one step at most stays in flight)."""
    batch = next(self.data.train)
    first = not self._compiled
    if first:  # the first call compiles (or reads the compilation cache): minutes for big models
      logging.info("Compiling the train step...")
      start = time.monotonic()
    self.p_state, metrics = self.p_train_step(self.p_state, parallel.shard(batch))
    if first:
      self._compiled = True
      logging.info("Compiled the train step in %.1f s.", time.monotonic() - start)
    self.pending.append(metrics)
    if len(self.pending) > 1:
      # The next batch is packed while this step computes, but the host never races ahead of
      # the device, so time budgets, rates and ETAs are real.
      jax.block_until_ready(self.pending[-2])
    self.step += 1
    return self.step

  def flush(self) -> list[dict[str, float]]:
    """Fetches pending metrics; stops the run on a non-finite loss before anything is saved."""
    history = _host_metrics(self.pending)
    self.pending.clear()
    for i, m in enumerate(history):
      bad_step = self.step - len(history) + i + 1
      if m["nonfinite"] and not self.config.skip_nonfinite:
        raise errors.NonFiniteLossError(
          f"Non-finite loss or gradient at step {bad_step}; not saved. The last good checkpoint "
          f"is step {self.checkpoints.latest_step()} in {self.checkpoints.directory}. Lower "
          "config.optim.lr_scale, or set config.skip_nonfinite=True to skip such steps."
        )
      if m["nonfinite"]:
        logging.warning("Skipped step %d: non-finite loss or gradient.", bad_step)
      if m.get("overflow"):  # float16: the update is skipped and the loss scale halved
        logging.info(
          "Step %d overflowed float16 at loss scale %g: skipped, the scale halved.",
          bad_step,
          m["loss_scale"],
        )
    return history

  def log(self, total: int) -> None:
    """Train figures since the last log: console, TensorBoard, train_metrics.jsonl."""
    history = self.flush()
    now = self.clock.seconds()
    summary = metrics.summarize_train(history, now - self._last_log_seconds)
    wait = self._input_wait()
    if wait is not None:
      # The share of training time the loop waited for a packed batch (0 = input kept ahead).
      elapsed = max(now - self._last_log_seconds, 1e-9)
      summary["input_wait_fraction"] = min((wait - self._last_input_wait) / elapsed, 1.0)
      self._last_input_wait = wait
    epoch = _epochs_read(self.data.train)
    if epoch is not None:
      summary["epoch"] = epoch
    budget = self.config.max_train_minutes * 60.0
    eta = self.progress.eta(self.step, budget - now if budget else None)
    metrics.log_train(self.step, total, summary, eta)
    self.writer.scalars(self.step, summary, split="train")
    self._last_log_seconds = now

  def _input_wait(self) -> float | None:
    """Seconds the loop has waited for prefetched batches (None when packing is in the loop)."""
    return getattr(self.data.train, "wait_seconds", None)

  def save(self, *, force: bool, check_clock: bool) -> None:
    def make() -> tuple[Any, dict[str, Any]]:
      if self.lock is not None:
        self.lock.check_held()
      self.flush()  # a non-finite loss stops the run before anything poisoned is saved
      data_state = dict(_global_data_state(self.data.train), train_seconds=self.clock.seconds())
      return parallel.local_replica(self.p_state), data_state

    self.checkpoints.save(self.step, make, force=force, check_clock=check_clock)

  def _dev_figures(self, params: Any) -> dict[str, float]:
    """Dev loss and dev BLEU of replicated `params` (a multilingual run's per direction, and
    their mean)."""
    c = self.config
    # A session of these parameters: its searches are the compiled ones every session shares.
    session = Session(self.components, params, replicated=True)
    return evaluation.dev_figures(
      self.data,
      self.p_eval_step,
      session,
      c.eval.dev_bleu_sentences,
      c.eval.dev_bleu_beam_size,
      c.eval.get("bleu_protocol", ""),
    )

  def evaluate(self) -> dict[str, float]:
    """Dev figures now (of the raw parameters, and of their average as ema_* when EMA is on):
    logged, written to TensorBoard and dev_metrics.jsonl, and offered to the best tracker."""
    self.flush()
    start = time.monotonic()
    dev = {"train_minutes": self.clock.seconds() / 60.0}
    dev.update(self._dev_figures(self.p_state.params))
    ema = optim.ema_of(self.p_state.opt_state)
    if ema is not None:
      dev.update({best.EMA_PREFIX + k: v for k, v in self._dev_figures(ema).items()})
    logging.info(
      "step %d  %s  (%.1fs)",
      self.step,
      "  ".join(f"{k} {v:.4g}" for k, v in dev.items()),
      time.monotonic() - start,
    )
    if self.keeper is not None:  # best/ first: a logged best always has its parameters saved
      self.keeper.offer(self.step, dev, self.p_state, self.lock)
    self.writer.scalars(self.step, dev, split="dev")
    self.clock.exclude(time.monotonic() - start)  # evaluations are not training time
    self.last_dev = dev
    return dev

  def evaluate_if_missed(self) -> None:
    """Evaluates the restored step if it is an evaluation step that its run never evaluated.

    A run stopped between saving such a step and evaluating it would otherwise leave a hole in
    the learning curve.
    """
    step, c = self.start_step, self.config
    if not step or (step % c.eval_every_steps and step < c.num_train_steps):
      return
    logged = {r.get("step") for r in files.read_jsonl(self.workdir.metrics_path("dev"))}
    if parallel.broadcast_from_main(step not in logged):
      logging.info("Evaluating step %d, which the interrupted run did not.", step)
      self.evaluate()

  def exhausted(self) -> bool:
    """Whether config.early_stopping_patience evaluations in a row brought no improvement."""
    return self.keeper is not None and self.keeper.exhausted(self.step)

  def budget_reached(self, before_this_run: bool = False) -> bool:
    """Whether config.max_train_minutes is used up; one clock (process 0's) decides for all.
    `before_this_run`: by the earlier runs' time alone (asked before the first step, so a slow
    start-up never ends a run, fresh or resumed, before it trains a step).

    Several processes would disagree at some step, and the one that stopped first would leave the
    others waiting in the next collective forever. So multi-process runs decide only at log steps,
    where the host waits for the device anyway, and broadcast process 0's answer.
    """
    budget = self.config.max_train_minutes * 60.0
    if not budget:
      return False
    used = self.clock.seconds_before() if before_this_run else self.clock.seconds()
    reached = used >= budget
    if not self.multi_process:
      return reached
    if self.step % self.config.log_every_steps:
      return False
    return bool(parallel.broadcast_from_main(reached))
