"""Scoring given translations: the model's log-probability of each reference, teacher-forced.

What `fairseq-generate --score-reference`, `marian-scorer` and `sockeye-score` do: for reranking,
filtering a corpus, or studying a model. Each pair's score is the one the n-best list prints for
that hypothesis (total log-probability / the length penalty, EOS counted), computed with the same
next-token distribution as the search (PAD impossible; an ensemble's is the log of its members'
mean probability), so a hypothesis of the beam scores as the beam scored it, up to rounding: one
teacher-forced pass and the cached step-by-step decoder round differently (tests: within 1e-3).

Pairs are sorted by length and batched as the translator batches lines (few padded shapes, every
device of every process); every process ends with all scores.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.decoding import search as search_lib
from flaxformer_nmt.decoding.translator import TextTokenizer, bucket_lengths
from flaxformer_nmt.model.ensemble import Ensemble
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.model.transformer import Transformer
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.runtime import parallel

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PairScore:
  score: float  # log_prob / lp(tokens): what the n-best list prints
  log_prob: float  # the sum of the reference's token log-probabilities, EOS included
  tokens: int  # pieces scored, EOS included


def token_log_probs(
  model: Transformer, params: Any, inputs: Array, targets: Array, forced_first: bool = False
) -> tuple[Array, Array]:
  """Each reference's (summed log-probability [batch], tokens [batch]), teacher-forced.

  inputs: [batch, S] sources ending in EOS; targets: [batch, T] references ending in EOS, both
  0-padded. `params` may be an Ensemble (model_step.ensemble_step_fn's rule). `forced_first`:
  each target's first token is the one the search forces (an M2M100 model's target language):
  counted, with log-probability 0, as the search scores it."""
  members = params.members if isinstance(params, Ensemble) else (params,)
  logits = [model.apply({"params": p}, inputs, targets) for p in members]  # [batch, T, V] each
  if len(logits) == 1:
    step_logits = logits[0]
  else:  # what ensemble_step_fn hands the search
    log_probs = jnp.stack([search_lib.log_softmax(x.astype(jnp.float32)) for x in logits])
    step_logits = jax.nn.logsumexp(log_probs, axis=0) - jnp.log(jnp.float32(len(logits)))
  batch, length, vocab = step_logits.shape
  log_p = search_lib.next_token_log_probs(step_logits.reshape(batch * length, vocab))
  picked = jnp.take_along_axis(log_p, targets.reshape(-1, 1), axis=-1).reshape(batch, length)
  if forced_first:
    picked = picked.at[:, 0].set(0.0)
  real = targets != PAD_ID
  return jnp.sum(jnp.where(real, picked, 0.0), axis=-1), jnp.sum(real, axis=-1).astype(jnp.int32)


@functools.lru_cache(maxsize=8)
def _sharded_scorer(model: Transformer, forced_first: bool = False) -> Any:
  fn = functools.partial(token_log_probs, model, forced_first=forced_first)
  return parallel.pmap_rows(fn, name=f"score {model.cfg!r}" + (" forced" if forced_first else ""))


class Scorer:
  """Pairs of lines in, one PairScore per pair out, in order."""

  def __init__(
    self,
    parts: Components,
    params: Any,
    *,
    alpha: float,
    source_prefix: Sequence[int] = (),
    reserved_ids: Sequence[int] = (),
    replicated: bool = False,
    first_id: int | None = None,
  ) -> None:
    """`first_id`: the token every output starts with, forced (translator.Translator's): put
    before each reference and scored as the search scores it (log-probability 0)."""
    self.tokenizer: TextTokenizer = parts.tokenizer
    self.model = parts.model
    self.params = params if replicated else parallel.replicate(params)
    self.alpha = alpha
    self.batch_size = int(parts.config.decode.batch_size)
    self.max_src_len = parts.max_src_len
    self.max_tgt_len = int(parts.model.cfg.max_len)
    self.source_prefix = list(source_prefix)
    self.target_prefix = [] if first_id is None else [int(first_id)]
    self.reserved_ids = frozenset(reserved_ids)
    id_to_piece = getattr(self.tokenizer, "id_to_piece", None)
    self._untagged = tokenizer_lib.without_pieces(
      [id_to_piece(i) for i in sorted(self.reserved_ids)] if id_to_piece else []
    )
    self.truncated: list[int] = []  # 0-based pairs whose source or reference was cut
    self.seconds = 0.0

  def _ids(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
    # A Marian vocabulary encodes targets with its own model (data/pair_vocabulary.py).
    encode = self.tokenizer.encode_target if target else self.tokenizer.encode
    ids = [encode(self._untagged(t)) for t in texts]
    return [[i for i in x if i not in self.reserved_ids] for x in ids]

  def score(self, sources: Sequence[str], references: Sequence[str]) -> list[PairScore]:
    start = time.time()
    src = [self.source_prefix + x + [EOS_ID] for x in self._ids(sources)]
    tgt = [self.target_prefix + x + [EOS_ID] for x in self._ids(references, target=True)]
    self.truncated = []
    for i in range(len(src)):
      if len(src[i]) > self.max_src_len or len(tgt[i]) > self.max_tgt_len:
        self.truncated.append(i)
        src[i] = _cut(src[i], self.max_src_len)
        tgt[i] = _cut(tgt[i], self.max_tgt_len)
    if self.truncated:
      logging.warning(
        "%d of %d pairs are longer than the model takes (source %d, reference %d tokens with "
        "EOS) and were cut: pair %s.",
        len(self.truncated),
        len(src),
        self.max_src_len,
        self.max_tgt_len,
        ", ".join(str(i + 1) for i in self.truncated[:5]),
      )
    order = sorted(range(len(src)), key=lambda i: (len(tgt[i]), len(src[i])), reverse=True)
    devices = jax.device_count()
    rows = devices * min(self.batch_size, -(-len(order) // devices) if order else 1)
    src_buckets = bucket_lengths(self.max_src_len)
    tgt_buckets = bucket_lengths(self.max_tgt_len)
    run = _sharded_scorer(self.model, bool(self.target_prefix))
    totals = np.zeros(len(src), np.float64)
    counts = np.zeros(len(src), np.int64)
    for first in range(0, len(order), rows):
      batch = order[first : first + rows]
      s_len = next(b for b in src_buckets if b >= max(len(src[i]) for i in batch))
      t_len = next(b for b in tgt_buckets if b >= max(len(tgt[i]) for i in batch))
      inputs = np.zeros((rows, s_len), np.int32)  # [rows, S]; filler rows all padding
      targets = np.zeros((rows, t_len), np.int32)  # [rows, T]
      for r, i in enumerate(batch):
        inputs[r, : len(src[i])] = src[i]
        targets[r, : len(tgt[i])] = tgt[i]
      log_prob, tokens = run(self.params, inputs, targets)
      for r, i in enumerate(batch):
        totals[i], counts[i] = float(log_prob[r]), int(tokens[r])
    self.seconds = time.time() - start
    penalty = np.asarray(search_lib.length_penalty(jnp.asarray(counts), self.alpha))
    return [
      PairScore(float(t / p), float(t), int(n))
      for t, p, n in zip(totals, penalty, counts, strict=True)
    ]


def check_pairs(
  sources: Sequence[str], references: Sequence[str], source_name: str, reference_name: str
) -> None:
  """ConfigError, naming the file (`source_name`, e.g. "--input=x.en") and line, for files that
  do not pair line by line, or an empty line (no model output is empty: every hypothesis has at
  least EOS, and a blank source is not translated)."""
  if len(sources) != len(references):
    raise errors.ConfigError(
      f"{source_name} has {len(sources)} lines and {reference_name} {len(references)}: they "
      "must pair line by line."
    )
  for name, lines in ((source_name, sources), (reference_name, references)):
    blank = next((i for i, line in enumerate(lines) if not line.strip()), None)
    if blank is not None:
      raise errors.ConfigError(
        f"{name}: line {blank + 1} is empty; every pair needs a source and a translation."
      )


def _cut(ids: list[int], limit: int) -> list[int]:
  return ids if len(ids) <= limit else ids[: limit - 1] + [EOS_ID]


def score_rows(scores: Sequence[PairScore]) -> list[str]:
  """One TSV row per pair: score (as the n-best list prints it), log-probability, tokens."""
  return [f"{s.score:.6f}\t{s.log_prob:.6f}\t{s.tokens}" for s in scores]


def summary(scores: Sequence[PairScore]) -> dict[str, Any]:
  """Corpus figures: the pairs, their tokens, the total log-probability and its perplexity."""
  tokens = sum(s.tokens for s in scores)
  total = sum(s.log_prob for s in scores)
  return {
    "pairs": len(scores),
    "tokens": tokens,
    "log_prob": total,
    "mean_score": float(np.mean([s.score for s in scores])) if scores else 0.0,
    "perplexity": float(np.exp(-total / tokens)) if tokens else 0.0,
  }
