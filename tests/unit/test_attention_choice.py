"""config.model.attention="cudnn" on the devices it cannot run on: one line each, decided before
anything is traced into cuDNN (model/attention._implementation). The GPUs are stand-ins: jax's
own device objects exist only on a machine that has them."""

from __future__ import annotations

import types

import jax
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.model import attention


def _device(platform: str, kind: str, capability: str | None = None) -> types.SimpleNamespace:
  fields = {"platform": platform, "device_kind": kind}
  if capability is not None:
    fields["compute_capability"] = capability
  return types.SimpleNamespace(**fields)


@pytest.mark.parametrize(
  "device, culprit",
  [
    (_device("cpu", "cpu"), "runs only on an NVIDIA GPU, and this machine's devices are cpu"),
    (_device("gpu", "AMD Instinct MI300X", "gfx942"), "devices are AMD Instinct MI300X"),
    (_device("gpu", "Tesla V100-SXM2-16GB", "7.0"), "Tesla V100-SXM2-16GB has 7.0"),
  ],
)
def test_cudnn_is_refused_where_its_fused_attention_cannot_run(monkeypatch, device, culprit):
  monkeypatch.setattr(jax, "devices", lambda: [device])
  with pytest.raises(errors.ConfigError, match=culprit):
    attention._implementation("cudnn", step=False)


def test_cudnn_on_an_ampere_or_newer_nvidia_gpu_and_xla_for_a_search_step(monkeypatch):
  monkeypatch.setattr(jax, "devices", lambda: [_device("gpu", "NVIDIA H200", "9.0")])
  assert attention._implementation("cudnn", step=False) == "cudnn"
  assert attention._implementation("cudnn", step=True) is None  # beams as query positions
  assert attention._implementation("jax", step=False) is None  # jax.nn's XLA attention
