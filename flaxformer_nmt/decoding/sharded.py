"""The model's batch decoders over every device of every process: numpy in, numpy out (translator.py
calls them). One pmapped program per (model, search settings), cached, so repeated dev
evaluations and a server's requests reuse their compilations."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from flaxformer_nmt.decoding import constraints as constraints_lib
from flaxformer_nmt.decoding import decode
from flaxformer_nmt.decoding.lines import BatchDecodeFn, ConstrainedDecodeFn
from flaxformer_nmt.runtime import parallel


@functools.lru_cache(maxsize=32)
def _sharded_decoder(model: Any, search: decode.SearchConfig) -> Callable[[Any, np.ndarray], Any]:
  """One pmapped decoder per (model, settings): repeated dev evaluations reuse its compilations."""

  def search_result(params: Any, inputs: jax.Array, line_ids: jax.Array) -> Any:
    result = decode.decode_batch(model, params, inputs, search, line_ids=line_ids)
    return result._replace(lengths=None, scores=None, num_steps=None)  # what the host reads

  return parallel.pmap_rows(search_result, name=f"decode {model.cfg!r} {search!r}")


@functools.lru_cache(maxsize=32)
def _sharded_constrained_decoder(model: Any, search: decode.SearchConfig) -> Callable[..., Any]:
  """`_sharded_decoder` for the constrained search (one per beam: `search.beam_size`)."""

  def search_result(params: Any, inputs: jax.Array, line_ids: jax.Array, *terms: jax.Array) -> Any:
    c = constraints_lib.Constraints(*terms)
    result = decode.decode_batch(model, params, inputs, search, line_ids=line_ids, constraints=c)
    return result._replace(lengths=None, scores=None, num_steps=None)

  return parallel.pmap_rows(search_result, name=f"constrained {model.cfg!r} {search!r}")


def decode_fn(model: Any, params: Any, search: decode.SearchConfig) -> BatchDecodeFn:
  """The model's batch decode over all devices as a numpy-in, numpy-out function; `params` are
  on every local device already (parallel.replicate, or the train state's during training)."""
  run = _sharded_decoder(model, search)
  return lambda inputs, line_ids: run(params, inputs, line_ids)


def constrained_decode_fn(
  model: Any, params: Any, search: decode.SearchConfig
) -> ConstrainedDecodeFn:
  """`decode_fn` for the constrained search, by beam size."""

  def with_beam(beam: int) -> Callable[..., Any]:
    run = _sharded_constrained_decoder(
      model, dataclasses.replace(search, beam_size=beam, method="beam")
    )
    return lambda inputs, line_ids, *terms: run(params, inputs, line_ids, *terms)

  return with_beam
