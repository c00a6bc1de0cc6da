"""Checkpoints under jax.distributed: 2 real CPU processes on 127.0.0.1 agree on saves, on the
fallback past a corrupt step, on preemption, and on the step to restore when storage shows files
to the hosts at different moments. The single-process paths are in test_checkpoint.py.
"""

from __future__ import annotations

import os
import pathlib

import pytest

# Several-process jobs take both cores: the tests that start them share one xdist worker, so two
# such jobs never run at once (waiting in gloo's collectives while another job has the cores
# slows both several-fold); the other worker runs the rest meanwhile.
pytestmark = pytest.mark.xdist_group("several_processes")

_WORKER = r"""
import os, signal, sys, time
import numpy as np
import jax
import orbax.checkpoint as ocp
from flaxformer_nmt.checkpoints import checkpointer as checkpoint
from flaxformer_nmt.training import preemption

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    os.environ["JAX_COORDINATOR_ADDRESS"], 2, int(os.environ["JAX_PROCESS_ID"]))
pid, directory = jax.process_index(), sys.argv[1]
state = {"params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "step": np.int32(4)}
with checkpoint.Checkpointer(directory, keep=3, every_steps=0, every_secs=0.5) as ckpt:
  assert ckpt.restore(state) is None
  time.sleep(0.6 if pid == 0 else 0.0)  # only process 0's clock says a save is due...
  saved = ckpt.save(4, lambda: (state, {"epoch": 0, "index": 4}))
  print("due", saved, flush=True)  # ...and process 1 must agree
  ckpt.save(6, lambda: (dict(state, step=np.int32(6)), {"epoch": 0, "index": 6}), force=True)
  ckpt.wait_until_finished()
ocp.multihost.sync_global_processes("saved")
if pid == 0:  # damage the newest checkpoint; both processes must fall back in step
  for root, _, files in os.walk(os.path.join(directory, "6")):
    for name in files:
      os.truncate(os.path.join(root, name), 0)
ocp.multihost.sync_global_processes("damaged")
with checkpoint.Checkpointer(directory, keep=3, every_steps=0) as ckpt:
  restored, data, step = ckpt.restore(state)
  print("restored", step, data["index"], restored["params"]["w"].sum(), flush=True)
with preemption.PreemptionGuard() as guard:
  for step in range(1, 500):
    if pid == 1 and step == 3:
      os.kill(os.getpid(), signal.SIGTERM)  # one host is preempted...
    if guard.should_stop(step):
      print("stop", step, flush=True)  # ...and both stop at the same step
      break
    time.sleep(0.01)
jax.distributed.shutdown()
"""


def _run_two_processes(
  tmp_path: pathlib.Path, worker: str, keep: tuple[str, ...]
) -> list[list[str]]:
  """Runs `worker` as 2 jax.distributed processes of 1 CPU device; each one's printed lines that
  start with a word of `keep`."""
  import socket
  import subprocess
  import sys

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  script = tmp_path / "worker.py"
  script.write_text(worker)
  procs = []
  for pid in range(2):
    env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      XLA_FLAGS="--xla_force_host_platform_device_count=1",
      JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
      JAX_PROCESS_ID=str(pid),
    )
    procs.append(
      subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  outputs = []
  try:
    for proc in procs:
      out, _ = proc.communicate(timeout=120)
      assert proc.returncode == 0, out[-3000:]
      outputs.append([line for line in out.splitlines() if line.split(" ")[0] in keep])
  finally:
    for proc in procs:
      proc.kill()
  return outputs


def test_two_processes_agree_write_once_and_fall_back_together(tmp_path):
  """jax.distributed on 2 CPU processes: the multi-host paths, which one process never takes."""
  outputs = _run_two_processes(tmp_path, _WORKER, ("due", "restored", "stop"))
  assert outputs[0] == outputs[1], outputs
  due, restored, stop = outputs[0]
  assert due == "due True" and restored == "restored 4 4 15.0" and stop.startswith("stop")
  assert (tmp_path / "ckpt" / "unreadable" / "6").is_dir()
  # Arrays and JSON were written once, by process 0.
  assert [p.name for p in (tmp_path / "ckpt" / "4" / "state").glob("ocdbt.process_*")] == [
    "ocdbt.process_0"
  ]


_LAGGING_WORKER = r"""
import os, sys
import numpy as np
import jax
import orbax.checkpoint as ocp
from flaxformer_nmt.checkpoints import checkpointer as checkpoint
from flaxformer_nmt.checkpoints import reader as checkpoint_reader

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    os.environ["JAX_COORDINATOR_ADDRESS"], 2, int(os.environ["JAX_PROCESS_ID"]))
pid, directory = jax.process_index(), sys.argv[1]
checkpoint_reader.RETRY_DELAYS_S = (0.2, 0.2)
state = {"params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "step": np.int32(4)}
with checkpoint.Checkpointer(directory, keep=3, every_steps=0) as ckpt:
  for step in (4, 6):
    ckpt.save(step, lambda: (dict(state, step=np.int32(step)), {"index": step}), force=True)
  ckpt.wait_until_finished()
ocp.multihost.sync_global_processes("saved")
if pid == 1:
  # Eventually consistent storage, as seen from host 1: it lists step 6 late, and its first read
  # of step 6 finds a file missing.
  real_steps, real_restore = checkpoint_reader.CheckpointDir.steps, ocp.CheckpointManager.restore
  checkpoint_reader.CheckpointDir.steps = lambda self: [s for s in real_steps(self) if s < 6]
  misses = [1]

  def late_restore(self, step, *args, **kwargs):
    if step == 6 and misses[0]:
      misses[0] -= 1
      raise FileNotFoundError(2, "No such file or directory", f"{directory}/6/state/d/x")
    return real_restore(self, step, *args, **kwargs)

  ocp.CheckpointManager.restore = late_restore
with checkpoint.Checkpointer(directory, keep=3, every_steps=0) as ckpt:
  restored, data, step = ckpt.restore(state)
  print("restored", step, data["index"], int(restored["step"]), flush=True)
  ckpt.save(step + 1, lambda: (dict(state, step=np.int32(step + 1)), {"index": step + 1}),
            force=True)  # both processes in the same collective save: no deadlock
  ckpt.wait_until_finished()
  print("saved", ckpt.all_steps(), flush=True)
jax.distributed.shutdown()
"""


def test_process_0_decides_the_step_every_process_restores(tmp_path):
  """Multi-host restore on storage that hosts see at different moments (NFS, GCS-FUSE): host 1
  does not list the newest step yet and its first read of it misses a file. Every process must
  still restore the step process 0 chose, and nothing may be set aside."""
  outputs = _run_two_processes(tmp_path, _LAGGING_WORKER, ("restored", "saved"))
  assert outputs[0] == outputs[1] == ["restored 6 6 6", "saved [4, 6, 7]"]
  assert not (tmp_path / "ckpt" / "unreadable").exists()
