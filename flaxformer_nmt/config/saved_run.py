"""The config file `--config` stands for when it is left out: the run's own saved config.

`cli.py` passes `--config=<this file>:<workdir>` when a command names a trained `--workdir` and no
`--config`, so `--config.X=...` overrides apply to the run's saved config.json, read with its types
(run_config.from_json), exactly as they would to a config file.
"""

from __future__ import annotations

import os

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import run_config


def get_config(workdir: str) -> ml_collections.ConfigDict:
  config = run_config.saved(workdir)
  if config is None:
    raise errors.ConfigError(
      f"--workdir={workdir} has no {run_config.CONFIG_FILE}; pass --config=... (the config it "
      "was trained with)."
    )
  return config


PATH = os.path.abspath(__file__)
