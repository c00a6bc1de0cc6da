"""Runs `main.py` as a real multi-process job on this machine: N processes x D CPU devices.

Processes meet through `jax.distributed` on 127.0.0.1 (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID, as a hand-launched multi-host run) and their CPU collectives go over gloo; one
process is launched without those variables, as a user would on a single host.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Job:
  """The processes of one launch; process p's output goes to `<log_prefix>.p<p>.log`."""

  def __init__(self, procs: list[subprocess.Popen], logs: list[pathlib.Path]) -> None:
    self.procs = procs
    self.log_paths = logs

  def log(self, process: int = 0) -> str:
    path = self.log_paths[process]
    return path.read_text(errors="replace") if path.exists() else ""

  def wait(self, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for proc in self.procs:
      try:
        codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 1)))
      except subprocess.TimeoutExpired as e:
        self.kill()
        raise AssertionError(f"job timed out after {timeout}s; log:\n{self.log()[-4000:]}") from e
    return codes

  def wait_for(self, text: str, timeout: float) -> None:
    """Waits until process 0's log shows `text`."""
    deadline = time.monotonic() + timeout
    while text not in self.log():
      if any(p.poll() is not None for p in self.procs):
        raise AssertionError(f"a process exited before {text!r}:\n{self.log()[-4000:]}")
      if time.monotonic() > deadline:
        self.kill()
        raise AssertionError(f"no {text!r} after {timeout}s:\n{self.log()[-4000:]}")
      time.sleep(0.05)

  def signal(self, sig: int) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        proc.send_signal(sig)

  def kill(self) -> None:
    self.signal(signal.SIGKILL)
    for proc in self.procs:
      proc.wait()


def launch(
  args: list[str],
  *,
  processes: int,
  devices: int,
  log_prefix: pathlib.Path,
  cache_dir: pathlib.Path | None = None,
  script: str = "main.py",
) -> Job:
  """Starts `python <script> *args` (main.py, from the repository root) as `processes` processes
  of `devices` CPU devices each."""
  port = free_port()
  procs, logs = [], []
  for p in range(processes):
    env = dict(os.environ)
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
      env.pop(var, None)
    env.update(
      JAX_PLATFORMS="cpu",
      TF_CPP_MIN_LOG_LEVEL="3",
      XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )
    if cache_dir is not None:
      # Later launches load their programs instead of compiling them (most of a launch's time).
      env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
      env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the tiny model compiles in < 1 s
    if processes > 1:
      env.update(
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        JAX_NUM_PROCESSES=str(processes),
        JAX_PROCESS_ID=str(p),
      )
    log = pathlib.Path(f"{log_prefix}.p{p}.log")
    logs.append(log)
    with open(log, "ab") as out:
      procs.append(
        subprocess.Popen(
          [sys.executable, script, *args],
          cwd=REPO,
          env=env,
          stdout=out,
          stderr=subprocess.STDOUT,
        )
      )
  return Job(procs, logs)
