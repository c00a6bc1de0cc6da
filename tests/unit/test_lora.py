"""training/lora.py: which kernels are adapted, the initial adapters, and the merged form's
gradients (the trained runs are tests/e2e/test_lora.py's)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from flaxformer_nmt.config import builders, choices
from flaxformer_nmt.model.transformer import TransformerConfig, init_params
from flaxformer_nmt.training import lora


def _abstract_params(num_layers: int = 2):
  c = builders.base_config("tiny")
  c.model.num_layers = num_layers
  model_cfg = TransformerConfig.from_config(c.model, 64)
  return jax.eval_shape(lambda key: init_params(model_cfg, key), jax.random.PRNGKey(0))


def test_the_target_names_are_the_configs_and_each_has_a_transformers_module():
  assert tuple(lora.TARGETS) == choices.LORA_TARGETS == tuple(lora.HF_MODULES)
  assert lora.parse_targets(" q, v ,ffn_out") == ("q", "v", "ffn_out")


def test_targets_find_every_attentions_projections_and_the_ffn_matrices():
  params = _abstract_params()
  q = lora.targeted_paths(params, ["q"])
  # 2 encoder self-attentions, 2 decoder self- and 2 cross-attentions.
  assert len(q) == 6 and all(p[-1] == "query" for p in q)
  assert {p[1] for p in q} == {"self_attention", "cross_attention"}
  ffn = lora.targeted_paths(params, ["ffn_in", "ffn_out"])
  assert len(ffn) == 8 and {p[-2:] for p in ffn} == {("wi", "kernel"), ("wo", "kernel")}
  everything = lora.targeted_paths(params, list(lora.TARGETS))
  assert len(everything) == 4 * 6 + 8  # no embedding, bias or norm
  assert not any("embedding" in p or "bias" in p for p in everything)


def test_fresh_adapters_leave_the_model_bit_for_bit_and_abstract_params_give_the_shapes():
  model_cfg = TransformerConfig.from_config(builders.base_config("tiny").model, 64)
  params = init_params(model_cfg, jax.random.PRNGKey(0))
  state = lora.init(params, 4, ["q", "ffn_in"], jax.random.PRNGKey(1))
  adapters = traverse_util.flatten_dict(state.adapters)
  a = adapters[("encoder_0", "self_attention", "query", "a")]
  assert a.shape == (128, 4) and np.abs(a).max() <= 1 / np.sqrt(128) and np.abs(a).min() > 0
  assert adapters[("encoder_0", "ffn", "wi", "kernel", "b")].shape == (4, 512)
  assert all(not np.any(v) for k, v in adapters.items() if k[-1] == "b")
  merged = lora.merged(params, state, lora.scale(4, 8.0))
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), merged, dict(params))
  shapes = jax.eval_shape(lambda p: lora.init(p, 4, ["q", "ffn_in"], jax.random.PRNGKey(1)), params)
  assert jax.tree.map(jnp.shape, shapes) == jax.tree.map(jnp.shape, state)
  assert lora.count(state.adapters) == 6 * (128 * 4 + 4 * 128) + 4 * (128 * 4 + 4 * 512)


def test_the_merged_kernels_gradient_is_loras_gradient():
  """d/dA and d/dB of a loss of x @ (W0 + s A B) equal those of x @ W0 + s (x @ A) @ B, the
  form LoRA is written in (Hu et al.; PEFT computes it so)."""
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  x = jax.random.normal(keys[0], (5, 16))
  w0 = jax.random.normal(keys[1], (16, 12))
  adapter = {
    "a": jax.random.normal(keys[2], (16, 3)),
    "b": jax.random.normal(keys[3], (3, 12)),
  }
  s = 2.0

  def merged_loss(ad):
    return jnp.sum(jnp.tanh(x @ (w0 + lora.delta(ad, s))))

  def side_path_loss(ad):
    return jnp.sum(jnp.tanh(x @ w0 + s * (x @ ad["a"]) @ ad["b"]))

  got, want = jax.grad(merged_loss)(adapter), jax.grad(side_path_loss)(adapter)
  for name in ("a", "b"):
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-4)  # float32 sums
