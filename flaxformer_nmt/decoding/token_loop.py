"""One hypothesis per row, token by token: greedy search, and the loop that sampling shares.

`token_by_token` runs the cached decoder until every row has ended (EOS or its own maximum
length); how a row picks its next token is the only thing greedy search (the argmax) and sampling
(sampling.py: a draw) say for themselves. The whole loop runs on device (`lax.while_loop`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from flaxformer_nmt.decoding.search import (
  Array,
  Cache,
  SearchResult,
  StepFn,
  length_penalty,
  next_token_log_probs,
)
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID


class _TokenState(NamedTuple):
  step: Array  # []
  last: Array  # [batch] previous token
  tokens: Array  # [batch, max_decode_len]
  scores: Array  # [batch]
  lengths: Array  # [batch]
  done: Array  # [batch] bool
  cache: Cache


# (step, scores [rows], log-probabilities [rows, vocab]) -> (tokens [rows], their new scores [rows])
ChooseFn = Callable[[Array, Array, Array], tuple[Array, Array]]


def token_by_token(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  choose: ChooseFn,
  *,
  max_decode_len: int,
  alpha: float,
) -> SearchResult:
  """One hypothesis per row (greedy search, sampling): `choose` picks each row's next token until
  EOS or the row's `max_lengths` ([rows]; 0 skips the row); `max_decode_len` is the output
  buffer's static size (>= max(max_lengths)); `alpha` serves the normalised score only."""
  rows = max_lengths.shape[0]
  loop_len = jnp.max(max_lengths)  # the loop stops at the longest cap, not at the buffer size

  def cond(s: _TokenState) -> Array:
    return (s.step < loop_len) & ~jnp.all(s.done)

  def body(s: _TokenState) -> _TokenState:
    logits, cache = step_fn(s.cache, s.last[:, None])
    token, new_score = choose(s.step, s.scores, next_token_log_probs(logits))  # [rows] each
    live = ~s.done
    token = jnp.where(live, token, PAD_ID)
    tokens = lax.dynamic_update_slice(s.tokens, token[:, None], (0, s.step))
    scores = jnp.where(live, new_score, s.scores)
    lengths = jnp.where(live, s.step + 1, s.lengths)
    done = s.done | (token == EOS_ID) | (s.step + 1 >= max_lengths)
    return _TokenState(s.step + 1, token, tokens, scores, lengths, done, cache)

  init = _TokenState(
    step=jnp.array(0, jnp.int32),
    last=jnp.full((rows,), PAD_ID, jnp.int32),
    tokens=jnp.full((rows, max_decode_len), PAD_ID, jnp.int32),
    scores=jnp.zeros((rows,), jnp.float32),
    lengths=jnp.zeros((rows,), jnp.int32),
    done=max_lengths <= 0,
    cache=cache,
  )
  final = lax.while_loop(cond, body, init)
  return SearchResult(
    tokens=final.tokens,
    lengths=final.lengths,
    scores=final.scores,
    normalized_scores=final.scores / length_penalty(final.lengths, alpha),
    num_steps=final.step,
  )


def greedy_search(
  step_fn: StepFn, cache: Cache, max_lengths: Array, *, max_decode_len: int, alpha: float
) -> SearchResult:
  """Argmax token at each step until EOS or the sentence's maximum length (see token_by_token;
  `alpha` only for the returned normalised score)."""

  def argmax(step: Array, scores: Array, log_probs: Array) -> tuple[Array, Array]:
    del step
    # argmax of the running score, not of the log-probabilities: the same float sums as beam
    # search's top_k, so beam 1 and greedy agree bit for bit, near-ties included.
    candidates = scores[:, None] + log_probs  # [batch, vocab]
    token = jnp.argmax(candidates, axis=-1).astype(jnp.int32)  # [batch]
    return token, jnp.take_along_axis(candidates, token[:, None], axis=-1)[:, 0]

  return token_by_token(
    step_fn, cache, max_lengths, argmax, max_decode_len=max_decode_len, alpha=alpha
  )
