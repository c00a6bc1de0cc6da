"""Attention, masks and positional encodings against direct numpy transcriptions of the paper."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_nmt.model import attention as attention_layers
from flaxformer_nmt.model import layers


def naive_attention(q, k, v, mask):
  """Eq. 1 of the paper, one batch row and head at a time, in float64 numpy."""
  b, nq, h, d = q.shape
  out = np.zeros((b, nq, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      scores = q[bi, :, hi] @ k[bi, :, hi].T / math.sqrt(d)  # [q, k]
      scores = np.where(mask[bi, 0], scores, -1e9)
      w = np.exp(scores - scores.max(-1, keepdims=True))
      w /= w.sum(-1, keepdims=True)
      out[bi, :, hi] = w @ v[bi, :, hi]
  return out


def test_attention_matches_naive_reference_with_padding_and_causal_masks():
  rs = np.random.RandomState(0)
  q, k, v = (rs.randn(2, 5, 3, 4).astype(np.float32) for _ in range(3))
  tokens = np.array([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
  mask = np.asarray(attention_layers.padding_mask(tokens, tokens) & attention_layers.causal_mask(5))
  got = attention_layers.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask)
  want = naive_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask)
  valid = tokens > 0
  np.testing.assert_allclose(np.asarray(got)[valid], want[valid], rtol=1e-5, atol=1e-5)


def _autodiff_attention(q, k, v, mask, rate, rng, kind):
  """Attention as plain JAX ops, differentiated by autodiff: what the hand-written backward of
  attention_layers.dot_product_attention must equal."""
  logits = jnp.einsum("BTNH,BSNH->BNTS", q, k) / np.float32(math.sqrt(q.shape[-1]))
  weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
  if rate:
    weights = layers.dropout(weights, rate, rng, kind)
  return jnp.einsum("BNTS,BSNH->BTNH", weights, v)


@pytest.mark.parametrize(
  "rate, kind, d_k",
  [(0.0, "threefry16", 4), (0.3, "threefry16", 4), (0.3, "rbg", 4), (0.3, "threefry16", 2)],
)
def test_attention_gradient_equals_autodiff(rate, kind, d_k):
  """The hand-written backward (rowsum(dP P) from dO . O, the dropout mask drawn again) gives
  autodiff's gradients, with padding, packing (segment) and causal masks and with dropout; also
  with queries and keys narrower than values (d_k = 2, d_v = 4: Table 3 row B)."""
  rs = np.random.RandomState(1)
  q, k = (jnp.asarray(rs.randn(2, 6, 3, d_k), jnp.float32) for _ in range(2))
  v = jnp.asarray(rs.randn(2, 6, 3, 4), jnp.float32)
  tokens = np.array([[5, 6, 7, 8, 0, 0], [5, 6, 7, 8, 9, 4]])
  segments = np.array([[1, 1, 2, 2, 0, 0], [1, 1, 1, 2, 2, 2]])
  mask = (
    attention_layers.padding_mask(tokens, tokens)
    & attention_layers.segment_mask(segments, segments)
    & attention_layers.causal_mask(6)
  )
  rng = jax.random.PRNGKey(7)
  probe = jnp.asarray(rs.randn(2, 6, 3, 4), jnp.float32)  # a random cotangent for the output

  def ours(q, k, v):
    out = attention_layers.dot_product_attention(
      q, k, v, mask, dropout_rate=rate, dropout_rng=rng, deterministic=False, dropout_kind=kind
    )
    return jnp.sum(out * probe)

  def reference(q, k, v):
    return jnp.sum(_autodiff_attention(q, k, v, mask, rate, rng, kind) * probe)

  # Each side jitted, as training runs it (eagerly, each operation is a program of its own).
  np.testing.assert_allclose(jax.jit(ours)(q, k, v), jax.jit(reference)(q, k, v), rtol=1e-5)
  got = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(q, k, v)
  want = jax.device_get(jax.jit(jax.grad(reference, argnums=(0, 1, 2)))(q, k, v))
  for name, g, w in zip("qkv", got, want, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)
  assert float(np.abs(want[0]).max()) > 1e-2  # the check compares real gradients


def test_masks_value_by_value():
  tokens = np.array([[3, 4, 0]])
  pad = np.asarray(attention_layers.padding_mask(tokens, tokens))[0, 0]
  np.testing.assert_array_equal(pad, [[1, 1, 0], [1, 1, 0], [0, 0, 0]])
  causal = np.asarray(attention_layers.causal_mask(3))[0, 0]
  np.testing.assert_array_equal(causal, [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
  seg = attention_layers.segment_mask(np.array([[1, 1, 2]]), np.array([[1, 2, 2]]))
  seg = np.asarray(seg)[0, 0]
  np.testing.assert_array_equal(seg, [[1, 0, 0], [1, 0, 0], [0, 1, 1]])


def test_sinusoidal_encoding_equals_paper_formula():
  d_model = 512
  positions = np.array([0, 1, 7, 50, 255])
  pe = np.asarray(layers.sinusoidal_encoding(jnp.asarray(positions), d_model))
  assert pe.shape == (5, d_model)
  for p_idx, pos in enumerate(positions):
    for i in (0, 1, 10, 100, 255):  # dimension pairs (2i, 2i + 1)
      angle = pos / 10000 ** (2 * i / d_model)
      np.testing.assert_allclose(pe[p_idx, 2 * i], math.sin(angle), atol=2e-5)
      np.testing.assert_allclose(pe[p_idx, 2 * i + 1], math.cos(angle), atol=2e-5)


@pytest.mark.parametrize("d_k", [0, 3])
def test_self_attention_cache_after_one_step(d_k):
  """The decode cache holds the first token's keys at index 0 and advances its index.

  Keys are cached as [B, N, H, L] (the layout the score product reads), values as [B, N, L, H];
  with `d_k` (Table 3 row B) keys are d_k wide and values still d_model / N.
  """
  mha = attention_layers.MultiHeadAttention(num_heads=2, d_model=8, d_k=d_k)
  h_k = d_k or 4
  x = np.random.RandomState(0).randn(2, 3, 8).astype(np.float32)
  # init and the step each in one program (eagerly, each operation is a program of its own).
  variables = jax.jit(lambda key: mha.init(key, x, x, None, decode=True))(jax.random.PRNGKey(1))
  cache = jax.tree.map(np.zeros_like, jax.device_get(variables["cache"]))
  params = jax.device_get(variables["params"])
  step_input = x[:, :1]
  _, mutated = jax.jit(
    lambda p, c, y: mha.apply({"params": p, "cache": c}, y, y, None, decode=True, mutable=["cache"])
  )(params, cache, step_input)
  new = mutated["cache"]
  assert int(new["cache_index"]) == 1
  want_key = np.einsum(
    "bsd,dhe->bshe", np.asarray(step_input), np.asarray(params["key"]).reshape(8, 2, h_k)
  )
  keys = np.asarray(new["cached_key"])  # [B, N, H, L]
  assert keys.shape == (2, 2, h_k, 3)
  np.testing.assert_allclose(keys[..., 0], want_key[:, 0], rtol=1e-5, atol=1e-6)
  assert not keys[..., 1:].any()
  want_value = np.einsum(
    "bsd,dhe->bhse", np.asarray(step_input), np.asarray(params["value"]).reshape(8, 2, 4)
  )
  values = np.asarray(new["cached_value"])  # [B, N, L, H]
  np.testing.assert_allclose(values[:, :, :1], want_value, rtol=1e-5, atol=1e-6)
  assert not values[:, :, 1:].any()


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_fully_masked_rows_stay_finite_in_low_precision(dtype):
  """A padding query masks every key; a fixed -1e9 is -inf in float16 and the softmax gave NaN."""
  rs = np.random.RandomState(0)
  q, k, v = (jnp.asarray(rs.randn(1, 3, 2, 4) * 4, dtype) for _ in range(3))
  tokens = np.array([[5, 6, 0]])
  mask = attention_layers.padding_mask(tokens, tokens)  # query 2 (padding) may attend to nothing
  out = attention_layers.dot_product_attention(q, k, v, mask)
  assert out.dtype == dtype
  assert np.all(np.isfinite(np.asarray(out, np.float32)))
  assert float(attention_layers.mask_value(dtype)) == float(jnp.finfo(dtype).min)
  assert np.isfinite(float(attention_layers.mask_value(dtype)))


def test_multi_head_attention_in_bfloat16_keeps_float32_parameters():
  attn = attention_layers.MultiHeadAttention(num_heads=2, d_model=8, dtype=jnp.bfloat16)
  x = jnp.asarray(np.random.RandomState(0).randn(2, 3, 8), jnp.float32)  # the float32 residual
  params = attn.init(jax.random.PRNGKey(0), x, x, None)["params"]
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  out = attn.apply({"params": params}, x, x, None)
  assert out.dtype == jnp.bfloat16  # the products ran in bfloat16
  want = attention_layers.MultiHeadAttention(num_heads=2, d_model=8).apply(
    {"params": params}, x, x, None
  )
  np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("kind", ["threefry16", "threefry", "rbg"])
@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_dropout_masks_keep_the_rate_and_the_mean(kind, rate):
  """Every mask generator drops `rate` of the entries (to sampling error) and keeps E[x]."""
  x = jnp.ones((1000, 1001))  # an odd size: threefry16 draws ceil(n / 2) words
  # One program at XLA's usual level: op by op at the unit tier's -O0 (tests/conftest.py), a
  # million rbg bits took about 2 s a mask; compiled so, 0.02 s.
  dropout = jax.jit(
    layers.dropout,
    static_argnums=(1, 3),
    compiler_options={"xla_backend_optimization_level": 2},
  )
  y = np.asarray(dropout(x, rate, jax.random.PRNGKey(3), kind))
  dropped = float(np.mean(y == 0.0))
  assert abs(dropped - rate) < 5 * math.sqrt(rate * (1 - rate) / y.size), dropped
  np.testing.assert_allclose(y[y != 0], 1.0 / (1.0 - rate), rtol=1e-6)
  assert abs(float(y.mean()) - 1.0) < 0.01
  # Different keys, different masks; the same key, the same mask.
  again = np.asarray(dropout(x, rate, jax.random.PRNGKey(3), kind))
  other = np.asarray(dropout(x, rate, jax.random.PRNGKey(4), kind))
  np.testing.assert_array_equal(y, again)
  assert np.mean(y != other) > rate
