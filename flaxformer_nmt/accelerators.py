"""One warning when the machine has a GPU or TPU that JAX does not use.

`pip install flaxformer_nmt` brings the CPU build of JAX; on a GPU host or a TPU VM training then
runs on the CPU, hundreds of times slower, and nothing else says so. The check looks for the
devices the drivers expose (no JAX import of their plugins needed) and compares with the backend
JAX chose.
"""

from __future__ import annotations

import functools
import glob
import os

from absl import logging

# What a platform's driver exposes under /, and the install line that makes JAX use it.
_SIGNS = {
  "an NVIDIA GPU": (("dev/nvidia[0-9]*", "proc/driver/nvidia/version"), "cuda12"),
  # TPU v2-v4 VMs expose /dev/accel*, v5e/v5p/v6e VMs VFIO groups (/dev/vfio/<n>).
  "a TPU": (("dev/accel[0-9]*", "dev/vfio/[0-9]*"), "tpu"),
}


def unused_accelerator(backend: str, root: str = "/") -> str | None:
  """The warning for a GPU or TPU visible under `root` while JAX's `backend` is the CPU, or None."""
  if backend != "cpu":
    return None
  for name, (patterns, extra) in _SIGNS.items():
    found = [p for pattern in patterns for p in sorted(glob.glob(os.path.join(root, pattern)))]
    if found:
      return (
        f"{name} is visible ({found[0]}) but JAX runs on the CPU: install JAX for it with "
        f'`pip install -U "jax[{extra}]"` (or this project\'s [{extra}] extra) and start again.'
      )
  return None


@functools.cache
def warn_if_unused() -> None:
  """Logs `unused_accelerator`'s line once per process (main.py, the console script, the API)."""
  import jax  # pylint: disable=g-import-not-at-top

  message = unused_accelerator(jax.default_backend())
  if message:
    logging.warning("%s", message)
