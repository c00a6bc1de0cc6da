"""Incremental (cached) greedy and beam search, the whole loop on device.

The search is written against a *step function* `(cache, ids [rows, 1]) -> (logits [rows, vocab],
cache)` so it knows nothing of Flax; `model_step_fn` builds one from the Transformer's cached
decoder, and the tests drive the same search with small hand-made distributions.

Beam search follows the paper (Sec. 6.1): beam 4, length penalty lp(len) = ((5 + len) / 6)^alpha
with alpha = 0.6 (Wu et al. 2016), maximum output length = input length + 50, and early stopping.
Two styles (`SearchConfig.style`, `config.decode.beam_style`):

- "t2t", tensor2tensor's beam search, which produced the paper's numbers: every step keeps the K
  best *live* extensions out of the top 2K candidates (one ending in EOS cannot take a live slot,
  and at most K of the 2K end in EOS, so K stay live), and the K best finished hypotheses by
  normalised score in a separate pool. It stops once the best finished hypothesis beats the best
  live one granted the most favourable length penalty (t2t's `stop_early`). With alpha > 0 its beam
  1 keeps searching past greedy's EOS, so beam size 1 runs greedy search instead.
- "shrinking", the textbook beam (Jurafsky & Martin; Marian does the same): each sentence has K
  slots; a hypothesis that ends in EOS (or reaches the sentence's maximum length) is finished and
  keeps its slot for good, so the live beam shrinks. Beam 1 *is* greedy search, for any alpha (the
  tests check it token for token). It stops once the best live hypothesis, granted the most
  favourable penalty, cannot beat the worst finished one.

In both, the most favourable penalty of a live hypothesis is the one at its maximum length:
log-probabilities only fall as it grows. Finished hypotheses are ranked by score / lp(len); the best
is returned with its model score (sum of log-probabilities) and its normalised score, so beam and
greedy can be compared on the objective the search optimises.

Output tokens are ids with EOS, then PAD. A hypothesis cut at the maximum length has no EOS (as in
t2t and flax's wmt example). PAD (id 0) is never generated: it is the decoder's start symbol and
the padding of every output.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from jax import lax

from flaxformer_nmt.config_lib import BEAM_STYLES
from flaxformer_nmt.model import Transformer, init_decode_cache
from flaxformer_nmt.tokenizer import EOS_ID, PAD_ID

Array = jax.Array
Cache = Any  # a pytree; leaves are [rows, ...] or scalars shared by all rows
# (cache, ids [rows, 1]) -> (logits [rows, vocab], new cache)
StepFn = Callable[[Cache, Array], tuple[Array, Cache]]

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """Static settings of one search (hashable: jit compiles one program per distinct value).

  Attributes:
    beam_size: hypotheses per sentence; 1 = greedy.
    alpha: length-penalty exponent; 0 ranks by plain log-probability.
    max_len_offset: a sentence's output has at most (its source length + this) tokens, EOS
      included, and never more than the model's `max_len`.
    allow_eos: False forbids EOS so every search runs the full length (benchmarks only).
    style: "shrinking" or "t2t" (module docstring).
  """

  beam_size: int = 4
  alpha: float = 0.6
  max_len_offset: int = 50
  allow_eos: bool = True
  style: str = "shrinking"

  def __post_init__(self) -> None:
    if self.style not in BEAM_STYLES:
      raise ValueError(f"Unknown beam style {self.style!r}; choose one of {list(BEAM_STYLES)}.")

  @classmethod
  def from_config(
    cls, decode: ml_collections.ConfigDict, beam_size: int | None = None
  ) -> SearchConfig:
    """From `config.decode`; `beam_size` overrides it (e.g. greedy dev BLEU during training)."""
    return cls(
      beam_size=int(decode.beam_size if beam_size is None else beam_size),
      alpha=float(decode.alpha),
      max_len_offset=int(decode.max_len_offset),
      style=str(decode.get("beam_style", "shrinking")),
    )


class SearchResult(NamedTuple):
  """Best hypothesis per sentence."""

  tokens: Array  # [batch, max_decode_len] int32: ids, EOS, then PAD
  lengths: Array  # [batch] int32: tokens including EOS
  scores: Array  # [batch] float32: sum of the tokens' log-probabilities (the model score)
  normalized_scores: Array  # [batch] float32: scores / length_penalty(lengths)
  num_steps: Array  # [] int32: decoder steps the loop ran (early stopping shows here)


# ------------------------------------------------------------------------------------------------
# The rules.


def length_penalty(length: Array, alpha: float) -> Array:
  """GNMT's lp(len) = ((5 + len) / 6)^alpha; lp(1) = 1, and alpha = 0 gives 1 everywhere."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def source_lengths(inputs: Array) -> Array:
  """Non-padding tokens per row (EOS included). inputs: [batch, src_len] -> [batch]."""
  return jnp.sum(inputs != PAD_ID, axis=-1).astype(jnp.int32)


def max_output_lengths(inputs: Array, max_len_offset: int, max_decode_len: int) -> Array:
  """Each sentence's own cap: its source length + offset, at most `max_decode_len`.

  A row that is all padding (a filler row completing a batch) gets 0: it is finished before the
  first step, so it never keeps the loop running.
  """
  src_len = source_lengths(inputs)  # [batch]
  return jnp.where(src_len > 0, jnp.minimum(src_len + max_len_offset, max_decode_len), 0)


def decode_length_bound(src_len: int, max_len_offset: int, model_max_len: int | None) -> int:
  """Static length of output buffers and caches for a batch padded to `src_len`."""
  bound = src_len + max_len_offset
  return bound if model_max_len is None else min(bound, model_max_len)


def log_softmax(logits: Array) -> Array:
  """log_softmax over the last axis, written out: [rows, vocab] -> [rows, vocab].

  The same arithmetic as jax.nn.log_softmax (shift by the max, log of the sum of exponentials),
  but XLA:CPU fuses jax.nn.log_softmax's max-reduction into the output-projection product that
  feeds it, and that fused kernel ran 2.5x slower than the product alone (base model, 128 rows x
  37,000: 90-103 ms against 35-38 ms for this form, measured in one process). Per decoder step,
  that was 40% of base-model beam search.
  """
  m = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))  # [rows, 1]
  return logits - (m + jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1, keepdims=True)))


def _log_probs(logits: Array, allow_eos: bool) -> Array:
  """Next-token log-probabilities with PAD (and EOS, if asked) made impossible."""
  logp = log_softmax(logits.astype(jnp.float32))  # [rows, vocab]
  logp = logp.at[:, PAD_ID].set(NEG_INF)
  if not allow_eos:
    logp = logp.at[:, EOS_ID].set(NEG_INF)
  return logp


# ------------------------------------------------------------------------------------------------
# Greedy search.


class _GreedyState(NamedTuple):
  step: Array  # []
  last: Array  # [batch] previous token
  tokens: Array  # [batch, max_decode_len]
  scores: Array  # [batch]
  lengths: Array  # [batch]
  done: Array  # [batch] bool
  cache: Cache


def greedy_search(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  *,
  max_decode_len: int,
  alpha: float,
  allow_eos: bool = True,
) -> SearchResult:
  """Argmax token at each step until EOS or the sentence's maximum length.

  Args:
    step_fn: the decoder, one token per row per call.
    cache: its initial cache for `batch` rows.
    max_lengths: [batch] each sentence's maximum output length (0: skip the row).
    max_decode_len: static size of the output buffer (>= max(max_lengths)).
    alpha: only for the returned normalised score.
    allow_eos: False forbids EOS (fixed-length runs for benchmarks).
  """
  batch = max_lengths.shape[0]
  loop_len = jnp.max(max_lengths)  # the loop stops at the longest cap, not at the buffer size

  def cond(s: _GreedyState) -> Array:
    return (s.step < loop_len) & ~jnp.all(s.done)

  def body(s: _GreedyState) -> _GreedyState:
    logits, cache = step_fn(s.cache, s.last[:, None])
    logp = _log_probs(logits, allow_eos)  # [batch, vocab]
    # argmax of the running score, not of logp: the same float sums as beam search's top_k, so
    # beam 1 and greedy agree bit for bit, near-ties included.
    candidates = s.scores[:, None] + logp  # [batch, vocab]
    token = jnp.argmax(candidates, axis=-1).astype(jnp.int32)  # [batch]
    new_score = jnp.take_along_axis(candidates, token[:, None], axis=-1)[:, 0]
    live = ~s.done
    token = jnp.where(live, token, PAD_ID)
    tokens = lax.dynamic_update_slice(s.tokens, token[:, None], (0, s.step))
    scores = jnp.where(live, new_score, s.scores)
    lengths = jnp.where(live, s.step + 1, s.lengths)
    done = s.done | (token == EOS_ID) | (s.step + 1 >= max_lengths)
    return _GreedyState(s.step + 1, token, tokens, scores, lengths, done, cache)

  init = _GreedyState(
    step=jnp.array(0, jnp.int32),
    last=jnp.full((batch,), PAD_ID, jnp.int32),
    tokens=jnp.full((batch, max_decode_len), PAD_ID, jnp.int32),
    scores=jnp.zeros((batch,), jnp.float32),
    lengths=jnp.zeros((batch,), jnp.int32),
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


# ------------------------------------------------------------------------------------------------
# Beam search.


class _BeamState(NamedTuple):
  step: Array  # []
  live_tokens: Array  # [batch, beam, max_decode_len]
  live_scores: Array  # [batch, beam] log-probability; -inf: empty slot
  fin_tokens: Array  # [batch, beam, max_decode_len]
  fin_scores: Array  # [batch, beam] model score of finished hypotheses
  fin_normalized: Array  # [batch, beam] score / lp(len); -inf: empty slot
  fin_lengths: Array  # [batch, beam]
  done: Array  # [batch] bool
  cache: Cache  # leaves [batch * beam, ...] or shared scalars


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


def _merge_finished(
  s: _BeamState,
  tokens: Array,
  scores: Array,
  finishing: Array,
  length: Array,
  alpha: float,
) -> tuple[Array, Array, Array, Array]:
  """The K best (by normalised score) of the finished pool and the hypotheses finishing now.

  tokens: [batch, n, max_decode_len], scores and finishing: [batch, n] for the n candidates of
  this step (all of length `length`). Returns the new pool's tokens, scores, normalised scores and
  lengths, sorted best first.
  """
  k = s.fin_scores.shape[1]
  new_normalized = jnp.where(finishing, scores / length_penalty(length, alpha), NEG_INF)
  pool_normalized = jnp.concatenate([s.fin_normalized, new_normalized], axis=1)  # [batch, K + n]
  fin_normalized, keep = lax.top_k(pool_normalized, k)  # [batch, beam]
  fin_tokens = _gather_beams(jnp.concatenate([s.fin_tokens, tokens], axis=1), keep)
  fin_scores = _gather_beams(jnp.concatenate([s.fin_scores, scores], axis=1), keep)
  new_lengths = jnp.full(scores.shape, length, jnp.int32)
  fin_lengths = _gather_beams(jnp.concatenate([s.fin_lengths, new_lengths], axis=1), keep)
  return fin_tokens, fin_scores, fin_normalized, fin_lengths


def run_beam_search(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  *,
  beam_size: int,
  alpha: float,
  max_decode_len: int,
  allow_eos: bool = True,
  style: str = "shrinking",
) -> _BeamState:
  """`beam_search`'s loop; returns its final state (live and finished pools; for the tests)."""
  if style not in BEAM_STYLES:
    raise ValueError(f"Unknown beam style {style!r}; choose one of {list(BEAM_STYLES)}.")
  batch, k = max_lengths.shape[0], beam_size
  loop_len = jnp.max(max_lengths)
  rank = jnp.arange(k)[None, :]  # [1, beam]
  # The most favourable penalty a live hypothesis of sentence b can still get.
  best_penalty = length_penalty(max_lengths, alpha)  # [batch]

  def cond(s: _BeamState) -> Array:
    return (s.step < loop_len) & ~jnp.all(s.done)

  def candidates_of(s: _BeamState) -> tuple[Array, Cache]:
    """Every one-token extension's score: [batch, beam * vocab], and the stepped cache."""
    last = lax.dynamic_index_in_dim(s.live_tokens, s.step - 1, axis=2, keepdims=False)
    last = jnp.where(s.step == 0, PAD_ID, last)  # [batch, beam]; PAD starts every sentence
    logits, cache = step_fn(s.cache, last.reshape(batch * k, 1))
    logp = _log_probs(logits, allow_eos)  # [batch * beam, vocab]
    candidates = s.live_scores[:, :, None] + logp.reshape(batch, k, -1)  # [batch, beam, vocab]
    return candidates.reshape(batch, -1), cache

  def extend(s: _BeamState, top_index: Array, vocab: int) -> tuple[Array, Array, Array]:
    """Source beam, new token and new token sequence of each chosen candidate [batch, n]."""
    beam_index = top_index // vocab  # which live hypothesis each extends
    token = (top_index % vocab).astype(jnp.int32)
    tokens = _gather_beams(s.live_tokens, beam_index)  # [batch, n, max_decode_len]
    tokens = lax.dynamic_update_slice(tokens, token[:, :, None], (0, 0, s.step))
    return beam_index, token, tokens

  def shrinking_body(s: _BeamState) -> _BeamState:
    flat, cache = candidates_of(s)
    vocab = flat.shape[1] // k
    top_scores, top_index = lax.top_k(flat, k)  # [batch, beam]
    beam_index, token, tokens = extend(s, top_index, vocab)
    # Only as many extensions as there are open slots (K minus the finished ones) are kept.
    open_slots = k - jnp.sum(jnp.isfinite(s.fin_normalized), axis=1)  # [batch]
    valid = (rank < open_slots[:, None]) & jnp.isfinite(top_scores) & ~s.done[:, None]
    length = s.step + 1
    finishing = valid & ((token == EOS_ID) | (length >= max_lengths)[:, None])  # [batch, beam]
    live_scores = jnp.where(valid & ~finishing, top_scores, NEG_INF)  # [batch, beam]
    # At most K ever finish, so nothing falls out of the pool.
    fin = _merge_finished(s, tokens, top_scores, finishing, length, alpha)

    # Early stopping: no live hypothesis, or none that can still beat the worst finished one.
    best_live = jnp.max(live_scores, axis=1) / best_penalty  # [batch]; -inf when none live
    has_finished = jnp.any(jnp.isfinite(fin[2]), axis=1)  # [batch]
    worst_finished = jnp.min(jnp.where(jnp.isfinite(fin[2]), fin[2], jnp.inf), axis=1)
    done = s.done | ~jnp.any(jnp.isfinite(live_scores), axis=1)
    done = done | (has_finished & (best_live <= worst_finished))
    return _BeamState(s.step + 1, tokens, live_scores, *fin, done, _gather_cache(cache, beam_index))

  def t2t_body(s: _BeamState) -> _BeamState:
    flat, cache = candidates_of(s)
    vocab = flat.shape[1] // k
    top_scores, top_index = lax.top_k(flat, 2 * k)  # [batch, 2K]
    beam_index, token, tokens = extend(s, top_index, vocab)
    valid = jnp.isfinite(top_scores) & ~s.done[:, None]
    length = s.step + 1
    finishing = valid & ((token == EOS_ID) | (length >= max_lengths)[:, None])  # [batch, 2K]
    # t2t's grow_alive: the K best of the 2K that did not finish.
    live_scores, pick = lax.top_k(jnp.where(valid & ~finishing, top_scores, NEG_INF), k)
    live_tokens = _gather_beams(tokens, pick)  # [batch, beam, max_decode_len]
    # t2t's grow_finished: the K best of the old pool and all 2K that finished now.
    fin = _merge_finished(s, tokens, top_scores, finishing, length, alpha)

    # t2t's stop_early: the best finished beats the best live one at its most favourable length.
    best_live = live_scores[:, 0] / best_penalty  # [batch]; top_k sorts; -inf when none live
    done = s.done | ~jnp.isfinite(live_scores[:, 0]) | (fin[2][:, 0] >= best_live)
    cache = _gather_cache(cache, _gather_beams(beam_index, pick))
    return _BeamState(s.step + 1, live_tokens, live_scores, *fin, done, cache)

  empty = jnp.full((batch, k), NEG_INF, jnp.float32)
  buffers = jnp.full((batch, k, max_decode_len), PAD_ID, jnp.int32)
  init = _BeamState(
    step=jnp.array(0, jnp.int32),
    live_tokens=buffers,
    # One live hypothesis (the empty prefix) per sentence, so step 0 picks distinct tokens.
    live_scores=empty.at[:, 0].set(0.0),
    fin_tokens=buffers,
    fin_scores=empty,
    fin_normalized=empty,
    fin_lengths=jnp.zeros((batch, k), jnp.int32),
    done=max_lengths <= 0,
    cache=cache,
  )
  return lax.while_loop(cond, t2t_body if style == "t2t" else shrinking_body, init)


def beam_search(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  *,
  beam_size: int,
  alpha: float,
  max_decode_len: int,
  allow_eos: bool = True,
  style: str = "shrinking",
) -> SearchResult:
  """Beam search with length penalty and early stopping, in either style (module docstring).

  Args:
    step_fn: the decoder on `batch * beam_size` rows, sentence-major (row = b * beam + k).
    cache: its initial cache for those rows.
    max_lengths: [batch] each sentence's maximum output length (0: skip the row).
    beam_size: K.
    alpha: length-penalty exponent.
    max_decode_len: static size of the output buffers (>= max(max_lengths)).
    allow_eos: False forbids EOS (fixed-length runs for benchmarks).
    style: "shrinking" or "t2t".
  """
  final = run_beam_search(
    step_fn,
    cache,
    max_lengths,
    beam_size=beam_size,
    alpha=alpha,
    max_decode_len=max_decode_len,
    allow_eos=allow_eos,
    style=style,
  )
  # Slot 0 of the pool is the best finished hypothesis (top_k sorts). A sentence with none (only a
  # skipped filler row) returns an empty output with score 0.
  found = jnp.isfinite(final.fin_normalized[:, 0])
  return SearchResult(
    tokens=jnp.where(found[:, None], final.fin_tokens[:, 0], PAD_ID),
    lengths=jnp.where(found, final.fin_lengths[:, 0], 0),
    scores=jnp.where(found, final.fin_scores[:, 0], 0.0),
    normalized_scores=jnp.where(found, final.fin_normalized[:, 0], 0.0),
    num_steps=final.step,
  )


# ------------------------------------------------------------------------------------------------
# The Transformer as a step function, and the jitted entry point.


def model_step_fn(model: Transformer, params: Any, encoded: Array, inputs: Array) -> StepFn:
  """The cached decoder as a step function over rows of (`encoded`, `inputs`).

  encoded: [batch, src_len, d_model]; inputs: [batch, src_len] (for the cross-attention mask).
  The step may run on K rows per sentence (beam search: row b * K + j is beam j of sentence b);
  the cross-attention then keeps one copy of each sentence's keys and values for its K rows.

  The cross-attention keys and values of every decoder layer are projected here, once, by one
  decoder step on a throwaway one-position cache with `cross_cache` mutable; each step then reads
  them as constants.
  """
  batch, src_len = inputs.shape
  _, projected = model.apply(
    {"params": params, "cache": init_decode_cache(model, batch, 1, src_len)},
    encoded,
    inputs,
    jnp.zeros((batch, 1), jnp.int32),
    decode=True,
    method=Transformer.decode,
    mutable=["cache", "cross_cache"],
  )
  cross_cache = projected["cross_cache"]  # leaves [batch, src_len, heads, head_dim]

  def step(cache: Cache, ids: Array) -> tuple[Array, Cache]:
    logits, mutated = model.apply(
      {"params": params, "cache": cache, "cross_cache": cross_cache},
      encoded,
      inputs,
      ids,
      decode=True,
      method=Transformer.decode,
      mutable=["cache"],
    )  # logits: [rows, 1, vocab]
    return logits[:, 0, :], mutated["cache"]

  return step


def decode_batch(
  model: Transformer,
  params: Any,
  inputs: Array,
  search: SearchConfig,
  greedy: bool = False,
) -> SearchResult:
  """Translates a batch: encoder once, then the cached search, all in one compiled program.

  Args:
    model: the Transformer (hashable; one compilation per model config, settings and input shape).
    params: its parameters.
    inputs: [batch, src_len] source ids ending in EOS, 0-padded; all-padding rows are skipped.
    search: beam size, style, alpha, length rule. Beam size 1 runs the shrinking beam search with
      one slot, which is greedy search (tests check it token for token), or, for style "t2t",
      greedy search itself.
    greedy: run `greedy_search` instead (the reference beam 1 is checked against).

  Returns:
    The best hypothesis per sentence; tokens are [batch, min(src_len + offset, model max_len)].
  """
  if search.beam_size == 1 and search.style == "t2t":
    greedy = True  # t2t's beam 1 searches past greedy's EOS; beam size 1 means greedy here
  if greedy:
    # Greedy ignores the beam size and style: one compiled program serves every beam setting.
    search = dataclasses.replace(search, beam_size=1, style="shrinking")
  return _decode_batch(model, params, inputs, search, greedy)


@functools.partial(jax.jit, static_argnames=("model", "search", "greedy"))
def _decode_batch(
  model: Transformer, params: Any, inputs: Array, search: SearchConfig, greedy: bool
) -> SearchResult:
  batch, src_len = inputs.shape
  max_decode_len = decode_length_bound(src_len, search.max_len_offset, model.cfg.max_len)
  max_lengths = max_output_lengths(inputs, search.max_len_offset, max_decode_len)  # [batch]
  encoded = model.apply({"params": params}, inputs, method=Transformer.encode)  # [B, S, D]
  if greedy:
    cache = init_decode_cache(model, batch, max_decode_len, src_len)
    return greedy_search(
      model_step_fn(model, params, encoded, inputs),
      cache,
      max_lengths,
      max_decode_len=max_decode_len,
      alpha=search.alpha,
      allow_eos=search.allow_eos,
    )
  k = search.beam_size
  # Decoder rows are sentence-major, row b * K + j is beam j of sentence b; the encoder output
  # stays one row per sentence (MultiHeadAttention's cross-attention maps beams onto it).
  cache = init_decode_cache(model, batch * k, max_decode_len, src_len, num_sentences=batch)
  return beam_search(
    model_step_fn(model, params, encoded, inputs),
    cache,
    max_lengths,
    beam_size=k,
    alpha=search.alpha,
    max_decode_len=max_decode_len,
    allow_eos=search.allow_eos,
    style=search.style,
  )
