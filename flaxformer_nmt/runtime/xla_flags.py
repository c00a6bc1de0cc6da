"""XLA options this package turns on for NVIDIA GPUs, unless the user's XLA_FLAGS names them.

One is kept, by an A/B of the base train step on one H200 (every variant compiled in one process
and timed round-robin, the loss of 20 fixed steps within 1e-4 of the baseline's;
benchmarks/results/ab_step_h200_base_cudnn.json, docs/performance.md):

  xla_gpu_enable_triton_gemm=false   matrix products by cuBLAS rather than XLA's Triton kernels:
                                     1.278x against 1.206x (cuDNN attention alone); Triton's
                                     back on: 0.944x (ab_step_h200_base_defaults.json)

It applies to every program of the process; beam-4 decoding at batch 32 runs as fast with it as
without (decode_h200_base_tritonoff_r*.json against decode_h200_base_xla_r*.json). Turning off
command buffers (`xla_gpu_enable_command_buffer=`, no CUDA graphs) was a default too, for 1.01x
on the train step, until the same decoding ran at half the speed under it (the search is many
small launch-bound steps; decode_h200_base_pkg_r*.json): it is no longer added.

XLA reads XLA_FLAGS once, when JAX starts its first backend, so the option is added to the
environment when runtime/parallel.py is imported (before any command touches a device; in a
process that has started JAX already, a notebook's say, nothing is changed, since it would not
take effect), and only where JAX's CUDA plugin is installed (jax[cuda12], jax[cuda13]):
elsewhere XLA_FLAGS is left as it was. A user's own setting of it, in XLA_FLAGS, wins; so does
FLAXFORMER_NMT_XLA_DEFAULTS=0, which adds none. The flags are part of the key under which
compiled programs are kept (runtime/executables.py), so a cached program never mixes the two.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import MutableMapping

GPU_DEFAULTS: dict[str, str] = {
  "xla_gpu_enable_triton_gemm": "false",
}
OPT_OUT = "FLAXFORMER_NMT_XLA_DEFAULTS"


def with_defaults(xla_flags: str) -> str:
  """`xla_flags` with each default it does not name appended (`--name=value`)."""
  named = {flag.lstrip("-").split("=", 1)[0] for flag in xla_flags.split()}
  added = [f"--{name}={value}" for name, value in GPU_DEFAULTS.items() if name not in named]
  return " ".join([xla_flags.strip(), *added]).strip()


def cuda_plugin_installed() -> bool:
  """Whether JAX can run on NVIDIA GPUs here (its CUDA plugin is importable), found without
  starting JAX."""
  return any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13, 14))


def jax_started() -> bool:
  """Whether this process has started a JAX backend already (XLA_FLAGS is read then, once)."""
  bridge = sys.modules.get("jax._src.xla_bridge")
  started = getattr(bridge, "backends_are_initialized", None)
  return bool(started and started())


def apply_defaults(
  environ: MutableMapping[str, str] = os.environ, cuda: bool | None = None
) -> None:
  """Adds the defaults to `environ`'s XLA_FLAGS where `cuda` (default: the CUDA plugin is
  installed and JAX not yet started), unless FLAXFORMER_NMT_XLA_DEFAULTS=0."""
  if cuda is None:
    cuda = cuda_plugin_installed() and not jax_started()
  if not cuda or environ.get(OPT_OUT, "1") == "0":
    return
  environ["XLA_FLAGS"] = with_defaults(environ.get("XLA_FLAGS", ""))
