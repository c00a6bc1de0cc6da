"""The only device-aware code: pmap wrappers, replication, sharding, multi-host start-up.

Each process feeds its local devices with its own slice of the global batch; pmap's collectives
span every device of every process, so the per-device steps in `steps.py` are unaware of hosts.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np
from absl import logging

AXIS = "batch"


def maybe_initialize_distributed() -> None:
  """Joins a multi-process run when the environment describes one.

  On Cloud TPU pods and SLURM/Open MPI clusters `jax.distributed.initialize()` discovers the
  coordinator itself; elsewhere set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID (e.g. several CPU processes on 127.0.0.1).
  """
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    # Must not touch a backend before initialize(); gloo only matters to CPU collectives.
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
    logging.info(
        "Process %d of %d; %d local / %d global devices.",
        jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count(),
    )


def pmap_train_step(
    step_fn: Callable[..., Any], devices: Sequence[jax.Device] | None = None, **static: Any
) -> Callable[..., Any]:
  """pmapped train step; the incoming state's buffers are donated (updated in place)."""
  return jax.pmap(
      functools.partial(step_fn, axis_name=AXIS, **static),
      axis_name=AXIS,
      devices=devices,
      donate_argnums=(0,),
  )


def pmap_eval_step(
    step_fn: Callable[..., Any], devices: Sequence[jax.Device] | None = None, **static: Any
) -> Callable[..., Any]:
  return jax.pmap(functools.partial(step_fn, axis_name=AXIS, **static), axis_name=AXIS,
                  devices=devices)


def replicate(tree: Any, devices: Sequence[jax.Device] | None = None) -> Any:
  """Copies a host pytree to every local device: leaves gain a leading [devices] axis.

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


def unreplicate(tree: Any) -> Any:
  """Replica 0 of a replicated pytree, fetched to host numpy (device-count independent)."""
  return jax.device_get(jax.tree.map(lambda x: x[0], tree))


def shard(batch: dict[str, np.ndarray], num_devices: int | None = None) -> dict[str, np.ndarray]:
  """Splits a local batch [rows, ...] into [devices, rows / devices, ...]."""
  n = num_devices or jax.local_device_count()

  def split(x: np.ndarray) -> np.ndarray:
    if x.shape[0] % n:
      raise ValueError(f"Batch of {x.shape[0]} rows cannot be split over {n} devices.")
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])

  return {k: split(v) for k, v in batch.items()}
