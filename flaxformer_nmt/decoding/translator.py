"""Translating a list of lines: one output line per input line, in the input's order.

Sentences are sorted by length and decoded in batches of up to `decode.batch_size` sentences per
device, spread over every device of every process, each batch padded to one of a few fixed lengths
(buckets) and to the full batch size, so jit compiles at most one program per bucket however many
lines come in; sorting keeps the padding (wasted work) small. Every process takes part in decoding
and ends with all translations; only process 0 writes them. The batches depend only on the lines
and the global device count, so 1 process of 8 devices and 2 of 4 translate identically. Empty lines
are not sent to the model and come back empty. A line longer than the model accepts is cut (and
counted, with a warning) rather than dropped, which would shift every later line.

`translate_nbest` returns each line's n hypotheses (the n best of the beam, or n samples) with
their scores, and, when asked, word alignments in Pharaoh format (alignments.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.decoding import alignments as alignments_lib
from flaxformer_nmt.decoding import constraints as constraints_lib
from flaxformer_nmt.decoding import decode
from flaxformer_nmt.decoding.language_tokens import (  # noqa: F401  (translator.target_prefix)
  language_ids,
  reserved_ids,
  target_prefix,
)
from flaxformer_nmt.decoding.lines import (  # noqa: F401  (Hypothesis: translator.*)
  BatchDecodeFn,
  ConstrainedDecodeFn,
  Hypothesis,
  TextTokenizer,
  TranslationStats,
)
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.runtime import console, files, parallel

# How many truncated line numbers the warning names.
_NAMED_TRUNCATIONS = 5


# Padded source lengths. Roughly geometric, so padding wastes at most ~1/3 of a batch while a
# full run compiles about ten programs.
BUCKETS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def bucket_lengths(max_src_len: int) -> list[int]:
  """The padded lengths a batch may take: the fixed buckets below `max_src_len`, then it."""
  return [b for b in BUCKETS if b < max_src_len] + [max_src_len]


def bucket(length: int, buckets: Sequence[int]) -> int:
  return next(b for b in buckets if b >= length)


def next_power_of_two(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


class Translator:
  """Lines in, lines out, around a batch decode function (the model, or a stub in tests)."""

  def __init__(
    self,
    tokenizer: TextTokenizer,
    decode_fn: BatchDecodeFn,
    *,
    batch_size: int,
    max_src_len: int,
    num_shards: int = 1,
    log_every_secs: float = 10.0,
    nbest: int = 1,
    alignments: bool = False,
    log_progress: bool = True,
    rows_per_shard: Sequence[int] | None = None,
    source_prefix: Sequence[int] = (),
    reserved_ids: Sequence[int] = (),
    constrained_decode: ConstrainedDecodeFn | None = None,
    beam_size: int = 1,
    max_output_len: Callable[[int], int] | None = None,
    first_id: int | None = None,
  ) -> None:
    """`decode_fn` takes batches of `num_shards` (devices) x up to `batch_size` sentences, and
    returns `nbest` hypotheses per sentence (with source positions, for `alignments`).
    `log_progress=False` (the server) logs neither progress nor truncations. `rows_per_shard`:
    the sentences per device a batch may have (default: the powers of two up to `batch_size`).
    `source_prefix`: ids every source starts with (a multilingual model's target-language tag,
    data/tokenizer.source_prefix); `translate_nbest` can set them line by line.
    `reserved_ids` (the tags) are dropped from the encoded text: a line holding "<2fr>" cannot
    pick another language than the one asked for. `constrained_decode` (the beam search that
    must output given terms, by beam size) serves the lines given terms; `beam_size` is the beam
    it widens from (constraints.beam_for), `max_output_len` (source length with EOS -> the
    longest output) what the terms must fit in. `first_id`: every output's first token, forced
    (an M2M100 model's target-language token: decode_fn then takes it per row); it is no word of
    the translation, so alignments leave it out."""
    self.first_id = first_id
    self.constrained_decode = constrained_decode
    self.beam_size = beam_size
    self.max_output_len = max_output_len or (lambda n: n + 50)
    self.source_prefix = tuple(source_prefix)
    self.reserved_ids = frozenset(reserved_ids)
    id_to_piece = getattr(tokenizer, "id_to_piece", None)
    self._untagged = tokenizer_lib.without_pieces(
      [id_to_piece(i) for i in sorted(self.reserved_ids)] if id_to_piece else []
    )
    self.nbest = nbest
    self.log_progress = log_progress
    self.alignments = alignments
    self.tokenizer = tokenizer
    self.decode_fn = decode_fn
    self.batch_size = batch_size
    self.num_shards = num_shards
    self.max_src_len = max_src_len
    self.buckets = bucket_lengths(max_src_len)
    self.log_every_secs = log_every_secs
    self.stats = TranslationStats()
    self.truncated: list[int] = []  # the last call's lines cut to max_src_len (their indices)
    if rows_per_shard is None:
      rows_per_shard = [next_power_of_two(n) for n in range(1, batch_size + 1)]
    self.rows_per_shard = sorted({min(r, batch_size) for r in rows_per_shard} | {batch_size})

  def _encode(self, lines: Sequence[str], prefixes: Sequence[Sequence[int]]) -> list[list[int]]:
    """Source ids, after each line's prefix, ending in EOS (as the training batches have it)."""
    encode_batch = getattr(self.tokenizer, "encode_batch", None)
    lines = [self._untagged(s) for s in lines]
    ids = encode_batch(list(lines)) if encode_batch else [self.tokenizer.encode(s) for s in lines]
    if self.reserved_ids:
      ids = [[i for i in x if i not in self.reserved_ids] for x in ids]
    return [list(p) + list(x) + [EOS_ID] for p, x in zip(prefixes, ids, strict=True)]

  def translate(self, lines: Sequence[str]) -> list[str]:
    """One translation per line (the best of the n), in order; blank lines stay blank."""
    return [hyps[0].text for hyps in self.translate_nbest(lines)]

  def batch_rows(self, num_lines: int) -> int:
    """The rows of the device batches `num_lines` lines are decoded in: per device the configured
    batch, or fewer (the smallest of `rows_per_shard` that holds them: a few sizes, to bound the
    number of compiled shapes) when there are too few lines to fill every device's batch."""
    needed = -(-num_lines // self.num_shards)
    return (
      next(r for r in self.rows_per_shard if r >= min(needed, self.batch_size)) * self.num_shards
    )

  def batch_shapes(self) -> list[tuple[int, int]]:
    """Every (rows, padded source length) a call can decode: what a server compiles up front."""
    return [(r * self.num_shards, length) for r in self.rows_per_shard for length in self.buckets]

  def translate_nbest(
    self,
    lines: Sequence[str],
    line_numbers: Sequence[int] | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    constraints: Sequence[Sequence[str]] | None = None,
  ) -> list[list[Hypothesis]]:
    """`nbest` hypotheses per line, best first, in input order; a blank line gets `nbest` empty
    ones (score 0.0, empty alignment). `line_numbers` (default 0, 1, ...) are what sampling keys
    its draws by: a line sampled as line i of one call is sampled so as line i of another.
    `prefixes`: each line's source prefix (the server's requests into several languages);
    default `source_prefix` for every line. `constraints`: each line's terms, which its
    translations must contain (constrained.py; lines without terms decode as without them, and
    the figures go to `stats.constraints`)."""
    if constraints is not None and len(constraints) != len(lines):
      raise ValueError(f"{len(constraints)} lines of terms for {len(lines)} lines.")
    numbers = range(len(lines)) if line_numbers is None else line_numbers
    if prefixes is None:
      prefixes = [self.source_prefix] * len(lines)
    start = time.time()
    self.stats = TranslationStats(num_lines=len(lines))
    empty = Hypothesis("", 0.0, "" if self.alignments else None)
    outputs: list[list[Hypothesis]] = [[empty] * self.nbest for _ in lines]
    todo = [i for i, line in enumerate(lines) if line.strip()]
    self.stats.num_empty = len(lines) - len(todo)
    encoded = self._encode([lines[i] for i in todo], [prefixes[i] for i in todo])
    sources = dict(zip(todo, encoded, strict=True))

    self._truncate(todo, sources, len(lines))
    terms: dict[int, list[list[int]]] = {}
    problems = constraints_lib.TermProblems()
    if constraints is not None:
      if self.constrained_decode is None:
        raise ValueError("This translator has no constrained search.")
      terms = constraints_lib.encoded_terms(
        self.tokenizer,
        todo,
        sources,
        constraints,
        # Room for EOS after the terms (and a forced first token before), in each line's
        # longest output.
        lambda n: self.max_output_len(n) - 1 - (self.first_id is not None),
        self.reserved_ids,
        problems,
      )
    plain = [i for i in todo if i not in terms]
    # Longest first: a batch that does not fit in memory fails at once, and the ETA errs long.
    batches = self._batches(sorted(plain, key=lambda i: len(sources[i]), reverse=True), None)
    # Each line's beam: a slot for every bank (pieces met: 0 .. all), in a few sizes.
    beams = {
      i: constraints_lib.beam_for(sum(map(len, t)), self.beam_size) for i, t in terms.items()
    }
    for beam in sorted(set(beams.values())):
      order = [i for i in terms if beams[i] == beam]
      batches += self._batches(sorted(order, key=lambda i: len(sources[i]), reverse=True), beam)
    done, last_log = 0, start
    for batch, num_rows, with_beam in batches:
      decoded = self._decode(batch, num_rows, with_beam, sources, numbers, terms)
      for row, i in enumerate(batch):
        outputs[i] = self._hypotheses(decoded, row, sources[i], len(prefixes[i]))
      self.stats.num_batches += 1
      done += len(batch)
      now = time.time()
      if self.log_progress and (now - last_log >= self.log_every_secs or done == len(todo)):
        rate = done / max(now - start, 1e-9)
        logging.info(
          "Translated %d/%d sentences (%.1f sentences/s, ETA %s).",
          done,
          len(todo),
          rate,
          console.format_seconds((len(todo) - done) / rate),
        )
        last_log = now
    self.stats.seconds = time.time() - start
    if constraints is not None:
      texts = [hyps[0].text for hyps in outputs]
      self.stats.constraints = constraints_lib.figures(
        texts, constraints, problems, list(beams.values()), self.beam_size
      )
    return outputs

  def _truncate(self, todo: list[int], sources: dict[int, list[int]], num_lines: int) -> None:
    """Cuts every source longer than the model takes (keeping its EOS), in place; counts them
    (`stats`, `truncated`) and says so in one warning line naming the first few."""
    truncated = [i for i in todo if len(sources[i]) > self.max_src_len]
    for i in truncated:
      sources[i] = sources[i][: self.max_src_len - 1] + [EOS_ID]
    self.stats.num_truncated = len(truncated)
    self.truncated = truncated
    if truncated and self.log_progress:
      named = ", ".join(str(i + 1) for i in truncated[:_NAMED_TRUNCATIONS])
      more = "" if len(truncated) <= _NAMED_TRUNCATIONS else ", ..."
      logging.warning(
        "%d of %d lines are longer than %d tokens (EOS included) and were truncated: line %s%s.",
        len(truncated),
        num_lines,
        self.max_src_len,
        named,
        more,
      )

  def _decode(
    self,
    batch: list[int],
    num_rows: int,
    with_beam: int | None,
    sources: dict[int, list[int]],
    numbers: Sequence[int],
    terms: dict[int, list[list[int]]],
  ) -> Any:
    """One device batch of `batch`'s lines, padded to `num_rows` rows and their length bucket,
    through the plain search (`with_beam` None) or the constrained one of that beam."""
    length = bucket(max(len(sources[i]) for i in batch), self.buckets)
    rows = batch + [-1] * (num_rows - len(batch))
    # Filler rows (-1) are all padding; the search skips them (decode.max_output_lengths).
    inputs = np.full((len(rows), length), PAD_ID, np.int32)  # [batch, bucket]
    line_ids = np.full((len(rows),), -1, np.int32)  # [batch]
    for row, i in enumerate(batch):
      inputs[row, : len(sources[i])] = sources[i]
      line_ids[row] = numbers[i]
    # Each row's forced first output, for a search made with force_first.
    first = () if self.first_id is None else (np.full_like(line_ids, self.first_id),)
    if with_beam is None:
      return self.decode_fn(inputs, line_ids, *first)
    packed = constraints_lib.pack([terms[i] if i >= 0 else [] for i in rows])
    return self.constrained_decode(with_beam)(inputs, line_ids, *first, *packed)

  def _batches(self, order: list[int], beam: int | None) -> list[tuple[list[int], int, int | None]]:
    """`order`'s lines as batches: (lines, rows of the device batch, the constrained search's
    beam or None for the plain search)."""
    step = self.batch_rows(len(order)) if order else 1
    return [(order[f : f + step], step, beam) for f in range(0, len(order), step)]

  def _hypotheses(
    self, decoded: Any, row: int, source: Sequence[int], prefix_len: int = 0
  ) -> list[Hypothesis]:
    """Row `row` of a decoded batch as `nbest` Hypothesis objects. The source's first
    `prefix_len` ids are tags, which alignments leave out: they are no source word."""
    if isinstance(decoded, np.ndarray | jax.Array):  # ids only: a stand-in decoder
      tokens, scores, positions = np.asarray(decoded)[row][None], np.zeros(1), None
    else:
      shape = (self.nbest, -1)
      tokens = np.asarray(decoded.tokens[row]).reshape(shape)  # [n, out_len]
      scores = np.asarray(decoded.normalized_scores[row]).reshape(self.nbest)
      positions = decoded.source_positions
      positions = None if positions is None else np.asarray(positions[row]).reshape(shape)
    out = []
    for k in range(tokens.shape[0]):
      ids = tokens[k].tolist()
      # A line break inside a translation would shift every later line.
      text = files.one_line(self.tokenizer.decode(ids))
      alignment = None
      if self.alignments:
        row_positions = positions[k] if positions is not None else np.zeros([0], np.int32)
        if self.first_id is not None and ids[:1] == [self.first_id]:  # no word: left out
          ids, row_positions = ids[1:], row_positions[1:]
        # Positions into the words after the tags; a piece aligned to a tag gets -1 (none).
        shifted = np.where(row_positions >= prefix_len, row_positions - prefix_len, -1)
        alignment = alignments_lib.pharaoh_of(
          self.tokenizer, source[prefix_len:], ids, shifted.tolist()
        )
      out.append(Hypothesis(text, float(scores[k]), alignment))
    return out


def make_translator(
  parts: Components,
  params: Any,
  *,
  replicated: bool = False,
  beam_size: int | None = None,
  nbest: int = 1,
  alignments: bool = False,
  log_progress: bool = True,
  rows_per_shard: Sequence[int] | None = None,
  target_lang: str | None = None,
  source_lang: str | None = None,
) -> Translator:
  """The one way to make a Translator (asked by decoding/session.py's Session, which keeps
  them): for `parts` (a command's Components; tests' Components.around) with
  the search, length rule and batch size of config.decode (`beam_size` overrides the beam and
  asks for beam search, e.g. greedy dev BLEU during training). `params` may be a
  model.ensemble.Ensemble; `replicated`: already on every local device (decode.decode_fn).
  `nbest` hypotheses per line; `alignments` adds word alignments from
  config.decode.alignment_layer's cross-attention. `target_lang`: a multilingual model's output
  language, resolved by the caller (a Request's; evaluation's own directions); `source_lang`: a
  many-to-many model's input language (language_ids)."""
  prefix, first_id = language_ids(parts, target_lang, source_lang)
  decode_config, model = parts.config.decode, parts.model
  layer = -1
  if alignments:
    setting = int(decode_config.get("alignment_layer", -1))
    layer = alignments_lib.alignment_layer(setting, model.cfg.decoder_depth)
  search = decode.SearchConfig.from_config(
    decode_config, beam_size=beam_size, nbest=nbest, alignment_layer=layer
  )
  if first_id is not None:
    search = dataclasses.replace(search, force_first=True)
  if not replicated:
    params = parallel.replicate(params)  # once, for the plain and the constrained search
  max_len = model.cfg.max_len

  def max_output_len(source_len: int) -> int:
    return decode.decode_length_bound(source_len, search.max_len_offset, max_len)

  return Translator(
    parts.tokenizer,
    decode.decode_fn(model, params, search),
    batch_size=int(decode_config.batch_size),
    max_src_len=parts.max_src_len,
    num_shards=jax.device_count(),
    nbest=nbest,
    alignments=alignments,
    log_progress=log_progress,
    rows_per_shard=rows_per_shard,
    source_prefix=prefix,
    reserved_ids=reserved_ids(parts),
    constrained_decode=(
      decode.constrained_decode_fn(model, params, search) if search.method == "beam" else None
    ),
    beam_size=search.beam_size,
    max_output_len=max_output_len,
    first_id=first_id,
  )
