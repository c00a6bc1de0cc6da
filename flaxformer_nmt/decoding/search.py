"""What every search shares: the step function it is written against, its result, the length
penalty and the next-token log-probabilities.

Each search (greedy search and the loop sampling shares: token_loop.py; sampling: sampling.py;
beam search: beam_search.py) sees only a *step function* `(cache, ids [rows, 1]) -> (logits
[rows, vocab], cache)`, so none of them knows Flax: decode.py builds one from the cached decoder
(model_step.py), the tests from hand-made distributions. A -inf logit keeps a token out of every
search. Outputs are ids, EOS, then PAD (id 0, the start symbol, never generated); one cut at the
maximum length has no EOS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from flaxformer_nmt.model.tokens import PAD_ID

Array = jax.Array
Cache = Any  # a pytree; leaves are [rows, ...] or scalars shared by all rows
# (cache, ids [rows, 1]) -> (logits [rows, vocab], new cache)
StepFn = Callable[[Cache, Array], tuple[Array, Cache]]

NEG_INF = -jnp.inf


class SearchResult(NamedTuple):
  """Best hypothesis per sentence ([batch, n, ...] fields for an n-best list)."""

  tokens: Array  # [batch, max_decode_len] int32: ids, EOS, then PAD
  lengths: Array  # [batch] int32: tokens including EOS
  scores: Array  # [batch] float32: sum of the tokens' log-probabilities (the model score)
  normalized_scores: Array  # [batch] float32: scores / length_penalty(lengths)
  num_steps: Array  # [] int32: decoder steps the loop ran (early stopping shows here)
  # [batch, max_decode_len] int32, when asked for (decode.py, model_step.py): the source position
  # each output token is aligned to (-1: none, e.g. EOS and padding); None otherwise.
  source_positions: Array | None = None


def length_penalty(length: Array, alpha: float) -> Array:
  """GNMT's lp(len) = ((5 + len) / 6)^alpha; lp(1) = 1, and alpha = 0 gives 1 everywhere."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def log_softmax(logits: Array) -> Array:
  """log_softmax over the last axis, written out: [rows, vocab] -> [rows, vocab]. XLA:CPU fused
  jax.nn.log_softmax's max into the output projection, a kernel 2.5x slower than the product
  alone (base, 128 x 37,000: 90-103 against 35-38 ms): 40% of base-model beam search."""
  m = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))  # [rows, 1]
  return logits - (m + jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1, keepdims=True)))


def forced_first(step_fn: StepFn, cache: Cache, first_ids: Array) -> tuple[StepFn, Cache]:
  """`step_fn` whose first step gives each row only `first_ids[row]` ([rows]), with
  log-probability 0 (its logits 0, every other -inf), and the cache it runs on (`cache` and the
  step count, a scalar every search carries as it is). transformers' forced_bos_token_id: an
  M2M100 model's target-language token comes first in every search, and costs nothing."""

  def step(carried: tuple[Cache, Array], ids: Array) -> tuple[Array, tuple[Cache, Array]]:
    inner, t = carried
    logits, inner = step_fn(inner, ids)  # [rows, vocab]

    def forced() -> Array:  # built only at the first step
      vocab = jnp.arange(logits.shape[-1], dtype=jnp.int32)[None, :]
      return jnp.where(vocab == first_ids[:, None], 0.0, NEG_INF).astype(logits.dtype)

    return lax.cond(t == 0, forced, lambda: logits), (inner, t + 1)

  return step, (cache, jnp.zeros((), jnp.int32))


def next_token_log_probs(logits: Array) -> Array:
  """Next-token log-probabilities with PAD made impossible: [rows, vocab] -> [rows, vocab]."""
  return log_softmax(logits.astype(jnp.float32)).at[:, PAD_ID].set(NEG_INF)
