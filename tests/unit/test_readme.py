"""Every command of the README and of docs/*.md runs, as written, in order, in a scratch folder.

`tests/readme.py` splits the pages into commands and each into a chain (commands sharing a
folder: the quick start trains `runs/demo`, which the next sections average, evaluate, export ...).
Each chain is one test; its `--mode=prepare` commands run first (the data the others read, as a
user prepares it before running the results table's commands). What changes from a user's
machine, and nothing else:

- size: `main.py`, the `flaxformer-nmt` command and the benchmark scripts in the scratch folder
  are stand-ins that run the real ones with small overrides appended (model size, vocabulary,
  steps), and WMT14's TFDS configs read a mock WMT14 (`tests/mock_wmt14_main.py`);
  `benchmarks/memory.py`'s TPU target is compiled for the host (no libtpu here);
- Multi30k is downloaded from a server on 127.0.0.1 serving the real files beside the checkout
  (`--config.data.url` appended), and absolute workdirs (`/shared/runs/big`) are placed inside the
  scratch folder;
- `srun` and `gcloud` are stand-ins that start 2 processes x 4 CPU devices on this machine (SLURM's
  variables; for TPU metadata, JAX's coordinator variables); `sacrebleu -t wmt14` reads a small
  newstest2014 from a local cache instead of downloading;
- `pip install` lines run with `--dry-run` (resolving every extra, installing nothing); the test
  command of the quick start is `.ci/run`'s, which runs it verbatim.
"""

from __future__ import annotations

import helpers
import readme

REPO = helpers.REPO


def test_every_readme_command_belongs_to_a_chain_that_runs_it():
  commands = readme.commands()
  assert len(commands) >= 40
  orphans = [c.text for c in commands if c.chain not in readme.CHAINS]
  assert not orphans, f"README commands no test runs: {orphans}"
  for chain in readme.CHAINS:
    assert readme.in_chain(chain), f"chain {chain} has no README command"
