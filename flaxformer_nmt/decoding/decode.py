"""Translating a batch with the Transformer: the search's settings (`SearchConfig`), the length
rule, and the jitted entry point `decode_batch` (encoder once, then the search, in one program).

The searches (token_loop.py, sampling.py, beam_search.py) see only a step function, and the model
as one is model_step.py's; this module puts them together: each sentence's maximum output length
(input length + 50 as in the paper, Sec. 6.1), the decode caches' size, sampling's keys, and the
alignments asked for. `decode_fn` runs `decode_batch` on every local device (pmapped, one
program per model and settings, so repeated dev evaluations reuse its compilations) as a
numpy-in, numpy-out function; the compiled programs are kept on disk by runtime/executables.py.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from flaxformer_nmt.config.choices import BEAM_STYLES, DECODE_METHODS
from flaxformer_nmt.decoding import beam_search, token_loop
from flaxformer_nmt.decoding import constraints as constraints_lib
from flaxformer_nmt.decoding import search as search_lib
from flaxformer_nmt.decoding.constraints import Constraints
from flaxformer_nmt.decoding.lines import BatchDecodeFn, ConstrainedDecodeFn
from flaxformer_nmt.decoding.model_step import (
  Ensemble,
  ensemble_step_fn,
  model_step_fn,
  source_positions,
)
from flaxformer_nmt.model.shapes import init_decode_cache
from flaxformer_nmt.model.tokens import PAD_ID
from flaxformer_nmt.model.transformer import Transformer
from flaxformer_nmt.runtime import parallel

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """Static settings of one search (hashable: jit compiles one program per distinct value).

  Attributes:
    beam_size: hypotheses per sentence; 1 = greedy.
    alpha: length-penalty exponent; 0 ranks by plain log-probability.
    max_len_offset: a sentence's output has at most (its source length + this) tokens, EOS
      included, and never more than the model's `max_len`.
    style: "shrinking" or "t2t" (beam_search.py's module docstring).
    method: "beam" (beam_size 1 = greedy), "greedy" or "sample" (sampling.py).
    nbest: outputs per sentence: the n best of the beam (n <= beam_size), or n samples.
    temperature, top_k, top_p, seed: sampling's (sampling.py; `row_keys` for the seed).
    alignment_layer: >= 0: also align each output token to a source position with that decoder
      layer's cross-attention (`source_positions`); -1: no alignments.
    force_first: each row's first output is given (`first_ids`: an M2M100 model's target-language
      token, as transformers' forced_bos_token_id), with log-probability 0; every search.
  """

  beam_size: int = 4
  alpha: float = 0.6
  max_len_offset: int = 50
  style: str = "shrinking"
  method: str = "beam"
  nbest: int = 1
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  alignment_layer: int = -1
  force_first: bool = False

  def __post_init__(self) -> None:
    if self.style not in BEAM_STYLES:
      raise ValueError(f"Unknown beam style {self.style!r}; choose one of {list(BEAM_STYLES)}.")
    if self.method not in DECODE_METHODS:
      raise ValueError(f"Unknown decode method {self.method!r}; choose one of {DECODE_METHODS}.")
    limit = self.beam_size if self.method == "beam" else 1 if self.method == "greedy" else None
    if self.nbest < 1 or (limit is not None and self.nbest > limit):
      raise ValueError(f"nbest={self.nbest} needs 1 <= nbest <= {limit} with {self.method}.")

  @classmethod
  def from_config(
    cls,
    decode: ml_collections.ConfigDict,
    beam_size: int | None = None,
    nbest: int = 1,
    alignment_layer: int = -1,
  ) -> SearchConfig:
    """From `config.decode`. `beam_size` overrides it and asks for beam search whatever
    `decode.method` says (greedy dev BLEU during training, the greedy and beam test scores)."""
    method = "beam" if beam_size is not None else str(decode.get("method", "beam"))
    return cls(
      beam_size=int(decode.beam_size if beam_size is None else beam_size),
      alpha=float(decode.alpha),
      max_len_offset=int(decode.max_len_offset),
      style=str(decode.get("beam_style", "shrinking")),
      method=method,
      nbest=nbest,
      temperature=float(decode.get("temperature", 1.0)),
      top_k=int(decode.get("top_k", 0)),
      top_p=float(decode.get("top_p", 1.0)),
      seed=int(decode.get("seed", 0)),
      alignment_layer=alignment_layer,
    )

  @property
  def sampling_rule(self) -> Any:
    """sampling.SamplingRule of this search's temperature, top_k and top_p."""
    from flaxformer_nmt.decoding import sampling  # pylint: disable=g-import-not-at-top

    return sampling.SamplingRule(self.temperature, self.top_k, self.top_p)


# ------------------------------------------------------------------------------------------------
# The length rule.


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


# ------------------------------------------------------------------------------------------------
# The jitted entry point.


def row_keys(seed: int, line_ids: Array, samples: int) -> Array:
  """Sampling's keys, [batch * samples]: sample j of input line i draws from
  fold_in(fold_in(key(seed), i), j), whatever batch or device the line lands in."""
  base = jax.random.key(seed)
  lines = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base, line_ids)  # [batch]
  per_sample = jax.vmap(
    lambda k: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(k, jnp.arange(samples))
  )
  return per_sample(lines).reshape(-1)  # [batch * samples], sentence-major


def decode_batch(
  model: Transformer,
  params: Any,
  inputs: Array,
  search: SearchConfig,
  greedy: bool = False,
  line_ids: Array | None = None,
  constraints: Constraints | None = None,
  first_ids: Array | None = None,
) -> search_lib.SearchResult:
  """Translates a batch: encoder once, then the cached search, all in one compiled program.

  Args:
    model: the Transformer (hashable; one compilation per model config, settings and input shape).
    params: its parameters, or an `Ensemble` of several models' (same config and vocabulary).
    inputs: [batch, src_len] source ids ending in EOS, 0-padded; all-padding rows are skipped.
    search: method, beam size, style, alpha, length rule, n-best, sampling. Beam size 1 runs the
      shrinking beam search with one slot, which is greedy search (tests check it token for
      token), or, for style "t2t", greedy search itself.
    greedy: run greedy search (token_loop.py) instead (the reference beam 1 is checked against).
    line_ids: [batch] int32 each row's input line number, for sampling's keys (`row_keys`);
      default 0..batch-1.
    constraints: each row's terms (constraints.pack): beam search that outputs them all
      (constrained.py), with `search.beam_size` as the beam, whatever its size and method.
    first_ids: [batch] int32 each row's first output, with `search.force_first` (`forced_first`).

  Returns:
    The best hypothesis per sentence, or with `search.nbest` > 1 the n best (beam) or n samples
    ranked by normalised score ([batch, n, ...] fields); tokens are [.., min(src_len + offset,
    model max_len)].
  """
  if constraints is not None:
    search = dataclasses.replace(search, method="beam")
  elif search.method == "greedy" or (search.beam_size == 1 and search.style == "t2t"):
    greedy = True  # t2t's beam 1 searches past greedy's EOS; beam size 1 means greedy here
  if greedy and search.method != "sample":
    # Greedy ignores the beam size and style: one compiled program serves every beam setting.
    search = dataclasses.replace(search, beam_size=1, style="shrinking", method="greedy")
  if line_ids is None:
    line_ids = jnp.arange(inputs.shape[0], dtype=jnp.int32)
  if search.force_first != (first_ids is not None):
    raise ValueError("first_ids are given exactly when search.force_first is set.")
  return _decode_batch(model, params, inputs, line_ids, search, constraints, first_ids)


@functools.partial(jax.jit, static_argnames=("model", "search"))
def _decode_batch(
  model: Transformer,
  params: Any,
  inputs: Array,
  line_ids: Array,
  search: SearchConfig,
  constraints: Constraints | None = None,
  first_ids: Array | None = None,
) -> search_lib.SearchResult:
  step_fn, max_lengths, max_decode_len = prepare_search(model, params, inputs, search)
  members = len(params.members) if isinstance(params, Ensemble) else None
  result = run_search(
    model,
    step_fn,
    max_lengths,
    inputs.shape,
    max_decode_len,
    search,
    line_ids,
    members,
    constraints,
    first_ids,
  )
  if search.alignment_layer < 0:
    return result
  first = params.members[0] if isinstance(params, Ensemble) else params
  return result._replace(
    source_positions=source_positions(model, first, inputs, result.tokens, search.alignment_layer)
  )


def prepare_search(
  model: Transformer, params: Any, inputs: Array, search: SearchConfig
) -> tuple[search_lib.StepFn, Array, int]:
  """(the model's step function over the encoded `inputs`, each sentence's output length limit
  [batch], the decode buffer length): what a search needs. Traceable (inside `jax.jit`)."""
  _, src_len = inputs.shape
  max_decode_len = decode_length_bound(src_len, search.max_len_offset, model.cfg.max_len)
  max_lengths = max_output_lengths(inputs, search.max_len_offset, max_decode_len)  # [batch]
  members = params.members if isinstance(params, Ensemble) else (params,)
  step_fns = []
  for member in members:
    encoded = model.apply({"params": member}, inputs, method=Transformer.encode)  # [B, S, D]
    step_fns.append(model_step_fn(model, member, encoded, inputs))
  step_fn = step_fns[0] if not isinstance(params, Ensemble) else ensemble_step_fn(step_fns)
  return step_fn, max_lengths, max_decode_len


def run_search(
  model: Transformer,
  step_fn: search_lib.StepFn,
  max_lengths: Array,
  input_shape: tuple[int, int],
  max_decode_len: int,
  search: SearchConfig,
  line_ids: Array | None = None,
  members: int | None = None,
  constraints: Constraints | None = None,
  first_ids: Array | None = None,
) -> search_lib.SearchResult:
  """`search.method` over `step_fn` (the model's, an ensemble's, or one built on it) with a fresh
  cache (a tuple of `members` caches for an ensemble's step function); with `constraints`, the
  constrained beam search; with `first_ids` ([batch]), each sentence's first output forced."""
  batch, src_len = input_shape
  # Rows per sentence: the beam, the samples, or 1. Decoder rows are sentence-major, row
  # b * K + j is hypothesis j of sentence b; the encoder output stays one row per sentence
  # (MultiHeadAttention's cross-attention maps the K rows onto it).
  k = {"beam": search.beam_size, "sample": search.nbest, "greedy": 1}[search.method]
  cache = init_decode_cache(model, batch * k, max_decode_len, src_len, num_sentences=batch)
  if members is not None:
    cache = tuple(cache for _ in range(members))
  if first_ids is not None:
    step_fn, cache = search_lib.forced_first(step_fn, cache, jnp.repeat(first_ids, k))
  if search.method == "greedy":
    return token_loop.greedy_search(
      step_fn, cache, max_lengths, max_decode_len=max_decode_len, alpha=search.alpha
    )
  # Sampling and the constrained beam are loaded only by the searches that use them.
  # pylint: disable=g-import-not-at-top
  if search.method == "sample":
    from flaxformer_nmt.decoding import sampling

    line_ids = jnp.arange(batch, dtype=jnp.int32) if line_ids is None else line_ids
    result = sampling.sample_search(
      step_fn,
      cache,
      jnp.repeat(max_lengths, k),
      row_keys(search.seed, line_ids, k),
      max_decode_len=max_decode_len,
      alpha=search.alpha,
      rule=search.sampling_rule,
    )
    return _rank_samples(result, batch, k)
  if constraints is not None:
    from flaxformer_nmt.decoding import constrained

    return constrained.constrained_search(
      step_fn,
      cache,
      max_lengths,
      constraints,
      beam_size=k,
      alpha=search.alpha,
      max_decode_len=max_decode_len,
      style=search.style,
      nbest=search.nbest,
    )
  return beam_search.beam_search(
    step_fn,
    cache,
    max_lengths,
    beam_size=k,
    alpha=search.alpha,
    max_decode_len=max_decode_len,
    style=search.style,
    nbest=search.nbest,
  )


def _rank_samples(result: search_lib.SearchResult, batch: int, k: int) -> search_lib.SearchResult:
  """[batch * k] samples -> [batch, k] ranked by normalised score, best first ([batch] if k=1)."""
  if k == 1:
    return result
  order = jnp.argsort(-result.normalized_scores.reshape(batch, k), axis=1)  # [batch, k]

  def ranked(x: Array) -> Array:
    x = x.reshape(batch, k, *x.shape[1:])
    return jnp.take_along_axis(x, order.reshape(batch, k, *([1] * (x.ndim - 2))), axis=1)

  return result._replace(
    **{f: ranked(getattr(result, f)) for f in search_lib.SearchResult._fields[:4]}
  )


@functools.lru_cache(maxsize=32)
def _sharded_decoder(model: Any, search: SearchConfig) -> Callable[[Any, np.ndarray], Any]:
  """One pmapped decoder per (model, settings): repeated dev evaluations reuse its compilations."""

  def search_result(params: Any, inputs: jax.Array, line_ids: jax.Array, *first: jax.Array) -> Any:
    result = decode_batch(model, params, inputs, search, line_ids=line_ids, first_ids=_one(first))
    return result._replace(lengths=None, scores=None, num_steps=None)  # what the host reads

  return parallel.pmap_rows(search_result, name=f"decode {model.cfg!r} {search!r}")


@functools.lru_cache(maxsize=32)
def _sharded_constrained_decoder(model: Any, search: SearchConfig) -> Callable[..., Any]:
  """`_sharded_decoder` for the constrained search (one per beam: `search.beam_size`)."""

  def search_result(params: Any, inputs: jax.Array, line_ids: jax.Array, *arrays: jax.Array) -> Any:
    first, terms = (arrays[:1], arrays[1:]) if search.force_first else ((), arrays)
    c = constraints_lib.Constraints(*terms)
    result = decode_batch(
      model, params, inputs, search, line_ids=line_ids, constraints=c, first_ids=_one(first)
    )
    return result._replace(lengths=None, scores=None, num_steps=None)

  return parallel.pmap_rows(search_result, name=f"constrained {model.cfg!r} {search!r}")


def _one(first: tuple[jax.Array, ...]) -> jax.Array | None:
  return first[0] if first else None


def decode_fn(model: Any, params: Any, search: SearchConfig) -> BatchDecodeFn:
  """The model's batch decode over all devices as a numpy-in, numpy-out function; `params` are
  on every local device already (parallel.replicate, or the train state's during training).
  With `search.force_first` it takes each row's first output too: (inputs, line_ids, first_ids)."""
  run = _sharded_decoder(model, search)
  return lambda inputs, line_ids, *first: run(params, inputs, line_ids, *first)


def constrained_decode_fn(model: Any, params: Any, search: SearchConfig) -> ConstrainedDecodeFn:
  """`decode_fn` for the constrained search, by beam size."""

  def with_beam(beam: int) -> Callable[..., Any]:
    run = _sharded_constrained_decoder(
      model, dataclasses.replace(search, beam_size=beam, method="beam")
    )
    # With search.force_first: (inputs, line_ids, first_ids, *terms).
    return lambda inputs, line_ids, *arrays: run(params, inputs, line_ids, *arrays)

  return with_beam
