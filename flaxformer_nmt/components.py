"""The set-up every mode shares: the workdir, the data a mode reads, the tokenizer, the model and
its optimizer, and how to translate with it.

`Run` is built once per command (by `modes.py`, or the training loop) from a validated config;
nothing here trains, decodes a test set or writes results, so translating or averaging never
imports the training loop.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from flaxformer_nmt import data as data_lib
from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import reader as checkpoint_reader
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.decoding import evaluation as evaluate
from flaxformer_nmt.decoding import translator as translate
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig, init_params
from flaxformer_nmt.runtime import files, parallel
from flaxformer_nmt.training import optim, steps


def check_workdir(workdir: str) -> None:
  """ConfigError if `--workdir` names something other than a directory (before any work)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise errors.ConfigError(f"--workdir={workdir} exists and is not a directory.")


def prepare_workdir(workdir: str) -> None:
  check_workdir(workdir)
  os.makedirs(workdir, exist_ok=True)


def check_checkpoint_fits(config: ml_collections.ConfigDict, workdir: str, directory: str) -> None:
  """CheckpointMismatchError, before any data is read, if `directory`'s newest checkpoint holds
  another model (e.g. trained as base, resumed with the big config). Nothing if it holds none.

  Only parameter names and shapes are compared, from the checkpoint's metadata; a checkpoint whose
  metadata cannot be read is left to the restore (which falls back past a corrupt one).
  """
  reader = checkpoint_reader.CheckpointDir(directory)
  steps_saved = reader.steps()
  if not steps_saved:
    return
  tokenizer = tokenizer_lib.load_tokenizer(config.data, workdir)  # the run's: it exists
  model_cfg = TransformerConfig.from_config(
    config.model, tokenizer.vocab_size, auto_dtype=parallel.auto_dtype()
  )
  params = jax.eval_shape(lambda rng: init_params(model_cfg, rng), jax.random.PRNGKey(0))
  try:
    reader.check_matches(steps_saved[-1], {"params": checkpoint_reader.state_dict(params)})
  except checkpoint_reader.Unreadable:
    pass


def check_resume_fits(config: ml_collections.ConfigDict, workdir: str, directory: str) -> None:
  """check_checkpoint_fits for a resume from `directory`, plus the optimizer state's make-up: a
  run keeps a parameter average (config.optim.ema_decay > 0) or not, as its checkpoints were
  saved (its config.json says which; the decay itself may change)."""
  check_checkpoint_fits(config, workdir, directory)
  saved = files.saved_config(workdir).get("optim", {})
  if "ema_decay" not in saved or not checkpoint_reader.CheckpointDir(directory).steps():
    return
  was, now = float(saved["ema_decay"]), float(config.optim.ema_decay)
  if bool(was) != bool(now):
    turn = "on" if now else "off"
    raise errors.CheckpointMismatchError(
      f"config.optim.ema_decay={now:g}, but the checkpoints in {directory} were saved with "
      f"ema_decay={was:g}: a run under way cannot turn its parameter average {turn} (start "
      f"another workdir, with config.init_from={workdir} to keep the parameters)."
    )


class Run:
  """The pieces every mode needs: data, tokenizer, model, optimizer (the config is validated).

  `data` says how much of the corpora a mode reads: "train" (training: all splits, tokenized),
  "eval" (dev and test text, for BLEU), "test" (`--mode=eval`: the test text only) or "none"
  (average, translate: the vocabulary only).
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, data: str) -> None:
    prepare_workdir(workdir)
    self.config = config
    self.workdir = workdir
    self.data = None
    if data == "none":
      self.tokenizer = tokenizer_lib.load_tokenizer(config.data, workdir)
    else:
      self.data = data_lib.make_data(
        config,
        workdir,
        num_devices=jax.device_count(),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        need_train=data == "train",
        accumulate_steps=config.optim.accumulate_steps,
        eval_splits=("test",) if data == "test" else ("dev", "test"),
      )
      self.tokenizer = self.data.tokenizer
    self.model_cfg = TransformerConfig.from_config(
      config.model, self.tokenizer.vocab_size, auto_dtype=parallel.auto_dtype()
    )
    logging.info(
      "Model: %s size, %s matrix products (config.model.dtype=%s)%s; parameters float32.",
      config.model.size,
      np.dtype(self.model_cfg.dtype).name,
      config.model.dtype,
      ", rematerialised layers" if self.model_cfg.remat else "",
    )
    self.model = Transformer(self.model_cfg)
    self.tx, self.schedule = optim.make_optimizer(config.optim, self.model_cfg.d_model)

  def initial_state(self) -> steps.TrainState:
    """The state at step 0: freshly initialised parameters, Adam's zeros (host arrays)."""
    return jax.device_get(self._make_initial_state())

  def _make_initial_state(self) -> steps.TrainState:
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(self.config.seed))
    params = jax.jit(init_params, static_argnums=0)(self.model_cfg, init_rng)
    return steps.create_train_state(params, self.tx, dropout_rng)

  def abstract_state(self) -> steps.TrainState:
    """The train state's structure, shapes and dtypes, allocating nothing: the template a resume
    restores into (the real initial state of big is ~2.5 GB of host memory thrown away)."""
    return jax.eval_shape(self._make_initial_state)

  def abstract_params(self) -> Any:
    return jax.eval_shape(lambda rng: init_params(self.model_cfg, rng), jax.random.PRNGKey(0))

  def translator(self, params: Any, *, replicated: bool) -> Any:
    """`(sources, beam_size) -> translations` with this run's model and config.decode, on every
    device of every process (`params` replicated over the local devices, or one host copy)."""

    def translate_fn(sources: Sequence[str], beam_size: int) -> list[str]:
      return translate.translate_lines(
        list(sources),
        self.tokenizer,
        self.model,
        params,
        self.config.decode,
        max_src_len=self.config.data.max_len,
        replicated=replicated,
        beam_size=beam_size,
      )

    return translate_fn

  def test_scores(self, params: Any, tag: str, *, replicated: bool = False) -> dict[str, Any]:
    """BLEU of the test set, greedy and with config.decode's beam (see evaluate.test_scores)."""
    if not replicated:
      params, replicated = parallel.replicate(params), True  # once for both searches
    return evaluate.test_scores(
      self.data.pairs("test"),
      self.translator(params, replicated=replicated),
      test_set=self.data.split_name("test"),
      beam_size=self.config.decode.beam_size,
      beam_style=self.config.decode.beam_style,
      tgt_lang=self.config.data.tgt_lang,
      compound_split=self.config.eval.compound_split,
      out_dir=os.path.join(self.workdir, "eval"),
      tag=tag,
    )
