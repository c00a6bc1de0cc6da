"""The TPU compiler's estimate of the train step with one of the tried-and-not-kept changes.

    python benchmarks/estimate_variants.py --variant=bf16_residual --size=base --target=tpu:v5p

Each variant patches the model for this process only, then runs `benchmarks/train_step.py`'s
estimate with the remaining flags (every train_step flag applies; `--pieces` too). They are the
candidates docs/performance.md reports as measured and not kept, so that each figure there has
the command that produced it:

  bf16_residual        the residual stream in bfloat16: layer norms emit bfloat16 (statistics
                       stay float32, as flax computes them) and so do the scaled embeddings
  lse_backward         attention saves the softmax's log-sum-exp instead of its probabilities, and
                       the backward recomputes them from Q K^T (FlashAttention's trade, in XLA)
  remat:<policy>       with --remat: each layer rematerialised under the named policy of
                       jax.checkpoint_policies (e.g. dots_saveable) instead of recomputing all

The last line is train_step's JSON, with "variant" added. With --target=host the variant is timed
on this machine instead, as train_step.py times the step (the tests run it so, on the tiny size).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import train_step
from absl import app, flags

from flaxformer_nmt.model import attention as attention_layers
from flaxformer_nmt.model import transformer as model
from flaxformer_nmt.model.layers import dropout, einsum_f32

_VARIANT = flags.DEFINE_string("variant", None, "bf16_residual, lse_backward or remat:<policy>.")


def _bf16_residual() -> None:
  model._layer_norm = lambda cfg, name: nn.LayerNorm(  # pylint: disable=protected-access
    epsilon=cfg.layer_norm_epsilon, dtype=jnp.bfloat16, name=name
  )
  embed = model.Transformer._embed  # pylint: disable=protected-access
  model.Transformer._embed = lambda self, table, tokens: embed(self, table, tokens).astype(  # pylint: disable=protected-access
    jnp.bfloat16
  )


def _scores(query, key, mask):
  # [B, T, N, H] x [B, S, N, H] -> [B, N, T, S] float32, masked, as attention_weights' logits.
  logits = einsum_f32("BTNH,BSNH->BNTS", query, key) / np.float32(np.sqrt(query.shape[-1]))
  if mask is not None:
    logits = jnp.where(mask, logits, attention_layers.mask_value(logits.dtype))
  return logits


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _lse_attention(query, key, value, mask, rng, rate, kind):
  return _lse_fwd(query, key, value, mask, rng, rate, kind)[0]


def _lse_fwd(query, key, value, mask, rng, rate, kind):
  logits = _scores(query, key, mask)  # [B, N, T, S]
  top = jnp.max(logits, axis=-1, keepdims=True)
  exp = jnp.exp(logits - top)
  total = jnp.sum(exp, axis=-1, keepdims=True)
  probs = (exp / total).astype(value.dtype)
  lse = (top + jnp.log(total))[..., 0]  # [B, N, T]
  kept = dropout(probs, rate, rng, kind) if rate else probs
  out = jnp.einsum("BNTS,BSNH->BTNH", kept, value)
  return out, (query, key, value, mask, rng, lse, out)


def _lse_bwd(rate, kind, residuals, d_out):
  query, key, value, mask, rng, lse, out = residuals
  probs = jnp.exp(_scores(query, key, mask) - lse[..., None]).astype(value.dtype)  # recomputed
  # From here on, attention_layers._attention_bwd's arithmetic.
  kept = dropout(probs, rate, rng, kind) if rate else probs
  d_kept = einsum_f32("BTNH,BSNH->BNTS", d_out, value)
  d_value = jnp.einsum("BNTS,BTNH->BSNH", kept, d_out.astype(kept.dtype))
  d_probs = dropout(d_kept, rate, rng, kind) if rate else d_kept
  row = jnp.einsum("BTNH,BTNH->BNT", d_out.astype(jnp.float32), out.astype(jnp.float32))
  d_logits = probs.astype(jnp.float32) * (d_probs - row[..., None])
  if mask is not None:
    d_logits = jnp.where(mask, d_logits, 0.0)
  d_logits = (d_logits / np.float32(np.sqrt(query.shape[-1]))).astype(query.dtype)
  d_query = jnp.einsum("BNTS,BSNH->BTNH", d_logits, key.astype(query.dtype))
  d_key = jnp.einsum("BNTS,BTNH->BSNH", d_logits, query).astype(key.dtype)
  return d_query, d_key, d_value.astype(value.dtype), None, None


_lse_attention.defvjp(_lse_fwd, _lse_bwd)


def _remat(policy_name: str) -> None:
  policy = getattr(jax.checkpoint_policies, policy_name, None)
  if policy is None:
    raise app.UsageError(f"--variant=remat:{policy_name}: no such jax.checkpoint_policies entry.")
  model._RematEncoderLayer = nn.remat(model.EncoderLayer, static_argnums=(3,), policy=policy)  # pylint: disable=protected-access
  model._RematDecoderLayer = nn.remat(model.DecoderLayer, static_argnums=(5, 6), policy=policy)  # pylint: disable=protected-access


def main(argv: list[str]) -> None:
  variant = _VARIANT.value or ""
  if variant == "bf16_residual":
    _bf16_residual()
  elif variant == "lse_backward":
    attention_layers._attention = _lse_attention  # pylint: disable=protected-access
  elif variant.startswith("remat:"):
    if not flags.FLAGS.remat:
      raise app.UsageError(f"--variant={variant} needs --remat.")
    _remat(variant.partition(":")[2])
  else:
    raise app.UsageError(f"--variant={variant!r}: bf16_residual, lse_backward or remat:<policy>.")
  train_step.RESULT_EXTRAS["variant"] = variant
  train_step.main(argv)


if __name__ == "__main__":
  app.run(main)
