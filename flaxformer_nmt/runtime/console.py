"""What a command says on the console besides its results: rate and ETA of long work (training,
translation, vocabulary training); the one warning when the machine has a GPU or TPU that JAX
does not use; and the libraries' chatter, filtered so our lines and a one-line error stand alone.

An unused accelerator: `pip install flaxformer_nmt` brings the CPU build of JAX; on a GPU host or
a TPU VM training then runs on the CPU, hundreds of times slower, and nothing else says so. The
check looks for the devices the drivers expose (no JAX import of their plugins needed) and
compares with the backend JAX chose.

The chatter: orbax logs about 20 INFO lines per checkpoint, a warning that a checkpoint folder
opened to be read is "read only" (every inference command opens it so), and error lines for each
attempt to parse a damaged step's metadata (checkpoints/reader.py names the step once, and reads
the one before); JAX logs that no TPU backend is found at every start on a CPU or GPU. The
command line installs the filter (`install_quiet`) unless `--verbosity=1` or `--alsologtostderr`;
the API installs it too.
"""

from __future__ import annotations

import functools
import glob
import logging as pylogging
import os
import time

from absl import logging


class Progress:
  """Rate and ETA over the steps run in this process (resumed runs don't inflate the rate)."""

  def __init__(self, first_step: int, total_steps: int) -> None:
    self.first_step = first_step
    self.total_steps = total_steps
    self.start = time.monotonic()

  def eta(self, step: int, budget_left: float | None = None) -> str:
    """Time to the last step, or to the end of a wall-clock budget if that comes first."""
    done = step - self.first_step
    if done <= 0:
      return "?"
    seconds = (time.monotonic() - self.start) / done * (self.total_steps - step)
    if budget_left is not None:
      seconds = max(min(seconds, budget_left), 0.0)
    return format_seconds(seconds)


def format_seconds(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


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


class QuietLibraries(pylogging.Filter):
  """Passes every record but orbax's INFO lines, its "read only" warnings and its metadata
  parse errors, and JAX's "Unable to initialize backend" INFO line (module docstring)."""

  def filter(self, record: pylogging.LogRecord) -> bool:
    if "/orbax/" in record.pathname.replace(os.sep, "/"):
      message = str(record.msg)
      if "Failed to json parse" in message:
        return False  # a damaged step: checkpoints/reader.py says so in one line, and falls back
      return record.levelno >= pylogging.WARNING and "is read only" not in message
    if record.name == "jax._src.xla_bridge" and record.levelno < pylogging.WARNING:
      return not str(record.msg).startswith("Unable to initialize backend")
    return True


_FILTER = QuietLibraries()


def install_quiet() -> None:
  """Filters absl's handler (the command line's stderr) and the "absl" logger itself (what a
  notebook sees: orbax logs through absl, whatever handler prints it). Idempotent."""
  for target in (logging.get_absl_handler(), pylogging.getLogger("absl")):
    if _FILTER not in target.filters:
      target.addFilter(_FILTER)
