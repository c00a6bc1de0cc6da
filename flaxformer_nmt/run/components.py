"""The command's model, built once and without parameters: `Components` (the validated config, the
vocabulary, the model, the parameters' shapes).

Every mode builds one `Components` and hands it to every check and stage that needs the model: the
resume and fine-tuning checks compare checkpoints with `abstract_params`, the trainer runs
`model`, a decoding session (decoding/session.py, the one loaded model) decodes with `model` and
`tokenizer`. Building it reads no corpus and no parameters: a vocabulary load and one
`jax.eval_shape`.
"""

from __future__ import annotations

import functools
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.data.tokenizer import Vocabulary, open_vocabulary, vocabulary_exists
from flaxformer_nmt.model.shapes import abstract_params as model_abstract_params
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import compile_cache, parallel


class Components:
  """The config (validated), its tokenizer, the model config, the model, and the parameters'
  shapes and dtypes (`abstract_params`, computed once, allocating nothing)."""

  def __init__(self, config: ml_collections.ConfigDict, tokenizer: Vocabulary) -> None:
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
  def around(
    cls,
    tokenizer: Any,
    model: Any,
    decode: ml_collections.ConfigDict,
    max_src_len: int,
    data: ml_collections.ConfigDict | None = None,
  ) -> Components:
    """Components around a model already built (or None) and any tokenizer with encode and
    decode, for a config holding only `decode` and `data` (with data.max_len=`max_src_len`):
    tests' stand-in tokenizers and hand-built models. A command builds its own (`load`)."""
    fields = {"directions": "", "tgt_lang": ""} if data is None else data.to_dict()
    self = cls.__new__(cls)
    self.config = ml_collections.ConfigDict(
      {"decode": decode, "data": {**fields, "max_len": int(max_src_len)}}
    )
    self.tokenizer = tokenizer
    self.model = model
    self.model_cfg = getattr(model, "cfg", None)
    return self

  @classmethod
  def load(cls, config: ml_collections.ConfigDict, workdir: Workdir) -> Components:
    """With the run's existing vocabulary (`Workdir.vocabulary`), never trained: for the modes
    that read no corpus. One line naming it if it is missing."""
    path = workdir.vocabulary(config)
    if not vocabulary_exists(path):
      what = "config.data.vocab_path=" if config.data.vocab_path else ""
      raise errors.CheckpointError(
        f"{what}{path}: no such vocabulary; train with --workdir={workdir.path} first."
      )
    return cls(config, open_vocabulary(path, int(config.data.vocab_size)))

  @functools.cached_property
  def abstract_params(self) -> Any:
    """The parameters' tree of jax.ShapeDtypeStruct: the template every restore reads into."""
    return model_abstract_params(self.model_cfg)

  @property
  def max_src_len(self) -> int:
    """The longest source the model is given, EOS included (config.data.max_len)."""
    return int(self.config.data.max_len)
