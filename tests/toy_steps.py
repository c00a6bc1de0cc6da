"""Hand-made step functions: Markov chains over a 6-token vocabulary whose best sequences are known,
for the search tests (tests/unit/test_decode.py, test_search_research.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flaxformer_nmt.decoding import search as search_lib
from flaxformer_nmt.model.tokens import PAD_ID

# Toy vocabulary: 0 PAD, 1 EOS, then four content tokens.
A, B, C, D = 2, 3, 4, 5
V = 6


def _bigram_step(log_table: np.ndarray) -> search_lib.StepFn:
  """logits = log_table[previous token]: a first-order Markov chain; the cache counts steps."""
  table = jnp.asarray(log_table, jnp.float32)

  def step(cache, ids):
    return table[ids[:, 0]], {"index": cache["index"] + 1}

  return step


def _trigram_step(log_table: np.ndarray) -> search_lib.StepFn:
  """logits = log_table[token two back, previous token] + a per-row bias.

  The token two back lives only in the cache, and the bias is a [rows, vocab] cache leaf, so
  beam search gets the right answer only if it reorders every per-row cache leaf with its beams.
  """
  table = jnp.asarray(log_table, jnp.float32)

  def step(cache, ids):
    logits = table[cache["prev"], ids[:, 0]] + cache["bias"]
    return logits, {"prev": ids[:, 0], "bias": cache["bias"], "index": cache["index"] + 1}

  return step


def _trigram_cache(bias: np.ndarray, beam: int) -> dict:
  rows = jnp.repeat(bias, beam, axis=0)  # sentence-major: row b * beam + j (traceable)
  return {
    "prev": jnp.zeros((rows.shape[0],), jnp.int32),
    "bias": jnp.asarray(rows, jnp.float32),
    "index": jnp.array(0, jnp.int32),
  }


def _masked_log_softmax(logits: np.ndarray) -> np.ndarray:
  """What the search scores with: log-softmax over the vocabulary, PAD impossible."""
  logits = logits - logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  logp[..., PAD_ID] = -np.inf
  return logp


def jitted(
  search: Callable[..., Any], step: search_lib.StepFn, *arrays: Any, **options: Any
) -> Any:
  """`search(step, *arrays, **options)` as one compiled program, as decoding runs a search (it
  jits the whole search: decoding/decode.py). Run op by op, a search compiles every operation
  outside its loop as a program of its own: hundreds of tiny programs per test file, each traced,
  lowered and looked up in the compilation cache again on every test run. `options` (sizes,
  styles, rules) are closed over, as the search's static arguments are; an error they cause is
  raised while tracing, here, as it would be op by op."""
  return jax.jit(lambda *a: search(step, *a, **options))(*arrays)
