"""The command's model, built once: `Components` (vocabulary, model, parameter shapes) and, for a
trained run, `LoadedModel` (with the parameters read), by one loader.

Every mode builds one `Components` and hands it to every check and stage that needs the model: the
resume and fine-tuning checks compare checkpoints with `abstract_params`, the trainer and the
translator run `model`, evaluation decodes with `tokenizer`. Building it reads no corpus and no
parameters: a vocabulary load and one `jax.eval_shape`. `load` (eval, translate, score, serve,
export, attention) asks run/selection.py which parameters `--checkpoint` (and each `--ensemble`
member) names, builds the Components, checks every checkpoint's shapes against it before reading
any, then reads them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import params as params_lib
from flaxformer_nmt.data.tokenizer import Vocabulary, open_vocabulary, vocabulary_exists
from flaxformer_nmt.model.ensemble import Ensemble
from flaxformer_nmt.model.shapes import abstract_params as model_abstract_params
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import compile_cache, parallel


@dataclasses.dataclass(frozen=True)
class LoadedModel:
  """A model ready to decode: the command's Components (config, tokenizer, model), the
  parameters (an Ensemble with --ensemble), a line saying where they came from, a tag for output
  file names, and the step of the checkpoint read."""

  components: Components
  params: Any
  description: str
  tag: str
  step: int  # of the checkpoint read (--workdir's, with --ensemble)


def load(
  config: ml_collections.ConfigDict, run: Workdir, which: str, members: Sequence[str] = ()
) -> LoadedModel:
  """The parameters `which` names (and, with `members`, each member's by the same rule in its
  own workdir), checked against the model before any of them is read. `config` is the command's,
  already held to the run's rules (modes._begin; api.load_run_config gives the run's own)."""
  location = selection.resolve(run, which)
  resolved = selection.resolve_members(run, members, which, config) if members else []
  components = Components.load(config, run)
  params_lib.check_fits(location.directory, components.abstract_params)
  for member, member_location in resolved:
    try:
      params_lib.check_fits(member_location.directory, components.abstract_params)
    except errors.UserError as e:
      raise type(e)(f"--ensemble member {member.path}: {e}") from e
  params, description, step = params_lib.load_with_step(location, components.abstract_params)
  tag = params_lib.tag(location, step)  # e.g. "averaged-params_5_steps_200_to_600", "step1000"
  if resolved:
    loaded = [params_lib.load(loc, components.abstract_params) for _, loc in resolved]
    params = Ensemble((params, *(p for p, _ in loaded)))
    parts = [
      description,
      *(f"{m.path}: {d}" for (m, _), (_, d) in zip(resolved, loaded, strict=True)),
    ]
    description = f"ensemble of {len(parts)} models: " + "; ".join(parts)
    tag = ensemble_tag(which, parts)
  logging.info("Using %s.", description)
  return LoadedModel(components, params, description, tag, step)


def ensemble_tag(which: str, parts: Sequence[str]) -> str:
  """The name an ensemble's output files carry: its size, the rule, and a digest of what each
  member loaded (its checkpoint's path and step), so two ensembles never share file names."""
  digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
  return f"ensemble{len(parts)}_{which}_{digest[:8]}"


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
  def load(cls, config: ml_collections.ConfigDict, workdir: Workdir) -> Components:
    """With the run's existing vocabulary (`Workdir.vocabulary`), never trained: for the modes
    that read no corpus. One line naming it if it is missing."""
    path = workdir.vocabulary(config)
    if not vocabulary_exists(path):
      what = "config.data.vocab_path=" if config.data.vocab_path else ""
      raise errors.CheckpointError(
        f"{what}{path}: no such vocabulary; train with --workdir={workdir.path} first."
      )
    return cls(config, open_vocabulary(path))

  @functools.cached_property
  def abstract_params(self) -> Any:
    """The parameters' tree of jax.ShapeDtypeStruct: the template every restore reads into."""
    return model_abstract_params(self.model_cfg)

  @property
  def max_src_len(self) -> int:
    """The longest source the model is given, EOS included (config.data.max_len)."""
    return int(self.config.data.max_len)
