"""flaxformer_nmt/benchmarking/flops.py's analytic count (the numerator of MFU) against XLA's cost
analysis."""

import jax
import jax.numpy as jnp
import pytest

from flaxformer_nmt.benchmarking import flops
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig, init_params


@pytest.mark.parametrize(
  "size,vocab,d_k", [("tiny", 4000, 0), ("small", 8000, 0), ("tiny", 4000, 8)]
)
def test_forward_count_matches_xla(size, vocab, d_k):
  """XLA counts every op; ours only the matrix products, so XLA's figure is a little higher. With
  d_k (Table 3 row B) the queries and keys are narrower than the values."""
  c = config_lib.base_config(size)
  c.model.d_k = d_k
  cfg = TransformerConfig.from_config(c.model, vocab, auto_dtype="float32")
  model = Transformer(cfg)
  params = jax.eval_shape(lambda r: init_params(cfg, r), jax.random.PRNGKey(0))
  rows, row_len = 16, 32
  ids = jax.ShapeDtypeStruct((rows, row_len), jnp.int32)
  compiled = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y)).lower(params, ids, ids)
  cost = compiled.compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  analytic = flops.forward_flops(
    num_layers=cfg.num_layers,
    d_model=cfg.d_model,
    d_ff=cfg.d_ff,
    vocab_size=vocab,
    src_tokens=rows * row_len,
    tgt_tokens=rows * row_len,
    row_len=row_len,
    d_qk=cfg.num_heads * cfg.d_k,
  )
  assert 1.0 <= cost["flops"] / analytic < 1.06, (cost["flops"], analytic)


def test_base_forward_is_about_128_mflop_per_target_token():
  """The figure quoted in the module docstring: base, 37k vocabulary, rows of 64."""
  per_token = flops.forward_flops(
    num_layers=6, d_model=512, d_ff=2048, vocab_size=37_000, src_tokens=1, tgt_tokens=1, row_len=64
  )
  assert 127e6 < per_token < 129e6
  assert flops.train_step_flops(
    num_layers=6, d_model=512, d_ff=2048, vocab_size=37_000, src_tokens=1, tgt_tokens=1, row_len=64
  ) == pytest.approx(3 * per_token)
