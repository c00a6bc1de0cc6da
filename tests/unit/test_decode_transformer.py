"""Cached decoding on the real Transformer (tiny size): against the full forward pass, greedy
against beam 1, beam 4 against greedy, and the per-sentence cross-attention cache. The search
itself, on hand-made step functions, is tested in test_decode.py.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import model_params
import numpy as np
import optax
import pytest

from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.config import choices
from flaxformer_nmt.decoding import beam_search, decode
from flaxformer_nmt.model import shapes as shapes_lib
from flaxformer_nmt.model.shapes import init_decode_cache
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig

import m2m100_models

# One xdist worker runs the module, so `trained_tiny` (12 s) is trained once, not once per worker.
pytestmark = pytest.mark.xdist_group("decode_transformer")
# The tests that need `trained_tiny`: training it takes about 9 s cold, so whichever of them runs
# first takes over 10 s (docs/developing.md: `-m "not slow"` leaves them out while editing).
_needs_training = pytest.mark.slow

# ------------------------------------------------------------------------------------------------
# The Transformer (tiny size). One model, trained once, serves every test below: compiling is
# what costs time on CPU, so the tests share programs where they can.

_VOCAB = 16


def _reversal_batch(rng: np.random.Generator, batch: int, vocab: int, max_len: int):
  """Sources of random length ending in EOS; targets are the reversed tokens, then EOS."""
  inputs = np.zeros((batch, max_len + 1), np.int32)
  targets = np.zeros((batch, max_len + 1), np.int32)
  for i in range(batch):
    n = rng.integers(2, max_len + 1)
    tokens = rng.integers(3, vocab, size=n)
    inputs[i, : n + 1] = [*tokens, EOS_ID]
    targets[i, : n + 1] = [*tokens[::-1], EOS_ID]
  return inputs, targets


@pytest.fixture(scope="module")
def trained_tiny():
  """A tiny Transformer trained for a few seconds on reversing token strings.

  Half-trained on purpose: its distributions are neither uniform nor one-hot, so beam search has
  real choices to make and EOS comes at varying steps.
  """
  c = config_lib.base_config("tiny")
  model = Transformer(TransformerConfig.from_config(c.model, vocab_size=_VOCAB))
  params = model_params.random_params(model.cfg)  # init_params' distributions, drawn on the host
  tx = optax.adam(1e-3)
  opt_state = tx.init(params)

  # Compiled at XLA's usual optimisation level: the unit tier's -O0 (tests/conftest.py) compiles
  # faster, but this program runs 70 times, and at -O0 the steps take about twice as long.
  @functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 2})
  def train_step(params, opt_state, inputs, targets):
    def loss_fn(p):
      logits = model.apply({"params": p}, inputs, targets)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
      mask = targets != PAD_ID
      return jnp.sum(ce * mask) / jnp.sum(mask)

    grads = jax.grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state

  rng = np.random.default_rng(0)
  for _ in range(70):
    inputs, targets = _reversal_batch(rng, 32, _VOCAB, 6)
    params, opt_state = train_step(params, opt_state, inputs, targets)
  inputs, _ = _reversal_batch(np.random.default_rng(1), 16, _VOCAB, 6)
  return model, params, jnp.asarray(inputs)


@_needs_training
def test_cached_decoding_matches_full_forward_pass(trained_tiny):
  model, params, _ = trained_tiny
  _assert_cached_decoding_matches_full_forward_pass(model, params)


def test_narrow_keys_decode_as_they_train():
  """Table 3 row B's attention (d_k = 3 < d_v = 8): W^Q and W^K are [D, N * d_k], the decode
  cache keeps keys d_k wide and values d_v wide, and cached decoding gives the full pass's
  logits."""
  cfg = TransformerConfig(vocab_size=_VOCAB, num_layers=1, d_model=16, d_ff=32, num_heads=2, d_k=3)
  model, params = Transformer(cfg), model_params.random_params(cfg, seed=3)
  attention = params["decoder_0"]["self_attention"]
  assert [attention[w].shape for w in ("query", "key", "value", "out")] == [
    (16, 6),
    (16, 6),
    (16, 16),
    (16, 16),
  ]
  cache = init_decode_cache(model, batch_size=3, max_decode_len=6, src_len=7)
  layer_cache = cache["decoder_0"]["self_attention"]
  assert layer_cache["cached_key"].shape == (3, 2, 3, 6)  # [B, N, d_k, L]
  assert layer_cache["cached_value"].shape == (3, 2, 6, 8)  # [B, N, L, d_v]
  _assert_cached_decoding_matches_full_forward_pass(model, params)


def test_m2m100s_options_decode_as_they_train():
  """M2M100's layout (issue 62): pre-LN with final norms, its position table (from 2), the
  decoder started from `</s>`, attention biases: cached decoding gives the full pass's logits."""
  cfg = m2m100_models.layout(_VOCAB)
  _assert_cached_decoding_matches_full_forward_pass(
    Transformer(cfg), model_params.random_params(cfg, seed=4)
  )


def _assert_cached_decoding_matches_full_forward_pass(model: Transformer, params) -> None:
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, _VOCAB, size=(3, 7)).astype(np.int32)
  inputs[0, 4:] = PAD_ID  # sources of different lengths
  inputs[1, 6:] = PAD_ID
  targets = rng.integers(3, _VOCAB, size=(3, 6)).astype(np.int32)
  targets[:, -1] = EOS_ID
  targets[2, 3:] = [EOS_ID, PAD_ID, PAD_ID]
  # [batch, tgt_len, vocab], in numpy: the loop below indexes it with host masks (on a device
  # array each mask's shape would be a program of its own).
  full = np.asarray(jax.jit(model.apply)({"params": params}, inputs, targets))

  encoded = jax.jit(functools.partial(model.apply, method=Transformer.encode))(
    {"params": params}, inputs
  )
  # The parameters and the encoder output are arguments, not constants folded into the program
  # (which XLA would compile far slower), as in the decoders' own loop.
  step = jax.jit(lambda p, e, x, cache, ids: decode.model_step_fn(model, p, e, x)(cache, ids))
  # The empty cache made in one program (eagerly, each leaf's zeros would be one).
  cache = jax.jit(lambda: init_decode_cache(model, batch_size=3, max_decode_len=6, src_len=7))()
  decoder_input = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]  # shifted right, PAD first
  for t in range(6):
    logits, cache = step(params, encoded, inputs, cache, decoder_input[:, t : t + 1])
    real = targets[:, t] != PAD_ID  # positions after a target's end are padding in the full pass
    np.testing.assert_allclose(np.asarray(logits)[real], full[real, t], atol=1e-4, rtol=1e-4)


@_needs_training
def test_beam_one_equals_greedy_on_the_transformer(trained_tiny):
  model, params, inputs = trained_tiny
  search = decode.SearchConfig(beam_size=1, alpha=0.6, max_len_offset=3)
  greedy = decode.decode_batch(model, params, inputs, search, greedy=True)
  beam = decode.decode_batch(model, params, inputs, search)
  np.testing.assert_array_equal(beam.tokens, greedy.tokens)
  np.testing.assert_array_equal(beam.lengths, greedy.lengths)
  np.testing.assert_allclose(beam.scores, greedy.scores, rtol=1e-5)
  np.testing.assert_allclose(beam.normalized_scores, greedy.normalized_scores, rtol=1e-5)
  # The length rule on the real model: at most source length (EOS included) + 3 tokens.
  src_len = np.asarray(decode.source_lengths(inputs))
  assert np.all(np.asarray(greedy.lengths) <= src_len + 3)
  assert np.any(np.asarray(greedy.tokens) == EOS_ID)  # the trained model does stop


@_needs_training
def test_t2t_beam_one_is_greedy_search_on_the_transformer(trained_tiny):
  """t2t's own beam 1 would search on past EOS; beam size 1 runs greedy search instead."""
  model, params, inputs = trained_tiny
  search = decode.SearchConfig(beam_size=1, alpha=0.6, max_len_offset=3, style="t2t")
  greedy = decode.decode_batch(model, params, inputs, search, greedy=True)
  beam = decode.decode_batch(model, params, inputs, search)
  np.testing.assert_array_equal(beam.tokens, greedy.tokens)
  np.testing.assert_array_equal(beam.lengths, greedy.lengths)


@_needs_training
@pytest.mark.parametrize("style", choices.BEAM_STYLES)
def test_beam_four_scores_at_least_greedy_on_the_transformer(trained_tiny, style):
  model, params, inputs = trained_tiny
  search = decode.SearchConfig(beam_size=4, alpha=0.6, max_len_offset=3, style=style)
  greedy = decode.decode_batch(model, params, inputs, search, greedy=True)
  beam = decode.decode_batch(model, params, inputs, search)
  # Beam search maximises the normalised score; it must do at least as well as greedy on it.
  assert np.all(np.asarray(beam.normalized_scores) >= np.asarray(greedy.normalized_scores) - 1e-5)
  assert np.any(np.asarray(beam.normalized_scores) > np.asarray(greedy.normalized_scores) + 1e-3)
  assert np.all(np.asarray(beam.lengths) >= 2)  # real outputs, not a bare EOS everywhere
  # With alpha = 0 the objective is the model score itself (greedy's tokens do not depend on alpha).
  plain = decode.decode_batch(model, params, inputs, dataclasses.replace(search, alpha=0.0))
  assert np.all(np.asarray(plain.scores) >= np.asarray(greedy.scores) - 1e-5)
  np.testing.assert_allclose(plain.normalized_scores, plain.scores)
  # Returned scores are the model's: rescore the beam output with the teacher-forced pass.
  logits = jax.jit(model.apply)({"params": params}, inputs, beam.tokens)
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  tokens = np.asarray(beam.tokens)
  picked = np.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
  rescored = np.where(tokens != PAD_ID, picked, 0.0).sum(-1)
  np.testing.assert_allclose(beam.scores, rescored, rtol=1e-4, atol=1e-4)


@_needs_training
def test_per_sentence_cross_attention_equals_repeating_the_source_per_beam(trained_tiny):
  """Beam rows share their sentence's one copy of the encoder keys/values; the textbook way
  repeats the encoder output K times and reorders it with the beams every step. Same search."""
  model, params, inputs = trained_tiny
  k, offset = 4, 3
  search = decode.SearchConfig(beam_size=k, alpha=0.6, max_len_offset=offset)
  ours = decode.decode_batch(model, params, inputs, search)

  batch, src_len = inputs.shape
  max_decode_len = decode.decode_length_bound(src_len, offset, model.cfg.max_len)

  @jax.jit
  def repeated(params, inputs):
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    rows_encoded = jnp.repeat(encoded, k, axis=0)  # [batch * beam, src_len, d_model]
    rows_inputs = jnp.repeat(inputs, k, axis=0)
    cache = init_decode_cache(model, batch * k, max_decode_len, src_len)  # one row per beam
    # model_step_fn projects the repeated encoder output: K copies of each sentence's keys.
    return beam_search.beam_search(
      decode.model_step_fn(model, params, rows_encoded, rows_inputs),
      cache,
      decode.max_output_lengths(inputs, offset, max_decode_len),
      beam_size=k,
      alpha=0.6,
      max_decode_len=max_decode_len,
    )

  want = repeated(params, inputs)
  np.testing.assert_array_equal(ours.tokens, want.tokens)
  np.testing.assert_allclose(ours.scores, want.scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d_ff", [64, 1039])  # 1039: a reference size, so the shape is traced
@pytest.mark.parametrize("rows,length,src_len,sentences", [(8, 20, 12, 2), (1, 60, 8, 1)])
def test_decode_cache_from_its_layout_equals_the_traced_one(d_ff, rows, length, src_len, sentences):
  """init_decode_cache rescales a layout traced once per model; it must equal tracing the
  decoder's init at the request's own sizes, leaf by leaf, all zeros."""
  cfg = TransformerConfig(
    vocab_size=40, num_layers=2, d_model=16, d_ff=d_ff, num_heads=2, max_len=64
  )
  model = Transformer(cfg)
  cache = init_decode_cache(model, rows, length, src_len, num_sentences=sentences)
  traced = shapes_lib._traced_cache_shapes(model, rows, length, src_len, sentences)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), cache) == jax.tree.map(
    lambda s: (s.shape, s.dtype), traced
  )
  assert all(not np.asarray(x).any() for x in jax.tree.leaves(cache))
