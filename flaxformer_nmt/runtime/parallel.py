"""The only device-aware code: multi-host start-up, pmap wrappers, host <-> device transfers.

One process drives its local devices; `jax.distributed` joins several processes (hosts) into one
run. Each process feeds its local devices with their rows of the global batch, and pmap's
collectives span every device of every process, so the per-device steps in `training/steps.py` are
unaware of hosts. pmap places the devices of process p at positions p * local_device_count + j of
its axis (devices of one host are contiguous), which is how the input pipeline numbers its streams.

Reading results on the host never indexes a pmap output (`x[0]` is a global gather since JAX 0.8,
which hangs or fails across hosts): `local_replica` copies one *addressable* shard, and values that
differ between processes are exchanged with `all_gather_host`, a collective every process enters.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.runtime import executables, xla_flags

# Before any device is touched: XLA reads XLA_FLAGS when JAX starts its backend (xla_flags.py).
xla_flags.apply_defaults()

AXIS = "batch"
DISTRIBUTED_MODES = ("auto", "on", "off")


# ------------------------------------------------------------------------------------------------
# Start-up.


def _detected_cluster() -> tuple[str, int, int] | None:
  """(name, process count, this process's id) of a cluster JAX can bootstrap from (a TPU pod
  slice, SLURM, Open MPI, Kubernetes).

  Uses the detectors `jax.distributed.initialize()` itself runs; they live in a private module, so
  a JAX without them counts as "no cluster" (then use --distributed=on or the variables).
  """
  try:
    from jax._src import clusters  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  for env in getattr(clusters.ClusterEnv, "_cluster_types", []):
    if getattr(env, "opt_in_only_method", False):
      continue
    try:
      if env.is_env_present():
        return env.__name__, int(env.get_process_count()), int(env.get_process_id())
    except Exception:  # pylint: disable=broad-except  (a half-configured cluster: not ours)
      continue
  return None


def maybe_initialize_distributed(mode: str = "auto") -> None:
  """Joins a multi-process run, if there is one. Call before anything touches a device.

  - JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID set (a hand-launched run, e.g.
    several CPU processes on 127.0.0.1): initialise with them.
  - `mode="on"`: `jax.distributed.initialize()` without arguments, JAX discovers the cluster.
  - `mode="auto"` (default): the same, where JAX's detectors find a cluster of more than one process
    (a Cloud TPU pod slice, a SLURM or Open MPI job, a Kubernetes JobSet). A single-process job
    (one 8-GPU host, a single-host TPU VM, Colab) needs no initialisation and gets none.
  - `mode="off"`: never.
  """
  if mode not in DISTRIBUTED_MODES:
    raise ValueError(f"--distributed must be one of {DISTRIBUTED_MODES}, got {mode!r}.")
  if mode == "off":
    return
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    missing = [v for v in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if v not in os.environ]
    if missing:
      raise errors.ConfigError(
        f"JAX_COORDINATOR_ADDRESS is set but {' and '.join(missing)} not: a hand-launched "
        "multi-process run needs all three."
      )
    _quiet_unless_main(int(os.environ["JAX_PROCESS_ID"]))
    # Must not touch a backend before initialize(); gloo only matters to CPU collectives.
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
      coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
      num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
      process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
  elif mode == "on":
    jax.distributed.initialize()
  else:
    cluster = _detected_cluster()
    if cluster is None or cluster[1] <= 1:
      return
    _quiet_unless_main(cluster[2])
    logging.info("Detected %s with %d processes: initialising jax.distributed.", *cluster[:2])
    jax.distributed.initialize()
  _quiet_unless_main(jax.process_index())
  logging.info(
    "Process %d of %d; %d local / %d global devices.",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )


def _quiet_unless_main(process_index: int) -> None:
  """One log for the run: processes other than 0 report only warnings and errors."""
  if process_index != 0:
    logging.set_verbosity(logging.WARNING)


def is_main_process() -> bool:
  """Process 0 writes logs, summaries, the vocabulary, result files and JSON."""
  return jax.process_index() == 0


def auto_dtype() -> str:
  """The activation dtype `model.dtype="auto"` means on this machine.

  bfloat16 where the hardware computes it natively (TPUs; NVIDIA GPUs from Ampere, compute
  capability 8.0, on). float16 on older NVIDIA GPUs (T4, V100: tensor cores for float16 only,
  about 8x their float32 rate; bfloat16 is emulated there), trained with a loss scale. float32 on
  CPUs, where both half types are emulated (XLA:CPU widens them around each product) and gain
  nothing but a rounding risk.
  """
  device = jax.devices()[0]
  if device.platform == "tpu":
    return "bfloat16"
  if device.platform == "gpu":
    capability = getattr(device, "compute_capability", None)  # CUDA only, e.g. "9.0"
    if capability is None:
      return "bfloat16"  # ROCm: every MI200/MI300 computes bfloat16
    try:
      return "bfloat16" if int(str(capability).split(".")[0]) >= 8 else "float16"
    except ValueError:
      return "float32"  # a capability we cannot read: the safe choice
  return "float32"


def precision() -> dict[str, Any]:
  """What `model.dtype="auto"` picks here and why: the first device's kind, its CUDA compute
  capability (GPUs), the dtype, and whether training it keeps a loss scale (float16). For
  notebooks and logs: one glance says whether a Colab runtime will train in float16."""
  device = jax.devices()[0]
  dtype = auto_dtype()
  return {
    "device": str(getattr(device, "device_kind", device.platform)),
    "platform": device.platform,
    "compute_capability": getattr(device, "compute_capability", None),
    "dtype": dtype,
    "loss_scale": dtype == "float16",
  }


# ------------------------------------------------------------------------------------------------
# pmap.


def pmap_train_step(step_fn: Callable[..., Any], **static: Any) -> Callable[..., Any]:
  """pmapped train step; the incoming state's buffers are donated (updated in place)."""
  return jax.pmap(
    functools.partial(step_fn, axis_name=AXIS, **static), axis_name=AXIS, donate_argnums=(0,)
  )


def pmap_eval_step(step_fn: Callable[..., Any], **static: Any) -> Callable[..., Any]:
  return jax.pmap(functools.partial(step_fn, axis_name=AXIS, **static), axis_name=AXIS)


def pmap_rows(fn: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
  """Runs a per-device `fn(replicated, rows [b, ...], ...) -> [b, ...]` over every device.

  The returned host function takes the *global* batch, [devices * b, ...] numpy, on every process
  (one or more arrays with the same rows, e.g. inputs and their line numbers), and returns the
  global result on every process (an array, or a pytree of them; None leaves stay None). Row r
  goes to device r % devices (sorted input then gives every device a similar mix of lengths);
  each process computes its devices' rows and the results are exchanged with one all-gather per
  array. `fn` must not use collectives: each device runs its own program (a decoding loop ends on
  each device when its own rows are done).

  With a `name` (unique to `fn` and everything it closes over), its compiled programs are kept
  on disk for later commands (`executables.Program`).
  """
  p_fn = jax.pmap(fn, axis_name=AXIS)
  if name is not None:
    p_fn = executables.Program(p_fn, name)

  def run(replicated: Any, *batches: np.ndarray) -> Any:
    devices, local = jax.device_count(), jax.local_device_count()
    rows = batches[0].shape[0]
    if rows % devices or any(b.shape[0] != rows for b in batches):
      raise ValueError(f"A batch of {rows} rows cannot be spread over {devices} devices.")
    per_device = rows // devices
    first = jax.process_index() * local

    def by_device(batch: np.ndarray) -> np.ndarray:
      spread = batch.reshape(per_device, devices, *batch.shape[1:]).swapaxes(0, 1)
      return spread[first : first + local]  # [local, b, ...]

    out = local_rows(p_fn(replicated, *(by_device(b) for b in batches)))  # leaves [local, b, ...]

    def gather(x: np.ndarray) -> np.ndarray:
      everyone = all_gather_host(x).reshape(devices, per_device, *x.shape[2:])
      return everyone.swapaxes(0, 1).reshape(rows, *x.shape[2:])

    return jax.tree.map(gather, out)

  return run


# ------------------------------------------------------------------------------------------------
# Host <-> device.


def replicate(tree: Any, devices: Sequence[jax.Device] | None = None) -> Any:
  """Copies a host pytree to every local device: leaves gain a leading [local devices] axis.

  One copy per device is put directly (no [devices, ...] host array is built, which would cost
  devices x the state's size in host memory for the big model).
  """
  devices = list(devices or jax.local_devices())
  mesh = jax.sharding.Mesh(np.array(devices), (AXIS,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))

  def put(x: Any) -> jax.Array:
    x = np.asarray(x)
    shards = [jax.device_put(x[None], d) for d in devices]
    return jax.make_array_from_single_device_arrays((len(devices), *x.shape), sharding, shards)

  return jax.tree.map(put, tree)


def _first_local_shard(x: Any) -> np.ndarray:
  """Host copy of the first addressable replica of a pmapped [devices, ...] array."""
  if not isinstance(x, jax.Array):
    return np.asarray(x)[0]
  shard = min(x.addressable_shards, key=lambda s: s.device.id)
  # The shard is [1, ...] (jit-based pmap, JAX >= 0.8) or [...] (classic pmap); same size.
  return np.asarray(shard.data).reshape(x.shape[1:])


def local_replica(tree: Any) -> Any:
  """One replica of a replicated pmap output, as host numpy, with no cross-process traffic.

  For values that are equal on every device (parameters, optimizer state, psum'd metrics) this is
  the value; reading a shard this process holds needs no collective, so processes may call it at
  different moments, or only one of them may.
  """
  return jax.tree.map(_first_local_shard, tree)


def _position(shard: Any) -> int:
  index = shard.index[0]  # a slice (jit-based pmap) or an int (classic pmap)
  return index if isinstance(index, int) else (index.start or 0)


def local_rows(tree: Any) -> Any:
  """All local devices' outputs of a pmapped call, as host numpy [local devices, ...]."""

  def rows(x: Any) -> np.ndarray:
    if not isinstance(x, jax.Array):
      return np.asarray(x)
    shards = sorted(x.addressable_shards, key=_position)
    return np.stack([np.asarray(s.data).reshape(x.shape[1:]) for s in shards])

  return jax.tree.map(rows, tree)


def all_gather_host(x: np.ndarray) -> np.ndarray:
  """[processes, ...]: every process's `x` (same shape and dtype everywhere), on every process.

  A collective: all processes must call it at the same point. One process: `x[None]`.
  """
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x[None]
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return np.asarray(multihost_utils.process_allgather(x))


def broadcast_from_main(x: np.ndarray) -> np.ndarray:
  """Process 0's `x` on every process (a collective; `x` itself in a single process)."""
  if jax.process_count() == 1:
    return np.asarray(x)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(x)))


def shard(batch: dict[str, np.ndarray], num_devices: int | None = None) -> dict[str, np.ndarray]:
  """Splits a local batch [rows, ...] into [devices, rows / devices, ...]."""
  n = num_devices or jax.local_device_count()

  def split(x: np.ndarray) -> np.ndarray:
    if x.shape[0] % n:
      raise ValueError(f"Batch of {x.shape[0]} rows cannot be split over {n} devices.")
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])

  return {k: split(v) for k, v in batch.items()}
