"""The README's multi-host launches, run as tests/e2e/test_readme.py runs its commands
(`-m readme`): `JAX_COORDINATOR_ADDRESS=...` on this machine, `srun` and `gcloud` through local
stand-ins, each starting 2 processes x 4 CPU devices (tests/readme_sandbox.py)."""

from __future__ import annotations

import json
import re

import pytest

import readme
import readme_sandbox


@pytest.mark.readme
@pytest.mark.xdist_group("several_processes")  # one 2-process job at a time on 2 cores
@pytest.mark.parametrize("chain", ["local", "srun", "gcloud"])
def test_multi_host_launch(chain, tmp_path):
  """The README's launches of 2 processes x 4 devices, to the end of a short training run."""
  steps = ["--config.num_train_steps=4", "--config.checkpoint_every_steps=4"]
  small = ["--config.data.demo_dev_size=8", "--config.data.demo_test_size=8"]
  overrides = {"demo": readme.DEMO[2:] + small + steps, "wmt14": readme.SMALL_MODEL + steps}
  ((command, proc, box),) = list(
    readme_sandbox.run_chain(chain, tmp_path, overrides, MOCK_WMT14_SIZES="1000,8,8")
  )
  workdir = re.search(r'--workdir=([^\s"]+)', command.text).group(1)
  workdir = box.root / "abs" / workdir[1:] if workdir.startswith("/") else box.repo / workdir
  result = json.loads((workdir / "train_result.json").read_text())
  assert result["step"] == 4, result
  # Process 0 logs for the job: 8 devices in all, from 2 processes.
  assert "Devices: 8 (2 processes x 4 local, cpu)" in proc.stderr, proc.stderr[-3000:]
  if chain == "srun":
    assert "Detected SlurmCluster with 2 processes" in proc.stderr
