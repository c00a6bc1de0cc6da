"""Test set-up: 8 virtual CPU devices, so pmap code is exercised as on an 8-accelerator host.

XLA reads the flag once, when jax is first imported, so it must be set before any test imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
