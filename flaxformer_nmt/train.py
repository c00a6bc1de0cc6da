"""The training loop: orchestration only (the maths is in steps.py, devices in parallel.py).

A run is fully determined by its config, seed and global device count: the batches come from a
seeded, resumable pipeline with one stream per device, dropout keys derive from (seed, step,
device), and each checkpoint stores the state and every stream's position, so rerunning the
command after a preemption continues the same run, and 2 processes of 4 devices run exactly what
1 process of 8 runs.

Multi-process runs: every process executes this same loop, step for step, and every collective
(the pmapped steps, decoding, checkpoint saves, the gathering of data positions, decisions taken
by process 0's clock) is entered by all of them at the same step. Host reads of device values go
through `parallel.local_replica`, which needs no other process. Only process 0 writes files and
logs.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from flaxformer_nmt import checkpoint, optim, parallel, reporting, steps
from flaxformer_nmt.preemption import PreemptionGuard
from flaxformer_nmt import data as data_lib
from flaxformer_nmt.model import Transformer, TransformerConfig, init_params


class NonFiniteLossError(RuntimeError):
  """Training produced a NaN/Inf loss or gradient."""


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Catches impossible values up front, before any data is read or program compiled."""
  positive = ("num_train_steps", "log_every_steps", "eval_every_steps", "checkpoint_every_steps",
              "keep_checkpoints")
  for name in positive:
    if config[name] < 1:
      raise ValueError(f"config.{name} must be >= 1, got {config[name]}.")
  if config.optim.accumulate_steps < 1:
    raise ValueError(
        f"config.optim.accumulate_steps must be >= 1, got {config.optim.accumulate_steps}."
    )
  if not 0.0 <= config.label_smoothing < 1.0:
    raise ValueError(f"config.label_smoothing must be in [0, 1), got {config.label_smoothing}.")
  if config.data.tokens_per_batch < config.data.max_len:
    raise ValueError(
        f"config.data.tokens_per_batch={config.data.tokens_per_batch} is smaller than "
        f"config.data.max_len={config.data.max_len}: not even one row fits."
    )
  TransformerConfig.from_config(config.model, vocab_size=2)  # model fields, before any data work
  if config.data.max_len > config.model.max_len and config.model.positional == "learned":
    raise ValueError(
        f"config.data.max_len={config.data.max_len} exceeds config.model.max_len="
        f"{config.model.max_len}, the size of the learned position table."
    )


class Run:
  """The pieces every mode needs: data, tokenizer, model, optimizer, checkpoints."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, need_train: bool) -> None:
    validate_config(config)
    self.config = config
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    self.data = data_lib.make_data(
        config, workdir, num_devices=jax.device_count(),
        process_index=jax.process_index(), process_count=jax.process_count(),
        need_train=need_train, accumulate_steps=config.optim.accumulate_steps,
    )
    self.tokenizer = self.data.tokenizer
    self.model_cfg = TransformerConfig.from_config(
        config.model, self.tokenizer.vocab_size, auto_dtype=parallel.auto_dtype()
    )
    logging.info(
        "Model: %s size, %s matrix products (config.model.dtype=%s)%s; parameters float32.",
        config.model.size, np.dtype(self.model_cfg.dtype).name, config.model.dtype,
        ", rematerialised layers" if self.model_cfg.remat else "",
    )
    self.model = Transformer(self.model_cfg)
    self.tx, self.schedule = optim.make_optimizer(config.optim, self.model_cfg.d_model)
    # Only training opens the checkpoint manager: opening it cleans up unfinished saves, which
    # must never happen to a training job running beside an eval in the same workdir.
    self.checkpoints = None
    if need_train:
      self.checkpoints = checkpoint.Checkpointer(
          checkpoint.checkpoint_dir(workdir),
          keep=config.keep_checkpoints,
          every_steps=config.checkpoint_every_steps,
          every_secs=config.checkpoint_every_secs,
      )

  def initial_state(self) -> steps.TrainState:
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(self.config.seed))
    params = jax.jit(init_params, static_argnums=0)(self.model_cfg, init_rng)
    return jax.device_get(steps.create_train_state(params, self.tx, dropout_rng))

  def abstract_params(self) -> Any:
    return jax.eval_shape(lambda rng: init_params(self.model_cfg, rng), jax.random.PRNGKey(0))


def _host_metrics(device_metrics: list[dict[str, Any]]) -> list[dict[str, float]]:
  # psum'd on device, so every replica holds the global value: read one this process holds.
  return [jax.tree.map(float, parallel.local_replica(m)) for m in device_metrics]


def _summarize(history: list[dict[str, float]], seconds: float) -> dict[str, float]:
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


def _global_data_state(train_iter: data_lib.DeviceStreams) -> dict[str, Any]:
  """Every stream's input position, for the checkpoint (a collective in multi-process runs).

  Each process holds its own devices' streams; orbax writes the checkpoint's JSON from process 0,
  which must therefore see all of them. Every process calls this at the same step.
  """
  local = np.array(
      [[p["epoch"], p["index"], p["size"]] for p in train_iter.get_state()], np.int32
  )  # [local streams, 3]
  everyone = parallel.all_gather_host(local).reshape(-1, 3)  # [streams, 3], process-major
  return {"streams": [dict(zip(("epoch", "index", "size"), map(int, row))) for row in everyone]}


def _restore_data_state(train_iter: data_lib.DeviceStreams, saved: dict[str, Any]) -> None:
  positions, exact = data_lib.resume_positions(
      saved, train_iter.first_stream, train_iter.stream_sizes, jax.device_count()
  )
  if not exact:
    logging.warning(
        "The checkpoint's input positions do not match this run's %d data streams (one per "
        "device; was it trained on another number of devices?). The input continues at epoch %d "
        "without skipping data, but the batches differ from an uninterrupted run's.",
        jax.device_count(), positions[0]["epoch"],
    )
  train_iter.set_state(positions)


def evaluate_dev_loss(run: Run, p_eval_step, replicated_params) -> dict[str, float]:
  """Per-token dev loss, perplexity and accuracy over the whole dev set, in order."""
  totals: dict[str, float] = {}
  for batch in run.data.eval_batches("dev"):
    out = jax.tree.map(float, parallel.local_replica(p_eval_step(replicated_params,
                                                                 parallel.shard(batch))))
    for k, v in out.items():
      totals[k] = totals.get(k, 0.0) + v
  tokens = max(totals.get("tokens", 0.0), 1.0)
  nll = totals.get("nll_sum", 0.0) / tokens
  return {
      "dev_loss": totals.get("loss_sum", 0.0) / tokens,
      "dev_nll": nll,
      "dev_perplexity": float(np.exp(min(nll, 50.0))),
      "dev_accuracy": totals.get("correct", 0.0) / tokens,
  }


def dev_bleu(run: Run, replicated_params: Any) -> dict[str, float]:
  """BLEU of greedy (by default) decoding on the first dev sentences: a cheap learning signal.

  `replicated_params` are on every local device (the train state's); all processes decode.
  """
  from flaxformer_nmt import evaluate, translate  # decoding is only needed at eval time

  n = run.config.eval.dev_bleu_sentences
  pairs = run.data.pairs("dev")[:n]
  if not pairs:
    return {}
  decode_cfg = ml_collections.ConfigDict(run.config.decode.to_dict())
  decode_cfg.beam_size = run.config.eval.dev_bleu_beam_size
  hyps = translate.translate_lines(
      [s for s, _ in pairs], run.tokenizer, run.model, replicated_params, decode_cfg,
      max_src_len=run.config.data.max_len, replicated=True,
  )
  score, _ = evaluate.sacrebleu_score(hyps, [r for _, r in pairs])
  return {"dev_bleu": score}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (resuming from the workdir's latest checkpoint) and returns the final figures."""
  run = Run(config, workdir, need_train=True)
  if parallel.is_main_process():
    reporting.write_text_atomic(os.path.join(workdir, "config.json"),
                                config.to_json_best_effort(indent=2))

  state = run.initial_state()
  restored = run.checkpoints.restore(state)
  trained_seconds = 0.0
  if restored is not None:
    state, data_state, step = restored
    _restore_data_state(run.data.train, data_state)
    trained_seconds = float(data_state.get("train_seconds", 0.0))
    logging.info("Resumed from step %d in %s.", step, run.checkpoints.directory)
  start_step = int(state.step)
  total = config.num_train_steps
  if start_step >= total:
    logging.info("Already trained to step %d (num_train_steps=%d).", start_step, total)

  p_train_step = parallel.pmap_train_step(
      steps.train_step, model=run.model, tx=run.tx, schedule=run.schedule,
      label_smoothing=config.label_smoothing, accumulate_steps=config.optim.accumulate_steps,
      skip_nonfinite=config.skip_nonfinite, inject_nan_at_step=config.debug_inject_nan_at_step,
  )
  p_eval_step = parallel.pmap_eval_step(
      steps.eval_step, model=run.model, label_smoothing=config.label_smoothing
  )
  p_state = parallel.replicate(state)
  del state
  multi_process = jax.process_count() > 1
  writer = reporting.MetricWriter(workdir)
  progress = reporting.Progress(start_step, total)
  pending: list[dict[str, Any]] = []  # device metrics not yet fetched (keeps dispatch async)
  clock = reporting.TrainClock(trained_seconds)  # process 0's decides for everyone
  last_log_seconds = clock.seconds()
  budget_seconds = config.max_train_minutes * 60.0
  dev_path = os.path.join(workdir, "dev_metrics.jsonl")
  last_dev: dict[str, float] = {}
  step = start_step

  def flush(step: int) -> list[dict[str, float]]:
    """Fetches pending metrics; stops the run on a non-finite loss before anything is saved."""
    history = _host_metrics(pending)
    pending.clear()
    for i, m in enumerate(history):
      bad_step = step - len(history) + i + 1
      if m["nonfinite"] and not config.skip_nonfinite:
        raise NonFiniteLossError(
            f"Non-finite loss or gradient at step {bad_step}; not saved. The last good "
            f"checkpoint is step {run.checkpoints.latest_step()} in {run.checkpoints.directory}. "
            "Lower config.optim.lr_scale, or set config.skip_nonfinite=True to skip such steps."
        )
      if m["nonfinite"]:
        logging.warning("Skipped step %d: non-finite loss or gradient.", bad_step)
    return history

  def save(step: int, force: bool = False) -> None:
    flush(step)
    data_state = dict(_global_data_state(run.data.train), train_seconds=clock.seconds())
    run.checkpoints.save(step, parallel.local_replica(p_state), data_state, force=force)

  def evaluate(step: int) -> dict[str, float]:
    """Dev loss and dev BLEU now, logged, summarised and appended to dev_metrics.jsonl."""
    flush(step)
    eval_start = time.monotonic()
    dev = {"train_minutes": clock.seconds() / 60.0}
    dev.update(evaluate_dev_loss(run, p_eval_step, p_state.params))
    dev.update(dev_bleu(run, p_state.params))
    logging.info("step %d  %s  (%.1fs)", step, "  ".join(f"{k} {v:.4g}" for k, v in dev.items()),
                 time.monotonic() - eval_start)
    writer.scalars(step, dev, prefix="dev/")
    _append_jsonl(dev_path, {"step": step, **dev})
    clock.exclude(time.monotonic() - eval_start)  # evaluations are not training time
    return dev

  def budget_reached(step: int) -> bool:
    """Whether config.max_train_minutes is used up; one clock (process 0's) decides for all.

    Several processes would disagree at some step, and the one that stopped first would leave the
    others waiting in the next collective forever. So multi-process runs decide only at log steps,
    where the host waits for the device anyway, and broadcast process 0's answer.
    """
    if not budget_seconds or step >= total:
      return False
    reached = clock.seconds() >= budget_seconds
    if not multi_process:
      return reached
    if step % config.log_every_steps:
      return False
    return bool(parallel.broadcast_from_main(np.asarray(reached)))

  with PreemptionGuard() as guard, writer, run.checkpoints:
    if start_step and (start_step % config.eval_every_steps == 0 or start_step >= total):
      # The run that saved this step was stopped before (or while) evaluating it: evaluate now,
      # so the learning curve has no hole where the preemption was.
      missing = start_step not in _logged_steps(dev_path)
      if bool(parallel.broadcast_from_main(np.asarray(missing))):
        logging.info("Evaluating step %d, which the interrupted run did not.", start_step)
        last_dev = evaluate(start_step)
    while step < total:
      batch = next(run.data.train)
      p_state, metrics = p_train_step(p_state, parallel.shard(batch))
      pending.append(metrics)
      if len(pending) > 1:
        # At most one step in flight: the next batch is packed while this one computes, but the
        # host never races ahead of the device, so time budgets, rates and ETAs are real.
        jax.block_until_ready(pending[-2])
      step += 1
      stop = guard.should_stop(step)  # every step: multi-host runs agree on it collectively
      if budget_reached(step):
        logging.info("Reached config.max_train_minutes=%g at step %d.", config.max_train_minutes,
                     step)
        total = step  # finish as if this were the last step: log, save, evaluate, score

      log_step = step % config.log_every_steps == 0 or step == total
      if log_step:
        history = flush(step)
        now = clock.seconds()
        summary = _summarize(history, now - last_log_seconds)
        eta = progress.eta(step, budget_seconds - now if budget_seconds else None)
        reporting.log_train(step, total, summary, eta)
        writer.scalars(step, summary, prefix="train/")
        last_log_seconds = now

      # A clock-based save is decided collectively, so only where every process checks: each step
      # in a single process, at log steps in several (see budget_reached).
      if (step == total or stop
          or run.checkpoints.should_save(step, check_clock=log_step or not multi_process)):
        save(step, force=step == total or stop)
      if stop:
        # No evaluation on the way out: the grace period before a hard kill is for saving.
        run.checkpoints.wait_until_finished()
        logging.warning("%s", guard.message(step))
        return {"mode": "train", "step": step, "preempted": True}

      if step % config.eval_every_steps == 0 or step == total:
        last_dev = evaluate(step)

  result: dict[str, Any] = {"mode": "train", "step": step, **last_dev}
  # The training figures are on disk before the (long) test decoding starts.
  reporting.write_result(workdir, dict(result, test="pending"), echo=False)
  result.update(test_scores(run, p_state.params, tag=f"step{step}", replicated=True))
  return result


def test_scores(run: Run, params: Any, tag: str, *, replicated: bool = False) -> dict[str, Any]:
  """Decodes the test set (greedy and with the configured beam) and scores it.

  Every process decodes its share and scores the whole set; process 0 writes the files.
  """
  from flaxformer_nmt import evaluate, translate

  pairs = run.data.pairs("test")
  sources, refs = [s for s, _ in pairs], [r for _, r in pairs]
  if not replicated:
    params, replicated = parallel.replicate(params), True  # once for both searches
  out: dict[str, Any] = {}
  beams = sorted({1, run.config.decode.beam_size})
  for beam in beams:
    decode_cfg = ml_collections.ConfigDict(run.config.decode.to_dict())
    decode_cfg.beam_size = beam
    start = time.monotonic()
    hyps = translate.translate_lines(sources, run.tokenizer, run.model, params, decode_cfg,
                                     max_src_len=run.config.data.max_len, replicated=replicated)
    name = "greedy" if beam == 1 else f"beam{beam}"
    scores = evaluate.score_and_write(
        hyps, refs, os.path.join(run.workdir, "eval"), f"test_{tag}_{name}",
        run.config.data.tgt_lang, write=parallel.is_main_process(),
    )
    logging.info("test %s: sacreBLEU %.2f (%s), tokenized BLEU %.2f, %d sentences in %.1fs",
                 name, scores["sacrebleu"], scores["sacrebleu_signature"], scores["tokenized_bleu"],
                 len(hyps), time.monotonic() - start)
    out[f"test_sacrebleu_{name}"] = scores["sacrebleu"]
    out[f"test_tokenized_bleu_{name}"] = scores["tokenized_bleu"]
    out["sacrebleu_signature"] = scores["sacrebleu_signature"]
  return out


def _logged_steps(path: str) -> set[int]:
  """Steps already in dev_metrics.jsonl (a half-written last line, from a kill, is ignored)."""
  steps_seen = set()
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        try:
          steps_seen.add(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
          continue
  return steps_seen


def _append_jsonl(path: str, record: dict[str, Any]) -> None:
  """Dev figures as JSON lines beside the TensorBoard files: plots and scripts read these."""
  if parallel.is_main_process():
    with open(path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
