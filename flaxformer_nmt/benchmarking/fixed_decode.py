"""Decoding with EOS forbidden: every sentence runs to its maximum length, a fixed amount of work.

Decoding benchmarks time random-weight models on random sources; where such a model emits EOS is
chance, so an unconstrained search would time a different number of steps each run. Here the
model's step function gives EOS a -inf logit, so a batch always makes exactly its length bound in
steps (`decode.decode_length_bound`), whatever the weights. Used by benchmarks/decode.py and
benchmarks/flax_wmt.py (the Flax example's search is held to the same count there).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from flaxformer_nmt.decoding import decode
from flaxformer_nmt.decoding import search as search_lib
from flaxformer_nmt.model.tokens import EOS_ID
from flaxformer_nmt.model.transformer import Transformer


@functools.partial(jax.jit, static_argnames=("model", "search"))
def decode_fixed(
  model: Transformer, params: Any, inputs: jax.Array, search: decode.SearchConfig
) -> search_lib.SearchResult:
  """`decode.decode_batch` with EOS impossible: every sentence runs to its maximum length."""
  model_step, max_lengths, max_decode_len = decode.prepare_search(model, params, inputs, search)

  def step(cache: search_lib.Cache, ids: jax.Array) -> tuple[jax.Array, search_lib.Cache]:
    logits, cache = model_step(cache, ids)  # [rows, vocab]
    return logits.at[:, EOS_ID].set(-jnp.inf), cache

  if search.method == "beam" and search.beam_size == 1 and search.style == "t2t":
    search = dataclasses.replace(search, method="greedy")  # as decode_batch: t2t's beam 1
  members = len(params.members) if isinstance(params, decode.Ensemble) else None
  return decode.run_search(
    model, step, max_lengths, inputs.shape, max_decode_len, search, members=members
  )
