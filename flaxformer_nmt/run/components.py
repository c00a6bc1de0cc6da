"""What every mode builds once and hands down: the vocabulary, the model and its parameter shapes.

A command makes one `Components` (modes.py for inference, training/loop.py once it knows where
the vocabulary comes from) and passes it to every check and stage that needs the model: the
resume and fine-tuning checks compare checkpoints with `abstract_params`, the trainer and the
translator run `model`, evaluation decodes with `tokenizer`. Nothing here reads corpora, restores
parameters or decodes, so building it costs a vocabulary load and one `jax.eval_shape`.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.data.tokenizer import Tokenizer
from flaxformer_nmt.model.shapes import abstract_params as model_abstract_params
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import compile_cache, parallel


class Components:
  """The config (validated), its tokenizer, the model config, the model, and the parameters'
  shapes and dtypes (`abstract_params`, computed once, allocating nothing)."""

  def __init__(self, config: ml_collections.ConfigDict, tokenizer: Tokenizer) -> None:
    # The first thing every compiling command builds, once its cheap checks have passed: so a
    # command refused for a missing checkpoint or file says that, and only that.
    compile_cache.enable(config.get("compile_cache", "auto"))
    self.config = config
    self.tokenizer = tokenizer
    self.model_cfg = TransformerConfig.from_config(
      config.model, tokenizer.vocab_size, auto_dtype=parallel.auto_dtype()
    )
    self.model = Transformer(self.model_cfg)
    logging.info(
      "Model: %s size, %s matrix products (config.model.dtype=%s)%s; parameters float32; "
      "vocabulary %s (%d pieces).",
      config.model.size,
      np.dtype(self.model_cfg.dtype).name,
      config.model.dtype,
      ", rematerialised layers" if self.model_cfg.remat else "",
      tokenizer.model_path,
      tokenizer.vocab_size,
    )

  @classmethod
  def load(cls, config: ml_collections.ConfigDict, workdir: Workdir) -> Components:
    """With the run's existing vocabulary (`Workdir.vocabulary`), never trained: for the modes
    that read no corpus. One line naming it if it is missing."""
    path = workdir.vocabulary(config)
    if not os.path.isfile(path):
      what = "config.data.vocab_path=" if config.data.vocab_path else ""
      raise errors.CheckpointError(
        f"{what}{path}: no such vocabulary; train with --workdir={workdir.path} first."
      )
    return cls(config, Tokenizer(path))

  @functools.cached_property
  def abstract_params(self) -> Any:
    """The parameters' tree of jax.ShapeDtypeStruct: the template every restore reads into."""
    return model_abstract_params(self.model_cfg)

  @property
  def max_src_len(self) -> int:
    """The longest source the model is given, EOS included (config.data.max_len)."""
    return int(self.config.data.max_len)
