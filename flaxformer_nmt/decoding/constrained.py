"""Beam search that must output given terms: dynamic beam allocation, the whole loop on device.

Post & Vilar (2018), vectorised as Hu et al. (2019) and fairseq's `--constraints`: every step
considers, besides the best extensions, each hypothesis's best token and every token that would
advance one of its unmet terms; each candidate's *bank* is the number of term pieces it has met
(constraints.py tracks them); the beam is then filled bank by bank in turns, the most advanced
bank first, each bank's candidates best first (the *stripes* of fairseq's implementation). So a
hypothesis that has met more terms is kept even when its score is lower, and the ones that met
fewer still have slots to catch up from.

Two rules make every finished hypothesis meet all its terms: EOS is blocked while a term is
unmet, and a candidate that could no longer fit its unmet pieces before the sentence's maximum
length is dropped (the caller makes sure that the terms fit at the start: constraints.encode_terms).

Both beam styles of beam_search.py run on it. A line with no terms is searched exactly as by
beam_search.py (one bank, so the turns are score order), which the tests check; the translator
sends such lines to the plain search all the same.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from flaxformer_nmt.decoding import constraints as constraints_lib
from flaxformer_nmt.decoding.beam_search import (
  BeamState,
  _Extensions,
  _gather_beams,
  _gather_cache,
  _initial_beam_state,
  _merge_finished,
  _Rules,
  finished_result,
  search_loop,
  search_rules,
  shrinking_done,
  shrinking_keep,
  t2t_done,
)
from flaxformer_nmt.decoding.search import (
  NEG_INF,
  Array,
  Cache,
  SearchResult,
  StepFn,
)
from flaxformer_nmt.model.tokens import EOS_ID

Constraints = constraints_lib.Constraints


class ConstrainedState(NamedTuple):
  beam: BeamState
  progress: Array  # [batch, beam, T] pieces of each term the live hypothesis has met


class _Ranked(NamedTuple):
  """The step's candidates in the order the beam is filled: [batch, n] (tokens [batch, n, len])."""

  ext: _Extensions
  progress: Array  # [batch, n, T]


def _candidate_set(
  flat: Array, s: ConstrainedState, c: Constraints, width: int
) -> tuple[Array, Array]:
  """The step's candidates, best first: the `width` best extensions, each hypothesis's best
  token, and every token advancing one of its unmet terms (EOS blocked while a term is unmet).
  Returns (scores, indices into `flat`'s beam * vocab), [batch, width + beam + beam * T] each; a
  repeat of an earlier candidate, or a term already met, has score -inf.

  An explicit list, not a mask over the vocabulary: one top-k over `flat` as the plain search
  does, a gather, and a sort of a few dozen candidates per sentence."""
  batch, k = s.beam.live_scores.shape
  vocab = flat.shape[1] // k
  scores = flat.reshape(batch, k, vocab)
  unmet = c.totals[:, None] - constraints_lib.met(c, s.progress)  # [batch, beam]
  scores = scores.at[:, :, EOS_ID].set(jnp.where(unmet > 0, NEG_INF, scores[:, :, EOS_ID]))
  flat = scores.reshape(batch, -1)
  _, top = lax.top_k(flat, width)  # [batch, width]
  offsets = jnp.arange(k)[None, :] * vocab  # [1, beam]
  best = offsets + jnp.argmax(scores, axis=-1)  # [batch, beam]
  pieces = constraints_lib.next_pieces(c, s.progress)  # [batch, beam, T]; -1: met
  advancing = jnp.where(pieces >= 0, offsets[:, :, None] + pieces, -1).reshape(batch, -1)
  index = jnp.concatenate([top, best, advancing], axis=1).astype(jnp.int32)  # [batch, N]
  n = index.shape[1]
  earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]  # [N (i), N (j)]: j before i
  repeat = jnp.any((index[:, :, None] == index[:, None, :]) & earlier[None], axis=-1)
  picked = jnp.take_along_axis(flat, jnp.maximum(index, 0), axis=1)  # [batch, N]
  picked = jnp.where((index >= 0) & ~repeat, picked, NEG_INF)
  order = jnp.argsort(-picked, axis=1, stable=True)  # best first; the top-k's own order kept
  return jnp.take_along_axis(picked, order, axis=1), jnp.take_along_axis(index, order, axis=1)


def _ranked(
  s: ConstrainedState, candidates: tuple[Array, Array], c: Constraints, rules: _Rules, vocab: int
) -> _Ranked:
  """The candidates (`_candidate_set`) as extensions, valid ones first in dynamic beam
  allocation's order: rank within the bank, then the bank, most pieces met first."""
  b = s.beam
  scores, index = candidates  # [batch, n], best first
  n = scores.shape[1]
  beam_index = index // vocab
  token = (index % vocab).astype(jnp.int32)
  progress = constraints_lib.advance(c, _gather_beams(s.progress, beam_index), token)
  unmet = c.totals[:, None] - constraints_lib.met(c, progress)  # [batch, n]
  left = (rules.max_lengths - (b.step + 1))[:, None]  # tokens the output may still take
  valid = jnp.isfinite(scores) & ~b.done[:, None] & (unmet <= left)
  finishing = valid & ((token == EOS_ID) | (left <= 0))

  # Stripes: candidate i is the r-th valid one of its bank (they come best first).
  bank = c.totals[:, None] - unmet  # [batch, n]
  earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]  # [n (i), n (j)]: j before i
  same = (bank[:, :, None] == bank[:, None, :]) & valid[:, None, :] & earlier[None]
  rank = jnp.sum(same, axis=-1)  # [batch, n]
  most = c.tokens.shape[1] * c.tokens.shape[2]  # static bound on a bank
  key = jnp.where(valid, rank * (most + 1) + (most - bank), n * (most + 1) + most + 1)
  order = jnp.argsort(key, axis=1, stable=True)  # [batch, n]

  def pick(x: Array) -> Array:
    return _gather_beams(x, order)

  tokens = _gather_beams(b.live_tokens, pick(beam_index))  # [batch, n, max_decode_len]
  tokens = lax.dynamic_update_slice(tokens, pick(token)[:, :, None], (0, 0, b.step))
  ext = _Extensions(pick(scores), pick(beam_index), tokens, pick(finishing), pick(valid))
  return _Ranked(ext, pick(progress))


def _first(r: _Ranked, n: int) -> _Ranked:
  ext = _Extensions(*(x[:, :n] for x in r.ext))
  return _Ranked(ext, r.progress[:, :n])


def _shrinking_step(
  s: ConstrainedState,
  candidates: tuple[Array, Array],
  cache: Cache,
  c: Constraints,
  rules: _Rules,
  vocab: int,
) -> ConstrainedState:
  """The shrinking beam (beam_search.py's rule) on the first K in allocation order."""
  b = s.beam
  r = _first(_ranked(s, candidates, c, rules, vocab), b.live_scores.shape[1])
  ext, live_scores, fin = shrinking_keep(b, r.ext, rules)
  done = shrinking_done(b, live_scores, fin[2], rules)
  cache = _gather_cache(cache, ext.beam_index)
  beam = BeamState(b.step + 1, ext.tokens, live_scores, *fin, done, cache)
  return ConstrainedState(beam, r.progress)


def _t2t_step(
  s: ConstrainedState,
  candidates: tuple[Array, Array],
  cache: Cache,
  c: Constraints,
  rules: _Rules,
  vocab: int,
) -> ConstrainedState:
  """tensor2tensor's beam: the first 2K in allocation order; of them the first K that did not
  finish stay live, and the finished ones join the pool."""
  b = s.beam
  k = b.live_scores.shape[1]
  r = _first(_ranked(s, candidates, c, rules, vocab), 2 * k)
  alive = r.ext.valid & ~r.ext.finishing  # [batch, 2K]
  position = jnp.where(alive, jnp.arange(alive.shape[1])[None, :], alive.shape[1])
  _, pick = lax.top_k(-position, k)  # [batch, K]: the first K alive, in order
  live_scores = jnp.where(_gather_beams(alive, pick), _gather_beams(r.ext.scores, pick), NEG_INF)
  fin = _merge_finished(b, r.ext, rules.alpha)
  done = t2t_done(b, live_scores, fin[2], rules)  # beam_search.py's rule
  cache = _gather_cache(cache, _gather_beams(r.ext.beam_index, pick))
  beam = BeamState(b.step + 1, _gather_beams(r.ext.tokens, pick), live_scores, *fin, done, cache)
  return ConstrainedState(beam, _gather_beams(r.progress, pick))


def run_constrained_search(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  c: Constraints,
  *,
  beam_size: int,
  alpha: float,
  max_decode_len: int,
  style: str = "shrinking",
  nbest: int = 1,
) -> ConstrainedState:
  """The loop; returns the final state (for the tests). Arguments as `constrained_search`."""
  rules = search_rules(style, nbest, beam_size, alpha, max_lengths)
  update = _t2t_step if style == "t2t" else _shrinking_step
  k = beam_size

  def step(s: ConstrainedState, flat: Array, stepped: Cache) -> ConstrainedState:
    width = min(2 * k, flat.shape[1])  # flat: [batch, beam * vocab]
    candidates = _candidate_set(flat, s, c, width)
    return update(s, candidates, stepped, c, rules, flat.shape[1] // k)

  beam = _initial_beam_state(cache, max_lengths, beam_size, max_decode_len)
  progress = jnp.zeros((max_lengths.shape[0], beam_size, c.tokens.shape[1]), jnp.int32)
  return search_loop(step_fn, ConstrainedState(beam, progress), max_lengths, step, lambda s: s.beam)


def constrained_search(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  c: Constraints,
  *,
  beam_size: int,
  alpha: float,
  max_decode_len: int,
  style: str = "shrinking",
  nbest: int = 1,
) -> SearchResult:
  """Beam search whose every output meets all of its sentence's terms (`c`); otherwise as
  beam_search.beam_search (same arguments, same result). The beam must be larger than the most
  pieces a sentence has to meet for every bank to get a slot; the translator widens it so."""
  final = run_constrained_search(
    step_fn,
    cache,
    max_lengths,
    c,
    beam_size=beam_size,
    alpha=alpha,
    max_decode_len=max_decode_len,
    style=style,
    nbest=nbest,
  )
  return finished_result(final.beam, nbest)
