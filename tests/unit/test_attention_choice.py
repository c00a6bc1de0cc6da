"""config.model.attention: which kernel each choice picks where (model/attention_choice.py).

"cudnn" asked for where it cannot run is one line, decided before anything is traced into cuDNN;
"auto" (the default) picks cuDNN only where it computes what ours does, and a call cuDNN refuses
at trace time is computed by ours. The GPUs are stand-ins: jax's own device objects exist only on
a machine that has them, so on this CPU a stand-in H200 makes auto try cuDNN, JAX refuses the call
("cuDNN is not detected"), and ours must compute exactly what it computes when asked for directly.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.model import attention, attention_choice

OURS, XLA, CUDNN = attention_choice.OURS, attention_choice.XLA, attention_choice.CUDNN
_XLA_ATTENTION = jax.nn.dot_product_attention  # before any test stands in for it


def _device(platform: str, kind: str, capability: str | None = None) -> types.SimpleNamespace:
  fields = {"platform": platform, "device_kind": kind}
  if capability is not None:
    fields["compute_capability"] = capability
  return types.SimpleNamespace(**fields)


H200 = _device("gpu", "NVIDIA H200", "9.0")
V100 = _device("gpu", "Tesla V100-SXM2-16GB", "7.0")
MI300 = _device("gpu", "AMD Instinct MI300X", "gfx942")
CPU = _device("cpu", "cpu")


@pytest.mark.parametrize(
  "device, culprit",
  [
    (CPU, "runs only on an NVIDIA GPU, and this machine's devices are cpu"),
    (MI300, "devices are AMD Instinct MI300X"),
    (V100, "Tesla V100-SXM2-16GB has 7.0"),
  ],
)
def test_cudnn_is_refused_where_its_fused_attention_cannot_run(monkeypatch, device, culprit):
  monkeypatch.setattr(jax, "devices", lambda: [device])
  with pytest.raises(errors.ConfigError, match=culprit):
    attention_choice.explicit("cudnn", step=False)


def test_explicit_choices_on_an_ampere_or_newer_nvidia_gpu(monkeypatch):
  monkeypatch.setattr(jax, "devices", lambda: [H200])
  assert attention_choice.explicit("cudnn", step=False) == CUDNN
  assert attention_choice.explicit("cudnn", step=True) == XLA  # beams as query positions
  assert attention_choice.explicit("jax", step=False) == XLA  # jax.nn's XLA attention
  assert attention_choice.explicit("ours", step=False) == OURS


@pytest.mark.parametrize(
  "device, dtype, dropout, narrow, step, training, want",
  [
    (H200, jnp.bfloat16, False, False, False, True, CUDNN),
    (H200, jnp.float16, False, False, False, True, CUDNN),
    (
      _device("gpu", "NVIDIA A100-SXM4-80GB", "8.0"),
      jnp.bfloat16,
      False,
      False,
      False,
      True,
      CUDNN,
    ),
    (H200, jnp.bfloat16, False, False, False, False, OURS),  # evaluation, scoring, decoding
    (H200, jnp.float32, False, False, False, True, OURS),  # cuDNN's kernel is half precision only
    (H200, jnp.bfloat16, True, False, False, True, OURS),  # attention dropout: only ours has it
    (H200, jnp.bfloat16, False, True, False, True, OURS),  # config.model.d_k narrower than values
    (H200, jnp.bfloat16, False, False, True, True, OURS),  # a beam-search step
    (V100, jnp.float16, False, False, False, True, OURS),
    (MI300, jnp.bfloat16, False, False, False, True, OURS),
    (CPU, jnp.bfloat16, False, False, False, True, OURS),
  ],
)
def test_auto_picks_cudnn_only_where_it_computes_what_ours_does(
  monkeypatch, device, dtype, dropout, narrow, step, training, want
):
  monkeypatch.setattr(jax, "devices", lambda: [device])
  assert attention_choice.auto(dtype, dropout, narrow, step, training) == want


def _apply(implementation: str, dtype, remat: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """A self-attention layer's output and its input gradient in a training pass (optionally
  rematerialised, as model.remat does), [2, 6, 16] each."""
  layer = attention.MultiHeadAttention(4, 16, dtype=dtype, implementation=implementation)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 16))
  lengths = jnp.array([6, 4])
  mask = (jnp.arange(6)[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, S]
  params = layer.init(jax.random.PRNGKey(1), x, x, mask)

  def forward(inputs):
    return layer.apply(params, inputs, inputs, mask, deterministic=False)

  if remat:
    forward = jax.checkpoint(forward)

  def loss(inputs):
    return jnp.sum(forward(inputs).astype(jnp.float32) ** 2)

  return np.asarray(forward(x), np.float32), np.asarray(jax.grad(loss)(x))


def test_auto_computes_with_ours_what_cudnn_refuses_while_tracing(monkeypatch):
  """On this CPU JAX refuses the cuDNN call ("cuDNN is not detected"): auto falls back to ours."""
  ours_out, ours_grad = _apply("ours", jnp.bfloat16)
  monkeypatch.setattr(jax, "devices", lambda: [H200])
  assert attention_choice.auto(jnp.bfloat16, False, False, False) == CUDNN  # it does try cuDNN
  auto_out, auto_grad = _apply("auto", jnp.bfloat16)
  np.testing.assert_array_equal(auto_out, ours_out)
  np.testing.assert_array_equal(auto_grad, ours_grad)


def _refused_in_training(q, k, v, mask=None, implementation=None):
  """A stand-in for jax.nn.dot_product_attention on cuDNN that, as JAX's own does for odd lengths
  under a mask, accepts the forward alone and refuses in its backward's forward rule."""
  del implementation

  @jax.custom_vjp
  def attend(q, k, v):
    return _XLA_ATTENTION(q, k, v, mask=mask)

  def forward_rule(q, k, v):
    raise NotImplementedError("Unsupported sequence length Q 7, KV 7.")

  attend.defvjp(forward_rule, lambda residuals, g: (g, g, g))
  return attend(q, k, v)


@pytest.mark.parametrize("remat", [False, True])
def test_auto_catches_a_refusal_of_the_backward_even_under_remat(monkeypatch, remat):
  """Under rematerialisation the backward's forward rule is traced outside the layer's call; auto
  looks for the refusal in a trace of both passes of its own, so ours computes the call."""
  ours_out, ours_grad = _apply("ours", jnp.bfloat16, remat)
  monkeypatch.setattr(jax, "devices", lambda: [H200])
  monkeypatch.setattr(jax.nn, "dot_product_attention", _refused_in_training)
  auto_out, auto_grad = _apply("auto", jnp.bfloat16, remat)
  np.testing.assert_array_equal(auto_out, ours_out)
  np.testing.assert_array_equal(auto_grad, ours_grad)


def test_an_explicit_cudnn_raises_what_jax_refuses(monkeypatch):
  monkeypatch.setattr(jax, "devices", lambda: [H200])
  q = jnp.ones((1, 4, 2, 8), jnp.bfloat16)
  with pytest.raises(RuntimeError):  # "cuDNN is not detected", on this CPU
    attention_choice.fused(q, q, q, None, CUDNN, fallback=False)
  assert attention_choice.fused(q, q, q, None, CUDNN, fallback=True) is None
