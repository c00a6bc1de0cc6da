"""Beam search over a step function, the whole loop on device.

It follows the paper (Sec. 6.1): beam 4, lp(len) = ((5 + len) / 6)^alpha with alpha 0.6 (Wu et
al. 2016), each sentence's own maximum length, early stopping; two `style`s:

- "t2t", tensor2tensor's beam search, which produced the paper's numbers: every step keeps the K
  best *live* extensions out of the top 2K candidates (one ending in EOS cannot take a live slot,
  and at most K of the 2K end in EOS, so K stay live), and the K best finished hypotheses by
  normalised score in a separate pool. It stops once the best finished hypothesis beats the best
  live one granted the most favourable length penalty (t2t's `stop_early`). With alpha > 0 its beam
  1 keeps searching past greedy's EOS, so decode.py runs greedy search for beam size 1 instead.
- "shrinking", the textbook beam (Jurafsky & Martin; Marian does the same): each sentence has K
  slots; a hypothesis that ends in EOS (or reaches the sentence's maximum length) is finished and
  keeps its slot for good, so the live beam shrinks. Beam 1 *is* greedy search, for any alpha (the
  tests check it token for token). It stops once the best live hypothesis, granted the most
  favourable penalty, cannot beat the worst finished one.

In both, a live hypothesis's most favourable penalty is at its maximum length (log-probabilities
only fall). Finished ones rank by score / lp(len), returned with both scores. An n-best list
(`nbest` > 1) keeps searching until n have finished and no live one can overtake them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from flaxformer_nmt.config.choices import BEAM_STYLES
from flaxformer_nmt.decoding.search import (
  NEG_INF,
  Array,
  Cache,
  SearchResult,
  StepFn,
  length_penalty,
  next_token_log_probs,
)
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID

S = TypeVar("S")  # a search's loop state: a BeamState, or one holding it


class BeamState(NamedTuple):
  """The beam-search loop's carried state: live hypotheses, the finished pool, the cache."""

  step: Array  # []
  live_tokens: Array  # [batch, beam, max_decode_len]
  live_scores: Array  # [batch, beam] log-probability; -inf: empty slot
  fin_tokens: Array  # [batch, beam, max_decode_len]
  fin_scores: Array  # [batch, beam] model score of finished hypotheses
  fin_normalized: Array  # [batch, beam] score / lp(len); -inf: empty slot
  fin_lengths: Array  # [batch, beam]
  done: Array  # [batch] bool
  cache: Cache  # leaves [batch * beam, ...] or shared scalars


class _Rules(NamedTuple):
  """What every step of one beam search reads besides its state."""

  alpha: float
  max_lengths: Array  # [batch] each sentence's maximum output length
  best_penalty: Array  # [batch] lp(max_lengths): the most favourable penalty a live one can get
  nbest: int = 1  # how many finished hypotheses must be final before a sentence stops


class _Extensions(NamedTuple):
  """The n chosen one-token extensions of a step, [batch, n] each."""

  scores: Array  # log-probability of the extended hypothesis
  beam_index: Array  # which live hypothesis each extends
  tokens: Array  # [batch, n, max_decode_len] the extended token sequences
  finishing: Array  # bool: a valid extension that ends in EOS or reaches its sentence's cap
  valid: Array  # bool: a real candidate (finite score) of a sentence still searching


def _gather_beams(x: Array, beam_index: Array) -> Array:
  """x: [batch, beam, ...], beam_index: [batch, k] -> [batch, k, ...]."""
  return x[jnp.arange(x.shape[0])[:, None], beam_index]


def _gather_cache(cache: Cache, beam_index: Array) -> Cache:
  """Reorders every per-row cache leaf to follow the chosen beams; shared scalars stay."""
  batch, beam = beam_index.shape

  def gather(leaf: Array) -> Array:
    if leaf.ndim == 0:
      return leaf  # a step counter shared by all rows
    unflat = leaf.reshape(batch, beam, *leaf.shape[1:])  # [batch, beam, ...]
    return _gather_beams(unflat, beam_index).reshape(leaf.shape)

  return jax.tree.map(gather, cache)


def _initial_beam_state(
  cache: Cache, max_lengths: Array, beam_size: int, max_decode_len: int
) -> BeamState:
  """One live hypothesis (the empty prefix) per sentence, so step 0 picks distinct tokens."""
  batch, k = max_lengths.shape[0], beam_size
  empty = jnp.full((batch, k), NEG_INF, jnp.float32)
  buffers = jnp.full((batch, k, max_decode_len), PAD_ID, jnp.int32)
  return BeamState(
    step=jnp.array(0, jnp.int32),
    live_tokens=buffers,
    live_scores=empty.at[:, 0].set(0.0),
    fin_tokens=buffers,
    fin_scores=empty,
    fin_normalized=empty,
    fin_lengths=jnp.zeros((batch, k), jnp.int32),
    done=max_lengths <= 0,
    cache=cache,
  )


def _candidates(step_fn: StepFn, s: BeamState) -> tuple[Array, Cache]:
  """Every one-token extension's score, [batch, beam * vocab], and the stepped cache."""
  batch, k = s.live_scores.shape
  last = lax.dynamic_index_in_dim(s.live_tokens, s.step - 1, axis=2, keepdims=False)
  last = jnp.where(s.step == 0, PAD_ID, last)  # [batch, beam]; PAD starts every sentence
  logits, cache = step_fn(s.cache, last.reshape(batch * k, 1))
  logp = next_token_log_probs(logits)  # [batch * beam, vocab]
  candidates = s.live_scores[:, :, None] + logp.reshape(batch, k, -1)  # [batch, beam, vocab]
  return candidates.reshape(batch, -1), cache


def _extend(s: BeamState, flat: Array, n: int, rules: _Rules) -> _Extensions:
  """The n best of the candidates `flat` [batch, beam * vocab], as extended hypotheses."""
  vocab = flat.shape[1] // s.live_scores.shape[1]
  scores, top_index = lax.top_k(flat, n)  # [batch, n]
  beam_index = top_index // vocab
  token = (top_index % vocab).astype(jnp.int32)
  tokens = _gather_beams(s.live_tokens, beam_index)  # [batch, n, max_decode_len]
  tokens = lax.dynamic_update_slice(tokens, token[:, :, None], (0, 0, s.step))
  valid = jnp.isfinite(scores) & ~s.done[:, None]
  at_cap = (s.step + 1 >= rules.max_lengths)[:, None]  # [batch, 1]
  finishing = valid & ((token == EOS_ID) | at_cap)
  return _Extensions(scores, beam_index, tokens, finishing, valid)


def _merge_finished(
  s: BeamState, ext: _Extensions, alpha: float
) -> tuple[Array, Array, Array, Array]:
  """The K best (by normalised score) of the finished pool and the extensions finishing now (of
  length step + 1): tokens, scores, normalised scores, lengths, [batch, beam, ...], best first."""
  k = s.fin_scores.shape[1]
  length = s.step + 1
  new_normalized = jnp.where(ext.finishing, ext.scores / length_penalty(length, alpha), NEG_INF)
  pool_normalized = jnp.concatenate([s.fin_normalized, new_normalized], axis=1)  # [batch, K + n]
  fin_normalized, keep = lax.top_k(pool_normalized, k)  # [batch, beam]
  fin_tokens = _gather_beams(jnp.concatenate([s.fin_tokens, ext.tokens], axis=1), keep)
  fin_scores = _gather_beams(jnp.concatenate([s.fin_scores, ext.scores], axis=1), keep)
  new_lengths = jnp.full(ext.scores.shape, length, jnp.int32)
  fin_lengths = _gather_beams(jnp.concatenate([s.fin_lengths, new_lengths], axis=1), keep)
  return fin_tokens, fin_scores, fin_normalized, fin_lengths


def shrinking_keep(
  s: BeamState, ext: _Extensions, rules: _Rules
) -> tuple[_Extensions, Array, tuple[Array, Array, Array, Array]]:
  """The shrinking beam's rule on K ranked extensions (plain or constrained): as many kept as
  there are open slots (K minus the finished), the finishing ones merged into the pool (at most K
  ever finish: nothing falls out). (extensions, live scores [batch, beam], finished pool)."""
  k = s.live_scores.shape[1]
  open_slots = k - jnp.sum(jnp.isfinite(s.fin_normalized), axis=1)  # [batch]
  valid = ext.valid & (jnp.arange(k)[None, :] < open_slots[:, None])  # [batch, beam]
  ext = ext._replace(valid=valid, finishing=ext.finishing & valid)
  live_scores = jnp.where(valid & ~ext.finishing, ext.scores, NEG_INF)  # [batch, beam]
  return ext, live_scores, _merge_finished(s, ext, rules.alpha)


def _best_live(live_scores: Array, rules: _Rules) -> Array:
  """[batch]: the best live score at its most favourable penalty; -inf when none is live."""
  return jnp.max(live_scores, axis=1) / rules.best_penalty


def shrinking_done(s: BeamState, live_scores: Array, fin_normalized: Array, rules: _Rules) -> Array:
  """The shrinking beam's early stop: no live hypothesis, or (with at least `nbest` finished)
  none that can still beat the worst finished one, so the finished ranks are final."""
  finished = jnp.isfinite(fin_normalized)  # [batch, beam]
  worst_finished = jnp.min(jnp.where(finished, fin_normalized, jnp.inf), axis=1)  # [batch]
  done = s.done | ~jnp.any(jnp.isfinite(live_scores), axis=1)
  enough = jnp.sum(finished, axis=1) >= rules.nbest
  return done | (enough & (_best_live(live_scores, rules) <= worst_finished))


def t2t_done(s: BeamState, live_scores: Array, fin_normalized: Array, rules: _Rules) -> Array:
  """t2t's stop_early: none live, or the best finished beats the best live one at its most
  favourable length (for an n-best list, the n-th best finished does)."""
  best_live = _best_live(live_scores, rules)  # [batch]
  return s.done | ~jnp.isfinite(best_live) | (fin_normalized[:, rules.nbest - 1] >= best_live)


def _shrinking_step(s: BeamState, flat: Array, cache: Cache, rules: _Rules) -> BeamState:
  """The shrinking beam: the K best extensions, as many kept as there are open slots."""
  ext, live_scores, fin = shrinking_keep(s, _extend(s, flat, s.live_scores.shape[1], rules), rules)
  done = shrinking_done(s, live_scores, fin[2], rules)
  cache = _gather_cache(cache, ext.beam_index)
  return BeamState(s.step + 1, ext.tokens, live_scores, *fin, done, cache)


def _t2t_step(s: BeamState, flat: Array, cache: Cache, rules: _Rules) -> BeamState:
  """tensor2tensor's beam: K live ones out of the 2K best, the K best finished in a pool."""
  k = s.live_scores.shape[1]
  ext = _extend(s, flat, 2 * k, rules)  # [batch, 2K]
  # t2t's grow_alive: the K best of the 2K that did not finish.
  alive = jnp.where(ext.valid & ~ext.finishing, ext.scores, NEG_INF)
  live_scores, pick = lax.top_k(alive, k)  # [batch, beam]
  live_tokens = _gather_beams(ext.tokens, pick)  # [batch, beam, max_decode_len]
  # t2t's grow_finished: the K best of the old pool and all 2K that finished now.
  fin = _merge_finished(s, ext, rules.alpha)
  done = t2t_done(s, live_scores, fin[2], rules)
  cache = _gather_cache(cache, _gather_beams(ext.beam_index, pick))
  return BeamState(s.step + 1, live_tokens, live_scores, *fin, done, cache)


def search_rules(
  style: str, nbest: int, beam_size: int, alpha: float, max_lengths: Array
) -> _Rules:
  """The rules a beam search (plain or constrained) runs by; ValueError for a style or n-best
  list it cannot run."""
  if style not in BEAM_STYLES:
    raise ValueError(f"Unknown beam style {style!r}; choose one of {list(BEAM_STYLES)}.")
  if not 1 <= nbest <= beam_size:
    raise ValueError(f"An n-best list of {nbest} needs 1 <= n <= the beam size {beam_size}.")
  return _Rules(alpha, max_lengths, length_penalty(max_lengths, alpha), nbest)


def search_loop(
  step_fn: StepFn,
  init: S,
  max_lengths: Array,
  update: Callable[[S, Array, Cache], S],
  beam_of: Callable[[S], BeamState] = lambda s: s,
) -> S:
  """The one beam loop, plain and constrained: until every sentence is done or the longest may
  be no longer, the model scores each live hypothesis's next pieces (`_candidates`: [batch, beam
  * vocab] and the stepped cache), and `update` makes the next state of them. `beam_of` finds
  the BeamState inside a larger state (the constrained search's)."""
  loop_len = jnp.max(max_lengths)

  def cond(s: S) -> Array:
    b = beam_of(s)
    return (b.step < loop_len) & ~jnp.all(b.done)

  def body(s: S) -> S:
    flat, stepped = _candidates(step_fn, beam_of(s))
    return update(s, flat, stepped)

  return lax.while_loop(cond, body, init)


def run_beam_search(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  *,
  beam_size: int,
  alpha: float,
  max_decode_len: int,
  style: str = "shrinking",
  nbest: int = 1,
) -> BeamState:
  """`beam_search`'s loop; returns its final state (live and finished pools; for the tests)."""
  rules = search_rules(style, nbest, beam_size, alpha, max_lengths)
  update = _t2t_step if style == "t2t" else _shrinking_step
  init = _initial_beam_state(cache, max_lengths, beam_size, max_decode_len)
  return search_loop(step_fn, init, max_lengths, lambda s, flat, c: update(s, flat, c, rules))


def beam_search(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  *,
  beam_size: int,
  alpha: float,
  max_decode_len: int,
  style: str = "shrinking",
  nbest: int = 1,
) -> SearchResult:
  """Beam search with length penalty and early stopping, in either style (module docstring).

  Args:
    step_fn: the decoder on `batch * beam_size` rows, sentence-major (row = b * beam + k).
    cache: its initial cache for those rows.
    max_lengths: [batch] each sentence's maximum output length (0: skip the row).
    beam_size: K.
    alpha: length-penalty exponent.
    max_decode_len: static size of the output buffers (>= max(max_lengths)).
    style: "shrinking" or "t2t".
    nbest: n <= K. 1: the best hypothesis, fields [batch, ...]. Above 1: the n best finished
      hypotheses, best first, fields [batch, n, ...]; the search then runs until n have finished
      and no live one can overtake them.
  """
  final = run_beam_search(
    step_fn,
    cache,
    max_lengths,
    beam_size=beam_size,
    alpha=alpha,
    max_decode_len=max_decode_len,
    style=style,
    nbest=nbest,
  )
  return finished_result(final, nbest)


def finished_result(final: BeamState, nbest: int) -> SearchResult:
  """The n best of a final state's finished pool as a SearchResult ([batch, ...] for n = 1)."""
  # The pool is sorted best first (top_k). A rank with no finished hypothesis (only a skipped
  # filler row has none) returns an empty output with score 0.
  found = jnp.isfinite(final.fin_normalized[:, :nbest])  # [batch, n]
  result = SearchResult(
    tokens=jnp.where(found[:, :, None], final.fin_tokens[:, :nbest], PAD_ID),
    lengths=jnp.where(found, final.fin_lengths[:, :nbest], 0),
    scores=jnp.where(found, final.fin_scores[:, :nbest], 0.0),
    normalized_scores=jnp.where(found, final.fin_normalized[:, :nbest], 0.0),
    num_steps=final.step,
  )
  if nbest > 1:
    return result
  return result._replace(**{f: getattr(result, f)[:, 0] for f in SearchResult._fields[:4]})
