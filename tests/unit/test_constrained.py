"""Constrained beam search (decoding/constrained.py) and its term tracker (constraints.py), on the
hand-made Markov chains of toy_steps.py: against brute force, against the plain beam search for a
sentence without terms, and at the narrowest beam the translator would use."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_nmt.config import choices
from flaxformer_nmt.decoding import beam_search, constrained, constraints
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID

from toy_steps import A, B, C, D, V, _masked_log_softmax, _trigram_cache, _trigram_step  # noqa: E402


def _packed(per_row):
  return constraints.Constraints(*(jnp.asarray(x) for x in constraints.pack(per_row)))


def _contains(seq, term) -> bool:
  n = len(term)
  return any(tuple(seq[i : i + n]) == tuple(term) for i in range(len(seq) - n + 1))


@jax.jit
def _advance_and_met(c, progress, token):
  """One tracker step, jitted as the search runs it (eagerly, each operation is a program)."""
  progress = constraints.advance(c, progress, token)
  return progress, constraints.met(c, progress)


def _met_after(terms, sequence):
  """The tracker's pieces met after each token of `sequence`, one sentence, one hypothesis."""
  c = _packed([terms])
  progress = np.zeros((1, 1, c.tokens.shape[1]), np.int32)
  out = []
  for token in sequence:
    progress, met = _advance_and_met(c, progress, np.array([[token]], np.int32))
    out.append(int(np.asarray(met)[0, 0]))
  return out


def test_tracker_counts_pieces_and_falls_back_like_kmp():
  assert _met_after([[A, B]], [A, A, B]) == [1, 1, 2]  # "a a b" meets "a b"
  assert _met_after([[A, A, B]], [A, A, A, B]) == [1, 2, 2, 3]  # the border "a a" survives
  assert _met_after([[A, B]], [A, C, B]) == [1, 0, 0]  # a broken phrase is unmet again
  assert _met_after([[A, B], [C]], [A, B, A, C]) == [1, 2, 2, 3]  # a met term stays met
  assert _met_after([[A, B, A, B, C]], [A, B, A, B, A, B, C]) == [1, 2, 3, 4, 3, 4, 5]


def test_next_pieces_are_what_each_unmet_term_needs():
  c = _packed([[[A, B], [C]]])
  progress = np.array([[[1, 0], [2, 1]]], np.int32)  # [batch 1, hypotheses 2, terms 2]
  pieces = jax.jit(constraints.next_pieces)(c, progress)
  np.testing.assert_array_equal(pieces, [[[B, C], [-1, -1]]])


def _brute_force(log_table, bias_row, max_len, alpha, terms):
  """Best (normalised score, tokens) over every sequence of <= max_len tokens holding all terms."""
  best = (-np.inf, None)
  for n in range(1, max_len + 1):
    for body in itertools.product((EOS_ID, A, B, C, D), repeat=n):
      if EOS_ID in body[:-1] or (body[-1] != EOS_ID and n < max_len):
        continue
      if not all(_contains(body, t) for t in terms):
        continue
      prev2, prev1, score = PAD_ID, PAD_ID, 0.0
      for tok in body:
        score += _masked_log_softmax(log_table[prev2, prev1] + bias_row)[tok]
        prev2, prev1 = prev1, tok
      normalized = score / ((5 + n) / 6) ** alpha
      if normalized > best[0]:
        best = (normalized, list(body))
  return best


@functools.partial(jax.jit, static_argnames=("beam", "alpha", "style", "nbest", "width"))
def _jitted_search(log_table, bias, max_lengths, c, *, beam, alpha, style, nbest, width):
  """The search in one program, as the translator runs it, the chain an argument: chains of one
  shape share the program."""
  return constrained.constrained_search(
    _trigram_step(log_table),
    _trigram_cache(bias, beam),
    max_lengths,
    c,
    beam_size=beam,
    alpha=alpha,
    max_decode_len=width,
    style=style,
    nbest=nbest,
  )


def _search(log_table, bias, max_lengths, terms, *, beam, alpha, style, nbest=1, width=None):
  return _jitted_search(
    np.asarray(log_table, np.float32),
    np.asarray(bias, np.float32),
    np.asarray(max_lengths, np.int32),
    _packed(terms),
    beam=beam,
    alpha=alpha,
    style=style,
    nbest=nbest,
    width=width or int(max(max_lengths)),
  )


def _chain(seed):
  rng = np.random.default_rng(seed)
  log_table = rng.normal(scale=2.0, size=(V, V, V))
  log_table[:, :, EOS_ID] += 1.0
  return log_table, rng.normal(scale=1.0, size=(4, V))


@pytest.mark.parametrize("style", choices.BEAM_STYLES)
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_wide_beam_is_the_best_hypothesis_holding_every_term(alpha, style):
  """With a beam wider than every prefix nothing is pruned: the result is the best normalised
  sequence, among all that contain each term, per sentence (each its own length and terms)."""
  log_table, bias = _chain(1)
  terms = [[[C, D]], [[B], [D, D]], [[A, A, A]], []]
  max_lengths = np.array([4, 5, 4, 3])
  result = jax.device_get(
    _search(log_table, bias, max_lengths, terms, beam=4**3, alpha=alpha, style=style)
  )
  for b in range(4):
    normalized, tokens = _brute_force(log_table, bias[b], int(max_lengths[b]), alpha, terms[b])
    n = len(tokens)
    np.testing.assert_array_equal(result.tokens[b, :n], tokens)
    assert int(result.lengths[b]) == n
    np.testing.assert_allclose(result.normalized_scores[b], normalized, rtol=1e-4)


@pytest.mark.parametrize("style", choices.BEAM_STYLES)
@pytest.mark.parametrize("nbest", [1, 2])
def test_a_sentence_without_terms_is_searched_as_by_plain_beam_search(style, nbest):
  log_table, bias = _chain(2)
  max_lengths = np.array([6, 4, 7, 5])
  # Jitted as `_search` is, so both sides are one program each and may be compared exactly.
  plain = jax.jit(
    lambda table, rows_bias, lengths: beam_search.beam_search(
      _trigram_step(table),
      _trigram_cache(rows_bias, 3),
      lengths,
      beam_size=3,
      alpha=0.6,
      max_decode_len=8,
      style=style,
      nbest=nbest,
    )
  )(np.asarray(log_table, np.float32), np.asarray(bias, np.float32), max_lengths.astype(np.int32))
  ours = _search(
    log_table,
    bias,
    max_lengths,
    [[], [], [], []],
    beam=3,
    alpha=0.6,
    style=style,
    nbest=nbest,
    width=8,
  )
  for field in ("tokens", "lengths", "scores", "normalized_scores"):
    np.testing.assert_array_equal(getattr(ours, field), getattr(plain, field), err_msg=field)


@pytest.mark.parametrize("style", choices.BEAM_STYLES)
def test_every_output_holds_its_terms_at_the_narrowest_beam(style):
  """Beam = the most pieces + 1 (what the translator widens to), many random chains and terms,
  n-best lists included: every finished hypothesis holds all of its sentence's terms. The
  searches share one width (each sentence's own cap is `max_lengths`), so only the beam sizes
  compile apart."""
  rng = np.random.default_rng(3)
  width = 2 * 2 + 3  # the most pieces (2 terms of 2) + the most room beyond them
  for seed in range(6):
    log_table, bias = _chain(10 + seed)
    terms = [
      [list(rng.choice([A, B, C, D], size=int(rng.integers(1, 3)))) for _ in range(int(k))]
      for k in rng.integers(1, 3, size=4)
    ]
    pieces = max(sum(len(t) for t in row) for row in terms)
    max_lengths = np.array([pieces + int(x) for x in rng.integers(0, 4, size=4)])
    assert max_lengths.max() <= width
    result = jax.device_get(
      _search(
        log_table,
        bias,
        max_lengths,
        terms,
        beam=pieces + 1,
        alpha=0.6,
        style=style,
        nbest=2,
        width=width,
      )
    )
    for b in range(4):
      for rank in range(2):
        n = int(result.lengths[b, rank])
        tokens = [int(t) for t in result.tokens[b, rank, :n]]
        assert n > 0, (seed, b, rank)
        assert all(_contains(tokens, t) for t in terms[b]), (seed, b, rank, tokens, terms[b])
