"""The Transformer's structure: causality, padding invariance, packing, parameter counts."""

import functools

import jax
import jax.numpy as jnp
import model_params
import numpy as np
import pytest

from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.model.shapes import abstract_params
from flaxformer_nmt.model.transformer import (
  Transformer,
  TransformerConfig,
  count_params,
)

import helpers

# One xdist worker runs the module: its module fixture (`setup`) is built once, not per worker.
pytestmark = pytest.mark.xdist_group("model")

VOCAB = 50


def tiny(**overrides) -> TransformerConfig:
  """The tiny size, two layers deep, narrowed (helpers.narrow): structure, not size, is tested."""
  c = helpers.narrow(config_lib.base_config("tiny"), layers=2).model
  for k, v in overrides.items():
    c[k] = v
  return TransformerConfig.from_config(c, VOCAB)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("train",))
def _apply(model: Transformer, params, *args, train: bool = False, rngs=None):
  """model.apply as one compiled program: run op by op, the first forward pass of each shape
  compiles every op on its own (seconds each time)."""
  return model.apply({"params": params}, *args, train=train, rngs=rngs)


def _logits(model: Transformer, params, *args, **kwargs) -> np.ndarray:
  """`_apply`'s logits on the host: the tests slice and compare them in numpy (slicing a device
  array compiles a program per slice)."""
  return np.asarray(_apply(model, params, *args, **kwargs))


# Causality, padding, packing, dropout, bfloat16, remat and the attention kernels hold for any
# parameters of init_params' shapes and scales, so the tests draw them on the host
# (model_params.random_params): each config's initializer is not a program to compile (up to
# 3.5 s each from an empty cache).
@pytest.fixture(scope="module")
def setup():
  cfg = tiny()
  return Transformer(cfg), model_params.random_params(cfg)


def _ids(seed, shape) -> np.ndarray:
  return np.random.RandomState(seed).randint(3, VOCAB, shape).astype(np.int32)


def _with(ids: np.ndarray, index, value) -> np.ndarray:
  """A copy of `ids` with `ids[index] = value`."""
  out = ids.copy()
  out[index] = value
  return out


def test_future_target_token_cannot_change_earlier_outputs(setup):
  model, params = setup
  src, tgt = _ids(0, (2, 6)), _ids(1, (2, 7))
  changed = _with(tgt, (slice(None), 4), (tgt[:, 4] + 1) % VOCAB + 3)
  a = _logits(model, params, src, tgt)
  b = _logits(model, params, src, changed)
  # Position t predicts targets[t] from targets[:t]: changing targets[4] affects positions >= 5.
  np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-5)
  assert not np.allclose(a[:, 5:], b[:, 5:], atol=1e-3)


def test_padding_cannot_change_outputs_at_real_positions(setup):
  model, params = setup
  src, tgt = _ids(2, (1, 5)), _ids(3, (1, 4))
  base = _logits(model, params, src, tgt)
  padded_src = np.pad(src, ((0, 0), (0, 3)))
  padded_tgt = np.pad(tgt, ((0, 0), (0, 2)))
  padded = _logits(model, params, padded_src, padded_tgt)
  np.testing.assert_allclose(base, padded[:, :4], atol=1e-5)
  # The padding id matters: a real token in those slots does change the outputs.
  other = _logits(model, params, _with(padded_src, (0, 6), 7), padded_tgt)
  assert not np.allclose(base, other[:, :4], atol=1e-4)


def test_packed_row_equals_separate_rows(setup):
  """Segment masks and per-segment positions make a packed row equal to unpacked sentences."""
  model, params = setup
  s1, s2, t1, t2 = _ids(4, (3,)), _ids(5, (2,)), _ids(6, (4,)), _ids(7, (3,))
  sep1 = _logits(model, params, s1[None], t1[None])
  sep2 = _logits(model, params, s2[None], t2[None])
  packed = _logits(
    model,
    params,
    np.concatenate([s1, s2])[None],
    np.concatenate([t1, t2])[None],
    np.array([[0, 1, 2, 0, 1]], np.int32),
    np.array([[0, 1, 2, 3, 0, 1, 2]], np.int32),
    np.array([[1, 1, 1, 2, 2]], np.int32),
    np.array([[1, 1, 1, 1, 2, 2, 2]], np.int32),
  )
  np.testing.assert_allclose(packed[0, :4], sep1[0], atol=1e-5)
  np.testing.assert_allclose(packed[0, 4:], sep2[0], atol=1e-5)


@pytest.mark.parametrize(
  "overrides", [dict(pre_ln=True), dict(positional="learned"), dict(share_embeddings=False)]
)
def test_variants_build_and_stay_causal(overrides):
  cfg = tiny(**overrides)
  model, params = Transformer(cfg), model_params.random_params(cfg)
  src, tgt = _ids(8, (2, 5)), _ids(9, (2, 6))
  a = _logits(model, params, src, tgt)
  b = _logits(model, params, src, _with(tgt, (slice(None), 3), 4))
  assert a.shape == (2, 6, VOCAB)
  np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)


def test_dropout_is_active_only_in_training(setup):
  cfg = tiny(dropout_rate=0.5)  # the rate is no parameter's: the shared model's parameters fit
  model, params = Transformer(cfg), setup[1]
  src, tgt = _ids(10, (2, 5)), _ids(11, (2, 5))
  eval_a = _logits(model, params, src, tgt)
  eval_b = _logits(model, params, src, tgt)
  np.testing.assert_array_equal(eval_a, eval_b)
  train_a = _logits(model, params, src, tgt, train=True, rngs={"dropout": jax.random.PRNGKey(1)})
  assert not np.allclose(train_a, eval_a, atol=1e-3)


@pytest.mark.parametrize("size,paper", [("base", 65e6), ("big", 213e6)])
def test_parameter_counts_match_table_3(size, paper):
  cfg = TransformerConfig.from_config(config_lib.base_config(size).model, 37_000)
  shapes = abstract_params(cfg)  # init_params traced, never run: no memory
  n = count_params(shapes)
  print(f"{size}: {n:,} parameters (paper: {paper / 1e6:.0f}M)")
  assert abs(n - paper) / paper <= 0.04, n
  # One matrix is shared by source, target and pre-softmax: counted once.
  assert shapes["embedding"]["embedding"].shape == (37_000, cfg.d_model)
  assert "target_embedding" not in shapes


@pytest.mark.parametrize("row", sorted(config_lib.TABLE3))
def test_table3_rows_match_the_papers_parameter_counts(row):
  """Each Table 3 variant's parameter count against the paper's (millions, rounded), 37k vocab.

  Every count is 2-7% below the paper's, and the gap scales with d_model: it is what about 4,500
  more embedding rows would add, as if the paper's vocabulary were a little larger than 37,000.
  So the tolerance is that many rows (plus the paper's rounding to 1M), not a percentage."""
  c = config_lib.wmt14_table3_config(row)
  config_lib.validate(c)
  cfg = TransformerConfig.from_config(c.model, c.data.vocab_size)
  # Traced once per model config in a process (rows D3 and D4 change only the loss: base's model).
  n = count_params(abstract_params(cfg))
  paper = config_lib.TABLE3[row][1] * 1e6
  assert 0 < paper - n <= 0.5e6 + 5_000 * cfg.d_model, (row, n)
  assert c.data.test_split == "validation"  # the table is on newstest2013


def test_dtype_auto_resolves():
  c = config_lib.base_config("tiny").model
  assert c.dtype == "auto"
  assert TransformerConfig.from_config(c, VOCAB).dtype == jnp.float32  # the default: CPU
  assert TransformerConfig.from_config(c, VOCAB, auto_dtype="bfloat16").dtype == jnp.bfloat16
  c.dtype = "bfloat16"
  assert TransformerConfig.from_config(c, VOCAB, auto_dtype="float32").dtype == jnp.bfloat16


@pytest.mark.parametrize("overrides", [{}, dict(pre_ln=True, share_embeddings=False)])
def test_bfloat16_keeps_float32_parameters_and_logits_and_tracks_float32(overrides):
  cfg32, cfg16 = tiny(dtype="float32", **overrides), tiny(dtype="bfloat16", **overrides)
  params = model_params.random_params(cfg16)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  src, tgt = _ids(12, (2, 9)), _ids(13, (2, 7))
  low = _logits(Transformer(cfg16), params, src, tgt)
  full = _logits(Transformer(cfg32), params, src, tgt)
  assert low.dtype == np.float32
  # bfloat16 keeps 8 bits of mantissa: logits agree to a few percent of their spread.
  assert float(np.max(np.abs(low - full))) < 0.05 * float(np.std(full)) * 10
  np.testing.assert_array_equal(np.argmax(low, -1)[:, :3], np.argmax(full, -1)[:, :3])


def _loss_and_grad(cfg):
  from flaxformer_nmt.model import losses

  def loss(p, src, tgt):
    logits = _apply(
      Transformer(cfg), p, src, tgt, train=True, rngs={"dropout": jax.random.PRNGKey(3)}
    )
    weights = (tgt > 0).astype(jnp.float32)
    return losses.label_smoothed_cross_entropy(logits, tgt, weights, 0.1)[0]

  return jax.jit(jax.value_and_grad(loss))


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_jax_attention_trains_as_ours(monkeypatch):
  """model.attention="jax" (jax.nn.dot_product_attention; on CPU its XLA implementation) gives
  our attention's loss and gradients on a padded batch with dropout elsewhere on."""
  calls = []
  jax_attention = jax.nn.dot_product_attention
  monkeypatch.setattr(
    jax.nn, "dot_product_attention", lambda *a, **k: calls.append(1) or jax_attention(*a, **k)
  )
  cfg_ours, cfg_jax = tiny(), tiny(attention="jax")
  params = model_params.random_params(cfg_ours)
  src = _with(_ids(10, (2, 7)), (1, slice(5, None)), 0)  # padding in the second row
  tgt = _with(_ids(11, (2, 6)), (1, slice(4, None)), 0)
  (loss_ours, grad_ours), (loss_jax, grad_jax) = (
    _loss_and_grad(cfg)(params, src, tgt) for cfg in (cfg_ours, cfg_jax)
  )
  assert len(calls) == 3 * cfg_jax.num_layers  # encoder self, decoder self, cross: all jax's
  np.testing.assert_allclose(loss_jax, loss_ours, rtol=1e-5)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  jax.tree.map(close, grad_jax, grad_ours)


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_remat_changes_memory_not_results():
  """Rematerialised layers: same loss and gradients, smaller temporary buffers (XLA's analysis)."""
  plain, remat = tiny(dropout_rate=0.1), tiny(dropout_rate=0.1, remat=True)
  params = model_params.random_params(plain)
  src, tgt = _ids(14, (4, 16)), _ids(15, (4, 16))
  (l1, g1), (l2, g2) = (_loss_and_grad(cfg)(params, src, tgt) for cfg in (plain, remat))
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  # Recomputation may fuse differently: float rounding, not a different gradient. The rounding of
  # a sum is relative to its largest terms, so a small entry of a large gradient can move by a few
  # ulps of the gradient's scale, not of its own.
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max())
  jax.tree.map(close, g1, g2)

  # Memory: what the backward pass keeps. XLA:CPU then strips remat's optimisation barriers and
  # re-fuses much of the recomputation, so its buffer sizes are not the measure here;
  # benchmarks/train_step.py reports the compiled figures.
  residuals = {cfg.remat: _saved_residual_bytes(cfg, params, src, tgt) for cfg in (plain, remat)}
  assert residuals[True] < 0.5 * residuals[False], residuals


def _saved_residual_bytes(cfg, params, src, tgt) -> int:
  """Bytes of the activations the forward pass saves for the backward pass (parameters, which
  every variant keeps, excluded), as listed by jax.ad_checkpoint."""
  import contextlib
  import io
  import re

  from jax import ad_checkpoint

  from flaxformer_nmt.model import losses

  def loss(p):
    logits = _apply(Transformer(cfg), p, src, tgt)
    return losses.label_smoothed_cross_entropy(logits, tgt, (tgt > 0).astype(jnp.float32), 0.1)[0]

  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    ad_checkpoint.print_saved_residuals(loss, params)
  total = 0
  activations = [line for line in out.getvalue().splitlines() if "from the argument" not in line]
  for dtype, dims in re.findall(r"^(\w+)\[([\d,]*)\]", "\n".join(activations), re.M):
    bits = int(re.sub(r"\D", "", dtype) or 8)  # f32 -> 32, bool -> 8
    total += int(np.prod([int(d) for d in dims.split(",") if d])) * bits // 8
  return total
