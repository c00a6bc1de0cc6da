"""n-best lists, sampling and ensembles against brute force, greedy and the model's distribution.

The hand-made step functions of test_decode.py (Markov chains over a 6-token vocabulary) make the
exact answers computable; test_decode_research.py checks the same features through the model,
the translator and main.py.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_nmt.config import choices
from flaxformer_nmt.decoding import beam_search, decode, sampling, token_loop
from flaxformer_nmt.decoding import search as search_lib
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID

from toy_steps import V, _bigram_step, _masked_log_softmax, _trigram_cache, _trigram_step, jitted

CONTENT = (2, 3, 4, 5)


def _all_sequences(log_table, bias_row, max_len, alpha):
  """Every finished sequence of <= max_len tokens: (normalised score, tokens), best first."""
  out = []
  for n in range(1, max_len + 1):
    for body in itertools.product((EOS_ID, *CONTENT), repeat=n):
      if EOS_ID in body[:-1] or (body[-1] != EOS_ID and n < max_len):
        continue
      prev2, prev1, score = PAD_ID, PAD_ID, 0.0
      for tok in body:
        score += _masked_log_softmax(log_table[prev2, prev1] + bias_row)[tok]
        prev2, prev1 = prev1, tok
      out.append((score / ((5 + n) / 6) ** alpha, list(body)))
  return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize("style", choices.BEAM_STYLES)
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_nbest_ranks_equal_brute_force(alpha, style):
  """With more slots than prefixes nothing is pruned, so the n best are the n best of all."""
  rng = np.random.default_rng(0)
  log_table = rng.normal(scale=2.0, size=(V, V, V))
  log_table[:, :, EOS_ID] += 1.0
  bias = rng.normal(scale=1.0, size=(3, V))
  max_lengths = np.array([3, 4, 2])
  beam, n = 4**3, 5
  result = jitted(
    beam_search.beam_search,
    _trigram_step(log_table),
    _trigram_cache(bias, beam),
    jnp.asarray(max_lengths),
    beam_size=beam,
    alpha=alpha,
    max_decode_len=4,
    style=style,
    nbest=n,
  )
  assert result.tokens.shape == (3, n, 4) and result.normalized_scores.shape == (3, n)
  for b in range(3):
    expected = _all_sequences(log_table, bias[b], int(max_lengths[b]), alpha)[:n]
    for rank, (normalized, tokens) in enumerate(expected):
      got = np.asarray(result.tokens[b, rank])
      np.testing.assert_array_equal(got[: len(tokens)], tokens)
      assert np.all(got[len(tokens) :] == PAD_ID)
      np.testing.assert_allclose(result.normalized_scores[b, rank], normalized, rtol=1e-4)


@pytest.mark.parametrize("style", choices.BEAM_STYLES)
def test_nbest_of_a_narrow_beam_is_sorted_and_its_first_is_the_one_best(style):
  rng = np.random.default_rng(3)
  log_table = rng.normal(scale=2.0, size=(V, V, V))
  bias = rng.normal(scale=1.0, size=(4, V))
  max_lengths = jnp.asarray([6, 5, 6, 4])
  kwargs = dict(beam_size=3, alpha=0.6, max_decode_len=6, style=style)
  step = _trigram_step(log_table)
  one = jitted(beam_search.beam_search, step, _trigram_cache(bias, 3), max_lengths, **kwargs)
  three = jitted(
    beam_search.beam_search, step, _trigram_cache(bias, 3), max_lengths, nbest=3, **kwargs
  )
  scores = np.asarray(three.normalized_scores)
  assert np.all(np.isfinite(scores)) and np.all(np.diff(scores, axis=1) <= 0)
  np.testing.assert_allclose(three.normalized_scores[:, 0], one.normalized_scores, rtol=1e-5)
  np.testing.assert_array_equal(three.tokens[:, 0], one.tokens)
  for b in range(4):  # three different hypotheses per sentence
    assert len({tuple(np.asarray(t).tolist()) for t in three.tokens[b]}) == 3
  with pytest.raises(ValueError, match="beam size"):
    jitted(beam_search.beam_search, step, _trigram_cache(bias, 3), max_lengths, nbest=4, **kwargs)


@pytest.mark.parametrize("style", choices.BEAM_STYLES)
def test_nbest_keeps_searching_after_a_sure_winner(style):
  """EOS first has probability 0.9: the 1-best search stops after one step, but a 3-best list
  must go on until three hypotheses have finished."""
  probs = np.full((V, V), 1e-6)
  probs[PAD_ID, [EOS_ID, 2, 3]] = 0.9, 0.06, 0.04
  probs[2, [EOS_ID, 4]] = 0.7, 0.3
  probs[3, EOS_ID] = 1.0
  probs[4, EOS_ID] = 1.0
  step = _bigram_step(np.log(probs / probs.sum(-1, keepdims=True)))
  kwargs = dict(beam_size=3, alpha=0.0, max_decode_len=5, style=style)
  cache = {"index": jnp.array(0, jnp.int32)}
  one = jitted(beam_search.beam_search, step, cache, jnp.asarray([5]), **kwargs)
  three = jitted(beam_search.beam_search, step, cache, jnp.asarray([5]), nbest=3, **kwargs)
  assert int(one.num_steps) == 1 and int(one.tokens[0, 0]) == EOS_ID
  got = [
    np.asarray(t)[: int(n)].tolist() for t, n in zip(three.tokens[0], three.lengths[0], strict=True)
  ]
  assert got == [[EOS_ID], [2, EOS_ID], [3, EOS_ID]]
  np.testing.assert_allclose(three.scores[0], np.log([0.9, 0.06 * 0.7, 0.04]), rtol=1e-3)


def _sample(log_table, bias, max_lengths, rule, keys, max_decode_len):
  return jitted(
    sampling.sample_search,
    _trigram_step(log_table),
    _trigram_cache(bias, 1),
    jnp.asarray(max_lengths),
    keys,
    max_decode_len=max_decode_len,
    alpha=0.6,
    rule=rule,
  )


def _keys(n: int, seed: int = 0) -> jax.Array:
  return jax.random.split(jax.random.key(seed), n)


@pytest.mark.parametrize(
  "rule",
  [
    sampling.SamplingRule(top_k=1),
    sampling.SamplingRule(temperature=1e-4),
    sampling.SamplingRule(top_p=1e-6),
  ],
  ids=["top_k=1", "temperature->0", "top_p->0"],
)
def test_sampling_without_freedom_is_greedy(rule):
  rng = np.random.default_rng(4)
  log_table = rng.normal(scale=2.0, size=(V, V, V))
  bias = rng.normal(scale=1.0, size=(16, V))
  max_lengths = rng.integers(1, 8, size=16)
  greedy = jitted(
    token_loop.greedy_search,
    _trigram_step(log_table),
    _trigram_cache(bias, 1),
    jnp.asarray(max_lengths),
    max_decode_len=8,
    alpha=0.6,
  )
  sampled = _sample(log_table, bias, max_lengths, rule, _keys(16), 8)
  np.testing.assert_array_equal(sampled.tokens, greedy.tokens)
  np.testing.assert_array_equal(sampled.lengths, greedy.lengths)
  np.testing.assert_allclose(sampled.scores, greedy.scores, rtol=1e-6)


def test_sampled_frequencies_match_the_distribution():
  """Two-token outputs of a fixed chain, 20,000 samples: a chi-square test per reshaping rule
  (fixed keys, so the test is deterministic), against the exactly computed distribution."""
  rng = np.random.default_rng(5)
  log_table = rng.normal(scale=1.0, size=(V, V, V))
  n = 20_000
  bias = np.zeros((n, V))
  for rule in (
    sampling.SamplingRule(),
    sampling.SamplingRule(temperature=0.7),
    sampling.SamplingRule(top_k=2),
    sampling.SamplingRule(top_p=0.8),
  ):
    out = _sample(log_table, bias, np.full(n, 2), rule, _keys(n, seed=11), 2)
    observed: dict[tuple[int, int], int] = {}
    for row in np.asarray(out.tokens).tolist():
      observed[tuple(row)] = observed.get(tuple(row), 0) + 1
    expected = {}
    first = np.asarray(
      sampling.reshape_distribution(jnp.asarray(_masked_log_softmax(log_table[0, 0]))[None], rule)
    )[0]
    p1 = np.exp(first - np.logaddexp.reduce(first))
    for a in range(V):
      if p1[a] == 0:
        continue
      if a == EOS_ID:
        expected[(EOS_ID, PAD_ID)] = p1[a]
        continue
      second = np.asarray(
        sampling.reshape_distribution(jnp.asarray(_masked_log_softmax(log_table[0, a]))[None], rule)
      )[0]
      p2 = np.exp(second - np.logaddexp.reduce(second))
      for b in range(V):
        if p2[b] > 0:
          expected[(a, b)] = p1[a] * p2[b]
    assert set(observed) <= set(expected), rule  # nothing outside the reshaped support
    cells = [k for k in expected if expected[k] * n >= 5]
    chi2 = sum((observed.get(k, 0) - n * expected[k]) ** 2 / (n * expected[k]) for k in cells)
    dof = len(cells) - 1
    # The 99.9% point of chi-square is below dof + 3.3 sqrt(2 dof) + 10 for these sizes.
    assert chi2 < dof + 3.3 * np.sqrt(2 * dof) + 10, (rule, chi2, dof)


def test_draw_never_picks_a_token_without_mass():
  """Whatever the uniform number (here many keys, and logits whose tail is cut to -inf, the
  last token included), only tokens with probability > 0 come out."""
  logits = jnp.asarray([[-jnp.inf, 0.0, -jnp.inf, 2.0, -jnp.inf]] * 4096)
  keys = jax.random.split(jax.random.PRNGKey(0), 4096)
  drawn = np.asarray(sampling.draw(keys, logits))
  assert set(drawn.tolist()) == {1, 3}
  assert 0.8 < np.mean(drawn == 3) < 0.94  # e^2 / (1 + e^2) = 0.88
  one = jnp.asarray([[-jnp.inf, -jnp.inf, 5.0, -jnp.inf]] * 64)
  assert set(np.asarray(sampling.draw(keys[:64], one)).tolist()) == {2}


def test_top_k_and_top_p_cut_the_support():
  logp = jnp.log(jnp.asarray([[0.0, 0.5, 0.3, 0.15, 0.05]])).at[:, 0].set(-jnp.inf)
  kept = lambda rule: np.isfinite(np.asarray(sampling.reshape_distribution(logp, rule))[0])  # noqa: E731
  assert kept(sampling.SamplingRule(top_k=2)).tolist() == [False, True, True, False, False]
  assert kept(sampling.SamplingRule(top_p=0.5)).tolist() == [False, True, False, False, False]
  assert kept(sampling.SamplingRule(top_p=0.51)).tolist() == [False, True, True, False, False]
  assert kept(sampling.SamplingRule(top_p=0.9)).tolist() == [False, True, True, True, False]
  assert kept(sampling.SamplingRule(top_p=1.0)).tolist() == [False, True, True, True, True]


def test_an_ensemble_of_a_model_with_itself_is_that_model():
  rng = np.random.default_rng(6)
  log_table = rng.normal(scale=2.0, size=(V, V, V))
  bias = rng.normal(scale=1.0, size=(4, V))
  step = _trigram_step(log_table)
  pair = decode.ensemble_step_fn([step, step])
  cache = _trigram_cache(bias, 3)
  kwargs = dict(beam_size=3, alpha=0.6, max_decode_len=6)
  max_lengths = jnp.asarray([6, 5, 6, 4])
  one = jitted(beam_search.beam_search, step, cache, max_lengths, **kwargs)
  two = jitted(beam_search.beam_search, pair, (cache, cache), max_lengths, **kwargs)
  np.testing.assert_array_equal(two.tokens, one.tokens)
  np.testing.assert_allclose(two.scores, one.scores, rtol=1e-5)


def test_an_ensemble_averages_probabilities():
  """Two different chains: the ensemble's first-step log-probabilities are log((p + q) / 2)."""
  rng = np.random.default_rng(7)
  tables = [rng.normal(scale=2.0, size=(V, V, V)) for _ in range(2)]
  bias = np.zeros((1, V))
  pair = decode.ensemble_step_fn([_trigram_step(t) for t in tables])
  cache = _trigram_cache(bias, 1)
  logits, _ = pair((cache, cache), jnp.zeros((1, 1), jnp.int32))
  p = [np.exp(_masked_log_softmax(t[0, 0])) for t in tables]
  expected = np.log((p[0] + p[1]) / 2)
  got = np.asarray(search_lib.next_token_log_probs(logits))[0]
  np.testing.assert_allclose(got[1:], expected[1:], rtol=1e-5)
