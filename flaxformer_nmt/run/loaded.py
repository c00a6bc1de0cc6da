"""A loaded model: one typed object, built by one loader, that every command decoding with a trained
run shares: eval, translate, serve, export and attention (modes.py), and the server (serving/).

`load` asks run/selection.py which parameters `--checkpoint` (and each `--ensemble`
member) names, builds the command's one `Components`, checks every checkpoint's shapes against it
before reading any, then reads them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import params as params_lib
from flaxformer_nmt.model.ensemble import Ensemble
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir


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
