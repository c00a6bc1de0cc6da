"""Which kernel computes softmax attention: config.model.attention ("auto", "ours", "jax", "cudnn").

All four compute Eq. 1 of the paper; they differ in speed and in float rounding:

  ours   model/attention.dot_product_attention: float32 scores, a hand-written backward, attention
         dropout. Every device.
  jax    jax.nn.dot_product_attention with no implementation: XLA's. Every device.
  cudnn  the same with implementation="cudnn": cuDNN's fused (flash) attention, which never
         writes the [B, N, T, S] scores. NVIDIA GPUs of compute capability 8.0 or newer, in
         bfloat16 or float16; asking for it elsewhere is one line (`explicit`).
  auto   (the default) cudnn in training passes wherever it runs and computes what ours does,
         ours everywhere else, decided when a step is traced, so one config trains on a CPU, a
         TPU and a GPU.

Why auto picks cuDNN on a GPU: in one A/B on an H200
(benchmarks/results/ab_step_h200_base_cudnn.json, both variants in one process, round-robin) it
made the base step 1.21x as fast as ours, the loss of 20 fixed steps within 7e-5 of ours. Only
training passes have run it on a GPU, so auto keeps ours for the deterministic ones (evaluation,
scoring, decoding's encoder): the same function, by the kernel those were measured with. Where
JAX's cuDNN path refuses a call while tracing (it checks the head width, the lengths under a
mask in training, the cuDNN version), auto computes that call with ours and logs the reason once;
the refusal is looked for in the forward and the backward pass both, in a trace of its own
(`fused`), because under rematerialisation the backward's forward rule is traced outside the
model's call. A failure XLA reports only when compiling (none seen on the H200) would still stop
the run: `model.attention="ours"` is the way around it.
A beam-search step (one query per beam against the cache) always runs ours or XLA's: the beams of a
sentence are its query positions there, against a [B, 1, 1, S] mask, and cuDNN takes a mask only
as a bias as long as the queries.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from absl import logging

from flaxformer_nmt import errors

Array = jax.Array

OURS, XLA, CUDNN = "ours", "xla", "cudnn"
_HALF = (jnp.bfloat16, jnp.float16)  # cuDNN's fused attention computes in these only
_logged: set[str] = set()  # the reasons auto already logged, once per process


def nvidia_capability() -> float | None:
  """The first device's CUDA compute capability (9.0 on an H100/H200); None if not NVIDIA's.

  An NVIDIA GPU's reads as a number ("9.0"), an AMD GPU's as its architecture ("gfx942").
  """
  device = jax.devices()[0]
  capability = str(getattr(device, "compute_capability", ""))
  if device.platform != "gpu" or not capability.replace(".", "", 1).isdigit():
    return None
  return float(capability)


def explicit(attention: str, step: bool) -> str:
  """OURS, XLA or CUDNN for a configured "ours", "jax" or "cudnn"; "cudnn" checked here.

  config.checks refuses "jax"/"cudnn" with attention dropout or narrow keys, and "cudnn" in
  float32, before any work; the device is checked at trace time because asking JAX for its
  devices in config.checks would start JAX before jax.distributed.
  """
  if attention == OURS:
    return OURS
  if attention == "jax" or step:
    return XLA
  capability = nvidia_capability()
  if capability is None:
    device = jax.devices()[0]
    raise errors.ConfigError(
      f"config.model.attention='cudnn' runs only on an NVIDIA GPU, and this machine's devices "
      f"are {device.device_kind or device.platform}: use 'ours' or 'jax'."
    )
  if capability < 8.0:
    raise errors.ConfigError(
      f"config.model.attention='cudnn' needs an NVIDIA GPU of compute capability 8.0 or newer "
      f"(cuDNN's fused attention), and this {jax.devices()[0].device_kind} has {capability}: "
      "use 'ours'."
    )
  return CUDNN


def auto(
  dtype: Any, attention_dropout: bool, narrow_keys: bool, step: bool, training: bool = True
) -> str:
  """What "auto" tries: CUDNN where cuDNN computes what ours would, in a training pass, else OURS.

  Ours is kept for attention dropout (cuDNN's path here has none), keys narrower than values
  (config.model.d_k), float32 products (cuDNN's kernel is half precision only), deterministic
  passes (evaluation and decoding: not yet run with cuDNN on a GPU), a search step, and every
  device but an NVIDIA GPU of compute capability 8.0 or newer.
  """
  if not training or step or attention_dropout or narrow_keys:
    return OURS
  if jnp.dtype(dtype) not in _HALF:
    return OURS
  capability = nvidia_capability()
  return CUDNN if capability is not None and capability >= 8.0 else OURS


def fused(
  query: Array, key: Array, value: Array, mask: Array | None, kind: str, fallback: bool
) -> Array | None:
  """jax.nn.dot_product_attention by XLA or cuDNN: [B, T, N, H] x [B, S, N, H] -> [B, T, N, H].

  With `fallback` (auto's call), a call JAX's cuDNN path refuses while tracing returns None (the
  caller computes it with ours) and the reason is logged once; without it the refusal is raised.
  """
  implementation = "cudnn" if kind == CUDNN else None

  def attend(q: Array, k: Array, v: Array, m: Array | None) -> Array:
    return jax.nn.dot_product_attention(q, k, v, mask=m, implementation=implementation)

  try:
    if fallback:
      # JAX checks some shapes only in the backward's forward rule (odd lengths under a mask, in
      # training), which rematerialisation traces outside this call: trace both passes here, on
      # shapes alone, so that a refusal of either is caught now.
      shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (query, key, value)]
      mask_shape = None if mask is None else jax.ShapeDtypeStruct(mask.shape, mask.dtype)
      jax.eval_shape(lambda q, k, v, m: jax.vjp(lambda *a: attend(*a, m), q, k, v)[0],
                     *shapes, mask_shape)  # fmt: skip
    return attend(query, key, value, mask)
  except (NotImplementedError, ValueError, RuntimeError) as e:
    if not fallback:
      raise
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    if reason not in _logged:
      _logged.add(reason)
      logging.warning(
        "config.model.attention='auto': cuDNN's attention refused query %s, key %s (%s); "
        "ours computes it.",
        query.shape,
        key.shape,
        reason,
      )
    return None
