"""Greedy and beam search (both styles) against brute force and greedy.

Hand-made step functions (Markov chains over a 6-token vocabulary) give distributions whose best
sequence is known, which tests the search sharper than a model can; test_decode_transformer.py
checks the model's cache and the jitted entry point.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_nmt.config import choices
from flaxformer_nmt.decoding import beam_search, decode, token_loop
from flaxformer_nmt.decoding import search as search_lib
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID

from toy_steps import (  # noqa: E402
  A,
  B,
  C,
  D,
  V,
  _bigram_step,
  _masked_log_softmax,
  _trigram_cache,
  _trigram_step,
  jitted,
)


def _bigram_search(
  search: Callable[..., Any], step: search_lib.StepFn, max_lengths: jax.Array, **options: Any
) -> Any:
  """`search` over a first-order chain (its cache counts the steps), as one program."""
  return jitted(search, step, {"index": jnp.array(0)}, max_lengths, **options)


def _brute_force(log_table, bias_row, max_len, alpha):
  """Best (normalised score, tokens, model score) over every sequence of <= max_len tokens."""
  best = (-np.inf, None, None)
  for n in range(1, max_len + 1):
    for body in itertools.product((EOS_ID, A, B, C, D), repeat=n):
      if EOS_ID in body[:-1]:
        continue  # nothing follows EOS
      if body[-1] != EOS_ID and n < max_len:
        continue  # without EOS only the hypotheses cut at the maximum length
      prev2, prev1, score = PAD_ID, PAD_ID, 0.0
      for tok in body:
        score += _masked_log_softmax(log_table[prev2, prev1] + bias_row)[tok]
        prev2, prev1 = prev1, tok
      normalized = score / ((5 + n) / 6) ** alpha
      if normalized > best[0]:
        best = (normalized, list(body), score)
  return best


def _known_bigram() -> np.ndarray:
  """A chain where greedy is wrong: A (0.55) then C (0.4) then EOS: 0.22 in all; B EOS: 0.4275."""
  probs = np.full((V, V), 1e-6)
  probs[PAD_ID, [A, B]] = 0.55, 0.45  # the first token
  probs[A, [C, D, EOS_ID]] = 0.4, 0.3, 0.3
  probs[B, EOS_ID] = 0.95
  probs[B, [C, D]] = 0.025
  probs[C, EOS_ID] = 1.0
  probs[D, EOS_ID] = 1.0
  return np.log(probs / probs.sum(-1, keepdims=True))


# ------------------------------------------------------------------------------------------------
# The rules.


def test_length_penalty_is_gnmt_formula():
  assert float(search_lib.length_penalty(1, 0.6)) == pytest.approx(1.0)
  assert float(search_lib.length_penalty(10, 0.6)) == pytest.approx((15 / 6) ** 0.6)
  assert float(search_lib.length_penalty(74, 0.6)) == pytest.approx((79 / 6) ** 0.6)
  np.testing.assert_allclose(search_lib.length_penalty(jnp.arange(1, 50), 0.0), 1.0)


def test_max_length_is_source_length_plus_offset_capped():
  inputs = jnp.array([[7, 8, 1, 0, 0], [7, 8, 9, 10, 1], [0, 0, 0, 0, 0]], jnp.int32)
  np.testing.assert_array_equal(decode.source_lengths(inputs), [3, 5, 0])
  bound = decode.decode_length_bound(src_len=5, max_len_offset=50, model_max_len=None)
  assert bound == 55
  np.testing.assert_array_equal(decode.max_output_lengths(inputs, 50, bound), [53, 55, 0])
  bound = decode.decode_length_bound(src_len=5, max_len_offset=50, model_max_len=54)
  assert bound == 54  # never past the model's positional range
  np.testing.assert_array_equal(decode.max_output_lengths(inputs, 50, bound), [53, 54, 0])


@pytest.mark.parametrize("beam", [1, 3])
def test_outputs_stop_at_each_sentences_max_length(beam):
  """Without EOS every hypothesis runs to its own cap; past it the output is padding."""
  uniform = np.zeros((V, V))  # nothing ever prefers to stop
  no_eos = uniform.copy()
  no_eos[:, EOS_ID] = -np.inf  # a step function that never allows EOS
  max_lengths = jnp.array([2, 5, 0, 3], jnp.int32)
  for allow_eos, table in ((False, no_eos), (True, uniform)):
    step = _bigram_step(table)
    if beam == 1:
      result = _bigram_search(
        token_loop.greedy_search, step, max_lengths, max_decode_len=6, alpha=0.6
      )
    else:
      result = _bigram_search(
        beam_search.beam_search, step, max_lengths, beam_size=beam, alpha=0.6, max_decode_len=6
      )
    tokens = np.asarray(result.tokens)
    lengths = np.asarray(result.lengths)
    assert int(result.num_steps) <= 5  # the loop stops at the longest cap, not the buffer (6)
    assert np.all(lengths <= np.asarray(max_lengths))
    assert np.all(tokens[:, 5:] == PAD_ID)
    for row, n in zip(tokens, lengths, strict=True):
      assert np.all(row[:n] != PAD_ID) and np.all(row[n:] == PAD_ID)
    if not allow_eos:
      np.testing.assert_array_equal(lengths, max_lengths)
      assert not np.any(tokens == EOS_ID)
      assert int(result.num_steps) == 5


def test_early_stopping_when_no_live_hypothesis_can_win():
  """EOS at 0.9 every step: after one step the finished [EOS] beats any live one at any length."""
  probs = np.full((V, V), 0.1 / 4)
  probs[:, EOS_ID] = 0.9
  probs[:, PAD_ID] = 0.0
  step = _bigram_step(np.log(probs + 1e-30))
  max_lengths = jnp.array([40, 50], jnp.int32)
  result = _bigram_search(
    beam_search.beam_search, step, max_lengths, beam_size=4, alpha=0.6, max_decode_len=50
  )
  assert int(result.num_steps) == 1
  np.testing.assert_array_equal(result.tokens[:, :2], [[EOS_ID, PAD_ID]] * 2)
  np.testing.assert_allclose(result.scores, math.log(0.9), rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Search on known distributions.


def test_beam_finds_what_greedy_misses():
  step = _bigram_step(_known_bigram())
  max_lengths = jnp.array([10], jnp.int32)
  greedy = _bigram_search(token_loop.greedy_search, step, max_lengths, max_decode_len=10, alpha=0.6)
  beam = _bigram_search(
    beam_search.beam_search, step, max_lengths, beam_size=4, alpha=0.6, max_decode_len=10
  )
  np.testing.assert_array_equal(greedy.tokens[0, :4], [A, C, EOS_ID, PAD_ID])
  np.testing.assert_array_equal(beam.tokens[0, :3], [B, EOS_ID, PAD_ID])
  np.testing.assert_allclose(greedy.scores, math.log(0.55 * 0.4), rtol=1e-4)
  np.testing.assert_allclose(beam.scores, math.log(0.45 * 0.95), rtol=1e-4)
  np.testing.assert_array_equal(greedy.lengths, [3])
  np.testing.assert_array_equal(beam.lengths, [2])
  np.testing.assert_allclose(
    beam.normalized_scores, math.log(0.45 * 0.95) / (7 / 6) ** 0.6, rtol=1e-4
  )


@pytest.mark.parametrize("style", choices.BEAM_STYLES)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_equals_brute_force(alpha, style):
  """With more slots than prefixes nothing is pruned: the search (early stopping included) must
  return the best normalised sequence of all, per sentence, each with its own maximum length."""
  rng = np.random.default_rng(0)
  log_table = rng.normal(scale=2.0, size=(V, V, V))
  log_table[:, :, EOS_ID] += 1.0  # make EOS competitive so lengths vary
  bias = rng.normal(scale=1.0, size=(3, V))
  max_lengths = np.array([3, 4, 2])
  beam = 4**3  # prefixes of content tokens alive after 3 steps
  result = jitted(
    beam_search.beam_search,
    _trigram_step(log_table),
    _trigram_cache(bias, beam),
    jnp.asarray(max_lengths),
    beam_size=beam,
    alpha=alpha,
    max_decode_len=4,
    style=style,
  )
  for b in range(3):
    normalized, tokens, score = _brute_force(log_table, bias[b], int(max_lengths[b]), alpha)
    n = len(tokens)
    np.testing.assert_array_equal(result.tokens[b, :n], tokens)
    assert np.all(np.asarray(result.tokens[b, n:]) == PAD_ID)
    assert int(result.lengths[b]) == n
    np.testing.assert_allclose(result.scores[b], score, rtol=1e-4)
    np.testing.assert_allclose(result.normalized_scores[b], normalized, rtol=1e-4)


def test_beam_one_is_greedy_on_a_trigram_chain():
  rng = np.random.default_rng(1)
  log_table = rng.normal(scale=1.5, size=(V, V, V))
  bias = rng.normal(size=(5, V))
  max_lengths = jnp.array([6, 8, 3, 8, 1], jnp.int32)
  step, cache = _trigram_step(log_table), _trigram_cache(bias, 1)
  options = dict(alpha=0.6, max_decode_len=8)
  greedy = jitted(token_loop.greedy_search, step, cache, max_lengths, **options)
  beam = jitted(beam_search.beam_search, step, cache, max_lengths, beam_size=1, **options)
  np.testing.assert_array_equal(beam.tokens, greedy.tokens)
  np.testing.assert_array_equal(beam.lengths, greedy.lengths)
  np.testing.assert_allclose(beam.scores, greedy.scores, rtol=1e-6)
  np.testing.assert_allclose(beam.normalized_scores, greedy.normalized_scores, rtol=1e-6)


def _chain(rows: dict[int, dict[int, float]]) -> np.ndarray:
  """A bigram log table from {previous token: {next token: probability}}; the rest ~1e-6."""
  probs = np.full((V, V), 1e-6)
  for prev, nexts in rows.items():
    for tok, p in nexts.items():
      probs[prev, tok] = p
  return np.log(probs / probs.sum(-1, keepdims=True))


def _final_state(log_table: np.ndarray, style: str, beam: int, alpha: float, max_len: int = 10):
  return _bigram_search(
    beam_search.run_beam_search,
    _bigram_step(log_table),
    jnp.array([max_len], jnp.int32),
    beam_size=beam,
    alpha=alpha,
    max_decode_len=max_len,
    style=style,
  )


def test_t2t_keeps_k_live_after_some_finish():
  """Two steps, K = 2: [EOS] finishes at step 0 and [A EOS] at step 1, and t2t still has two live
  hypotheses (A C, B D) when its early stop ends the search; the shrinking beam is down to one."""
  table = _chain(
    {PAD_ID: {A: 0.45, EOS_ID: 0.35, B: 0.2}, A: {C: 0.7, EOS_ID: 0.3}, B: {D: 0.95, EOS_ID: 0.05}}
  )
  t2t = _final_state(table, "t2t", beam=2, alpha=0.0)
  assert int(t2t.step) == 2  # stopped early: [EOS] (0.35) beats A C (0.315), the best live one
  live = np.isfinite(np.asarray(t2t.live_scores[0]))
  np.testing.assert_array_equal(live, [True, True])
  np.testing.assert_array_equal(t2t.live_tokens[0, :, :2], [[A, C], [B, D]])
  np.testing.assert_allclose(t2t.live_scores[0], np.log([0.45 * 0.7, 0.2 * 0.95]), rtol=1e-4)
  np.testing.assert_array_equal(t2t.fin_tokens[0, :, :2], [[EOS_ID, PAD_ID], [A, EOS_ID]])
  np.testing.assert_array_equal(t2t.fin_lengths[0], [1, 2])

  shrinking = _final_state(table, "shrinking", beam=2, alpha=0.0)
  assert int(np.isfinite(np.asarray(shrinking.live_scores[0])).sum()) == 1  # [EOS] took a slot


def test_t2t_returns_the_best_finished_by_normalised_score():
  """[EOS] alone has the highest model score (log 0.35) but B C D EOS (log 0.25) the highest
  normalised one at alpha = 1: -1.386 / (9/6) = -0.92 against -1.05. t2t keeps B live after [EOS]
  finishes and returns it; the shrinking beam gives B's slot to [EOS] and never sees it."""
  table = _chain(
    {
      PAD_ID: {A: 0.4, EOS_ID: 0.35, B: 0.25},
      A: {EOS_ID: 0.3, C: 0.26, D: 0.24, B: 0.2},
      B: {C: 1.0},
      C: {D: 1.0},
      D: {EOS_ID: 1.0},
    }
  )
  for style, want, prob in (("t2t", [B, C, D, EOS_ID], 0.25), ("shrinking", [EOS_ID], 0.35)):
    final = _final_state(table, style, beam=2, alpha=1.0)
    result = _bigram_search(
      beam_search.beam_search,
      _bigram_step(table),
      jnp.array([10], jnp.int32),
      beam_size=2,
      alpha=1.0,
      max_decode_len=10,
      style=style,
    )
    n = len(want)
    np.testing.assert_array_equal(result.tokens[0, : n + 1], [*want, PAD_ID])
    assert int(result.lengths[0]) == n
    np.testing.assert_allclose(result.scores[0], math.log(prob), rtol=1e-4)
    np.testing.assert_allclose(
      result.normalized_scores[0], math.log(prob) / ((5 + n) / 6), rtol=1e-4
    )
    # The returned one is the best of the finished pool, which is sorted by normalised score.
    pool = np.asarray(final.fin_normalized[0])
    assert pool[0] == pytest.approx(float(result.normalized_scores[0]), rel=1e-6)
    assert np.all(np.diff(pool[np.isfinite(pool)]) <= 0)


def test_t2t_early_stop_is_against_the_best_finished():
  """EOS at 0.9 every step: after one step [EOS] beats any live hypothesis at any length."""
  probs = np.full((V, V), 0.1 / 4)
  probs[:, EOS_ID] = 0.9
  probs[:, PAD_ID] = 0.0
  final = _final_state(np.log(probs + 1e-30), "t2t", beam=4, alpha=0.6, max_len=40)
  assert int(final.step) == 1
  assert np.all(np.isfinite(np.asarray(final.live_scores[0])))  # still K live when it stopped
  np.testing.assert_allclose(final.fin_scores[0, 0], math.log(0.9), rtol=1e-5)


def test_beam_styles_are_checked():
  with pytest.raises(ValueError, match="beam style 'marian'"):
    decode.SearchConfig(style="marian")
