"""Sampling search: each next token drawn from the model's distribution, on the cached decoder.

Like every search (search.py), it sees only a step function, so it runs on the same incremental
decoder as greedy search (token_loop.py, whose loop it shares) and costs about as much per step
(one draw instead of one argmax). Back-translation works better with sampled than with beam
output (Edunov et al., 2018, "Understanding Back-Translation at Scale"), which is what it is for.

The distribution can be reshaped before each draw, in this order (as fairseq and Hugging Face do):
`temperature` divides the log-probabilities (below 1 sharpens, above 1 flattens); `top_k` keeps the
k most likely tokens (0 = all); `top_p` keeps the smallest set of most likely tokens whose
probability reaches p (nucleus sampling, Holtzman et al. 2020; 1.0 = all). PAD is never drawn.

Randomness: every row carries its own key (`row_keys`), and the draw at step t uses
fold_in(row key, t). The caller derives a row's key from the seed, the input line's number and
the sample's index (decode.row_keys), so a line's random numbers do not depend on its
batch-mates, on the batch order or on how many devices decode. Its samples then agree up to the
float rounding of the logits, which the padded length of a batch can move, as for greedy output.

The returned score of a sample is the model's own: the sum of its tokens' log-probabilities under
the unmodified distribution (temperature 1, no top-k / top-p), and the normalised score divides it
by the length penalty, as beam search's; n-best lists of samples are ranked by the latter.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from flaxformer_nmt.decoding.search import NEG_INF, Cache, SearchResult, StepFn
from flaxformer_nmt.decoding.token_loop import token_by_token

Array = jax.Array


class SamplingRule(NamedTuple):
  """How the distribution is reshaped before each draw (the module docstring); static."""

  temperature: float = 1.0  # > 0
  top_k: int = 0  # 0 = off
  top_p: float = 1.0  # in (0, 1]; 1.0 = off


def reshape_distribution(log_probs: Array, rule: SamplingRule) -> Array:
  """The logits a draw uses: [rows, vocab] log-probabilities -> [rows, vocab], -inf = excluded.

  Temperature first, then top-k, then top-p on the tempered distribution. Ties at a cut-off are
  kept (a token as likely as the last one kept is kept too).
  """
  logits = log_probs / jnp.float32(rule.temperature)
  if rule.top_k > 0 and rule.top_k < logits.shape[-1]:
    kth = lax.top_k(logits, rule.top_k)[0][:, -1:]  # [rows, 1]: the k-th largest
    logits = jnp.where(logits >= kth, logits, NEG_INF)
  if rule.top_p < 1.0:
    ordered = -jnp.sort(-logits, axis=-1)  # [rows, vocab], most likely first
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # probability mass of the more likely tokens
    # The most likely token is always kept (mass before it is 0 < top_p); then every token while
    # the mass before it is still short of top_p.
    kept = before < jnp.float32(rule.top_p)
    cutoff = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)  # [rows, 1]
    logits = jnp.where(logits >= cutoff, logits, NEG_INF)
  return logits


def draw(keys: Array, logits: Array) -> Array:
  """One token per row from softmax(logits): [rows] keys, [rows, vocab] -> [rows] int32.

  By inversion: one uniform number per row against the cumulative probabilities, so a step draws
  `rows` random numbers, not the `rows x vocab` Gumbel noise of jax.random.categorical (which made
  a sampling step 1.4x a greedy one on the CPU). A token of probability 0 (cut by top-k or top-p)
  is never drawn: the draw is the first token of mass of its own whose cumulative probability
  exceeds u, and when rounding leaves none above u, the last token with mass.
  """
  probs = jax.nn.softmax(logits, axis=-1)  # [rows, vocab]
  cumulative = jnp.cumsum(probs, axis=-1)
  u = jax.vmap(lambda key: jax.random.uniform(key, ()))(keys) * cumulative[:, -1]  # [rows]
  has_mass = probs > 0
  hit = (cumulative > u[:, None]) & has_mass
  last_with_mass = logits.shape[-1] - 1 - jnp.argmax(has_mass[:, ::-1], axis=-1)
  index = jnp.where(jnp.any(hit, axis=-1), jnp.argmax(hit, axis=-1), last_with_mass)
  return index.astype(jnp.int32)


def sample_search(
  step_fn: StepFn,
  cache: Cache,
  max_lengths: Array,
  row_keys: Array,
  *,
  max_decode_len: int,
  alpha: float,
  rule: SamplingRule,
) -> SearchResult:
  """One sample per row, token by token, until EOS or the row's maximum length.

  Args:
    step_fn: the decoder, one token per row per call.
    cache: its initial cache for `rows` rows.
    max_lengths: [rows] each row's maximum output length (0: skip the row).
    row_keys: [rows] typed PRNG keys (jax.random.key), one per row.
    max_decode_len: static size of the output buffer (>= max(max_lengths)).
    alpha: length-penalty exponent, for the normalised score only.
    rule: temperature, top-k, top-p.
  """

  def sample(step: Array, scores: Array, log_probs: Array) -> tuple[Array, Array]:
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, step)  # [rows]
    token = draw(keys, reshape_distribution(log_probs, rule))  # [rows]
    return token, scores + jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]

  return token_by_token(
    step_fn, cache, max_lengths, sample, max_decode_len=max_decode_len, alpha=alpha
  )
