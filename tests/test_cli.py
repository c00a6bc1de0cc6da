"""main.py turns user mistakes into one clear line (exit code 2) before any expensive work."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def run_main(*args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "main.py", *args], cwd=REPO, input=stdin,
                        capture_output=True, text=True, timeout=300,
                        env=None if env is None else {**os.environ, **env})


@pytest.mark.parametrize("args,culprit", [
    (["--config=configs/multi30k.py", "--config.data.dir=/nonexistent/m30k"], "/nonexistent/m30k"),
    (["--config=configs/demo.py", "--config.model.num_heads=3"], "config.model.num_heads=3"),
    (["--config=configs/demo.py", "--mode=eval"], "No checkpoint in"),
    (["--config=configs/demo.py", "--mode=average", "--num_checkpoints=3"], "holds 0 checkpoints"),
    (["--config=configs/demo.py", "--mode=translate", "--input=/nonexistent/in.txt"],
     "/nonexistent/in.txt"),
    (["--config=configs/demo.py", "--config.model.dtype=float16"],
     "config.model.dtype='float16' is not supported"),
    (["--config=configs/demo.py", "--config.optim.accumulate_steps=0"],
     "config.optim.accumulate_steps must be >= 1"),
    (["--config=configs/demo.py", "ENV:JAX_COORDINATOR_ADDRESS=127.0.0.1:1"],
     "JAX_COORDINATOR_ADDRESS is set but JAX_NUM_PROCESSES and JAX_PROCESS_ID not"),
])
def test_user_errors_are_one_line(tmp_path, args, culprit):
  env = dict(a[4:].split("=", 1) for a in args if a.startswith("ENV:"))
  args = [a for a in args if not a.startswith("ENV:")]
  result = run_main(f"--workdir={tmp_path / 'w'}", *args, env=env)
  assert result.returncode == 2, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and culprit in last, last
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "w" / "spm.model").exists()  # failed before training a vocabulary
