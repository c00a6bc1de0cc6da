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

# Google's PCI vendor id, and its virtual NIC (gVNIC), which is not a TPU.
_GOOGLE_VENDOR, _GVNIC_DEVICE = "0x1ae0", "0x0042"


def _google_accelerator_on_pci(root: str) -> bool:
  """Whether a Google PCI device other than the gVNIC is present (a TPU of a v5e/v5p/v6e VM)."""
  for vendor in glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor")):
    try:
      with open(vendor) as f, open(os.path.join(os.path.dirname(vendor), "device")) as g:
        if f.read().strip() == _GOOGLE_VENDOR and g.read().strip() != _GVNIC_DEVICE:
          return True
    except OSError:
      continue
  return False


def _signs(root: str) -> dict[str, tuple[list[str], str]]:
  """{platform: (what shows it under `root`, the extra that makes JAX use it)}."""
  found = lambda *patterns: [  # noqa: E731
    p for pattern in patterns for p in sorted(glob.glob(os.path.join(root, pattern)))
  ]
  # TPU v2-v4 VMs expose /dev/accel*; v5e/v5p/v6e VMs VFIO groups (/dev/vfio/<n>), which other
  # passed-through devices have too, so those count only beside a Google PCI accelerator.
  vfio = found("dev/vfio/[0-9]*") if _google_accelerator_on_pci(root) else []
  return {
    "an NVIDIA GPU": (found("dev/nvidia[0-9]*", "proc/driver/nvidia/version"), "cuda12"),
    "a TPU": (found("dev/accel[0-9]*") + vfio, "tpu"),
  }


def unused_accelerator(backend: str, root: str = "/") -> str | None:
  """The warning for a GPU or TPU visible under `root` while JAX's `backend` is the CPU, or None."""
  if backend != "cpu":
    return None
  for name, (found, extra) in _signs(root).items():
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
