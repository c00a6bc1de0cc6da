"""The config file `--config` stands for when it is left out: the run's own saved config.json.

`cli.py` passes `--config=<this file>:<workdir>` when a command names a trained `--workdir` and no
`--config`, so `--config.X=...` overrides apply to the run's saved config.json, read with its types
(run_config.from_json), exactly as they would to a config file. The file is read through the
run's `Workdir`, whose read the command's `open_run` then reuses (run_config.read_saved_text): one
read of config.json per command.
"""

from __future__ import annotations

import os

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import run_config
from flaxformer_nmt.run.folder import Workdir


def get_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's saved config. The command line checks first that there is one (cli.py, naming
  --config); the API (api.load, api.load_run_config) has no --config, so its messages name what it
  has instead."""
  folder = Workdir(workdir)
  text = folder.saved_config_text()
  if text is None:
    if not os.path.isdir(workdir):
      raise errors.ConfigError(f"{workdir}: no such folder (a trained or imported run's workdir).")
    raise errors.ConfigError(
      f"{workdir} has no {run_config.CONFIG_FILE}: no run was trained or imported there (a run "
      "trained before runs saved their config: api.load_config(<its config>), then "
      "api.translate(config, workdir, lines))."
    )
  return run_config.from_json(text, folder.config_path)


PATH = os.path.abspath(__file__)
