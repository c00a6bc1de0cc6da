"""training/lora.py: which kernels are adapted, the initial adapters, the merged form's
gradients, and adapter dropout (the trained runs are tests/e2e/test_lora.py's)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import model_params
import numpy as np
import optax
import pytest
from flax import traverse_util

from flaxformer_nmt.config import builders, choices
from flaxformer_nmt.model import layers
from flaxformer_nmt.model.layers import LORA_COLLECTION
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig, init_params
from flaxformer_nmt.training import lora, steps

import checkpoint_states
import helpers


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
  params = model_params.random_params(model_cfg)  # any W0: not a program per initializer op
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


# ------------------------------------------------------------------------ adapter dropout


def _dropout_run(lora_dropout: float) -> tuple[TransformerConfig, Any, lora.LoraState, np.ndarray]:
  """A narrow one-layer model (no other dropout) with random non-zero adapters on every target:
  (its config with `lora_dropout`, W0, the LoRA state, a copy-task batch). W0 is init_params'
  (the tolerances below were set on its values) and the adapters are drawn per leaf, all in one
  program: op by op, the initializer and each draw would be programs of their own."""
  c = helpers.narrow(builders.base_config("tiny"))
  c.model.dropout_rate = 0.0
  cfg = TransformerConfig.from_config(c.model, 64)

  def make(params_key: jax.Array, lora_key: jax.Array, noise_key: jax.Array):
    params = init_params(cfg, params_key)
    state = lora.init(params, 2, list(lora.TARGETS), lora_key)
    leaves, tree = jax.tree.flatten(state.adapters)
    keys = jax.random.split(noise_key, len(leaves))
    noisy = [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    return params, state.replace(adapters=jax.tree.unflatten(tree, noisy))

  params, state = jax.jit(make)(*(jax.random.PRNGKey(i) for i in range(3)))
  tokens = np.random.default_rng(0).integers(3, 64, (2, 7)).astype(np.int32)
  return dataclasses.replace(cfg, lora_dropout=lora_dropout), params, state, tokens


_LOGITS: dict[tuple, Any] = {}
_merged = jax.jit(lora.merged, static_argnums=2)  # W0 + s A B as one program, not one per leaf


def _logits(
  cfg: TransformerConfig,
  params: Any,
  tokens: np.ndarray,
  adapters: Any = None,
  train: bool = True,
  seed: int = 0,
) -> np.ndarray:
  """The model's logits, each (config, mode, adapters or not, dropout mask function) compiled
  once as a whole program: run op by op, every layer's operations are programs of their own.
  The mask function is in the key because the tests swap it (monkeypatch) between calls."""
  key = (cfg, train, adapters is None, layers.dropout_keep_mask)
  if key not in _LOGITS:

    def apply(params: Any, adapters: Any, tokens: jax.Array, rng: jax.Array) -> jax.Array:
      variables = {"params": params}
      if adapters is not None:
        variables[LORA_COLLECTION] = adapters
      return Transformer(cfg).apply(variables, tokens, tokens, train=train, rngs={"dropout": rng})

    _LOGITS[key] = jax.jit(apply)
  return np.asarray(_LOGITS[key](params, adapters, tokens, jax.random.PRNGKey(seed)))


def test_adapter_dropout_drops_the_adapters_inputs_only(monkeypatch):
  """PEFT's form, x W0 + s drop(x) A B, through every adapted product (q, k, v, o of self- and
  cross-attention, both FFN matrices): a mask that keeps everything gives the merged model at
  scale s / (1 - p); one that drops everything gives W0's model; evaluation is the merged model
  bit for bit; and real masks differ per key."""
  p, s = 0.25, 2.0
  cfg, w0, state, tokens = _dropout_run(p)
  plain = dataclasses.replace(cfg, lora_dropout=0.0)
  adapters = lora.dropout_inputs(state.adapters, s)
  merged = _merged(w0, state, s)
  dropped = _logits(cfg, merged, tokens, adapters)
  assert not np.allclose(dropped, _logits(cfg, merged, tokens, adapters, seed=1))
  assert not np.allclose(dropped, _logits(plain, merged, tokens))
  np.testing.assert_array_equal(
    _logits(cfg, merged, tokens, adapters, train=False), _logits(plain, merged, tokens, train=False)
  )
  keep_all = lambda rng, rate, shape, kind: jnp.ones(shape, bool)
  monkeypatch.setattr(layers, "dropout_keep_mask", keep_all)
  np.testing.assert_allclose(
    _logits(cfg, merged, tokens, adapters),
    _logits(plain, _merged(w0, state, s / (1 - p)), tokens),
    rtol=1e-5,
    atol=1e-5,
  )
  monkeypatch.setattr(layers, "dropout_keep_mask", lambda *a: ~keep_all(*a))
  np.testing.assert_allclose(
    _logits(cfg, merged, tokens, adapters), _logits(plain, w0, tokens), rtol=1e-5, atol=1e-5
  )


def _one_step(cfg, w0, state, tokens, s: float):
  """One pmapped (1 device) train step of the LoRA run under plain SGD at rate 1, so that the
  adapters move by minus their gradient: (the merged params it starts from, its new state,
  the adapters' gradient, its metrics)."""
  tx = optax.sgd(1.0)
  merged = _merged(w0, state, s)
  start = jax.jit(  # one program, not one per leaf
    lambda m, rng, lora_state: steps.create_train_state(m, tx, rng, None, lora_state)
  )(merged, jax.random.PRNGKey(3), state)
  step = helpers.pmapped_train_step(Transformer(cfg), tx, lambda count: 1.0, lora_scale=s)
  batch = {"inputs": tokens[None], "targets": tokens[None]}
  after, metrics = jax.device_get(step(jax.tree.map(lambda x: np.asarray(x)[None], start), batch))
  grads = jax.tree.map(lambda old, new: old - new[0], state.adapters, after.lora.adapters)
  return merged, after, grads, metrics


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_the_train_steps_adapter_dropout_gradient_is_loras(monkeypatch):
  """The step passes the adapters to a model with lora_dropout, and differentiates through both
  their paths: with a mask that keeps everything, the adapters' gradient is that of the merged
  model at scale s / (1 - p) (the same function of A and B); with real masks only the adapters
  and the kernels they merge into move, and the gradient is another."""
  p, s = 0.5, 2.0
  cfg, w0, state, tokens = _dropout_run(p)
  merged, after, grads, _ = _one_step(cfg, w0, state, tokens, s)
  checkpoint_states.assert_bitwise_equal(
    after.lora.base, jax.tree.map(lambda x: x[None], state.base)
  )
  flat_new, flat_old = (traverse_util.flatten_dict(t) for t in (after.params, merged))
  changed = {k for k in flat_new if not np.array_equal(flat_new[k][0], flat_old[k])}
  assert changed == set(lora.targeted_paths(w0, list(lora.TARGETS)))
  assert all(np.abs(g).max() > 0 for g in jax.tree.leaves(grads))  # A and B both learn
  monkeypatch.setattr(
    layers, "dropout_keep_mask", lambda rng, rate, shape, kind: jnp.ones(shape, bool)
  )
  _, _, kept, kept_metrics = _one_step(cfg, w0, state, tokens, s)
  plain = dataclasses.replace(cfg, lora_dropout=0.0)
  _, _, wide, wide_metrics = _one_step(plain, w0, state, tokens, s / (1 - p))
  np.testing.assert_allclose(kept_metrics["loss_sum"], wide_metrics["loss_sum"], rtol=1e-6)
  largest = max(float(np.abs(g).max()) for g in jax.tree.leaves(wide))
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * largest)
  jax.tree.map(close, kept, wide)
  differs = [not np.allclose(a, b, atol=1e-3 * largest) for a, b in zip(
    jax.tree.leaves(grads), jax.tree.leaves(kept), strict=True)]  # fmt: skip
  assert any(differs)  # real masks give another gradient
