"""Terminology constraints: each line's terms as token arrays, and how a hypothesis meets them.

A line's terms (target-language words or phrases) are encoded with the shared vocabulary, each on
its own, as the tokenizer writes them inside a sentence ("▁Hund"). The search (constrained.py)
must output every term's pieces contiguously. What it tracks per hypothesis is, for each term,
how many of its first pieces the output ends with (Knuth-Morris-Pratt: a broken phrase falls back
to the longest prefix that is still a suffix, so "a a b" meets "a b"); a term once complete stays
met. The number of pieces met, summed over terms, is the hypothesis's *bank* (Post & Vilar 2018;
Hu et al. 2019).

Host side: `encode_terms` (what cannot be encoded or cannot fit is reported, not decoded),
`pack` (a batch's terms as padded arrays, the borders precomputed). Device side: `advance`
(the tracker's transition, vectorised over hypotheses and candidate tokens) and the counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from flaxformer_nmt import errors
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID, UNK_ID
from flaxformer_nmt.runtime import files

Array = jax.Array

# How many line numbers missing a term the summary names.
_NAMED_MISSING = 20


class TermTokenizer(Protocol):
  def encode_target(self, text: str) -> list[int]: ...  # terms are target text


@dataclasses.dataclass
class TermProblems:
  """Terms left out of the search, by kind: (0-based line, term) pairs."""

  not_encodable: list[tuple[int, str]] = dataclasses.field(default_factory=list)
  too_long: list[tuple[int, str]] = dataclasses.field(default_factory=list)
  blank_line: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # nothing to decode

  def summary(self) -> dict[str, list[dict[str, object]]]:
    """For the JSON summary (`terms_<kind>`): 1-based line numbers, as an editor shows them."""
    return {
      f"terms_{kind}": [{"line": i + 1, "term": term} for i, term in getattr(self, kind)]
      for kind in ("not_encodable", "too_long", "blank_line")
      if getattr(self, kind)
    }


def read_terms(path: str, num_lines: int | None = None, of: str = "") -> list[list[str]]:
  """A --constraints file: one line per input line, its terms separated by tabs (an empty line:
  none). ConfigError when it has another number of lines than `of` (`num_lines`)."""
  terms = [[t.strip() for t in line.split("\t") if t.strip()] for line in files.read_lines(path)]
  if num_lines is not None and len(terms) != num_lines:
    raise errors.ConfigError(
      f"--constraints={path} has {len(terms)} lines and {of} {num_lines}: one line of terms "
      "(tab-separated; empty for none) per line."
    )
  return terms


def encode_terms(
  tokenizer: TermTokenizer,
  terms: Sequence[str],
  *,
  line: int,
  max_pieces: int,
  reserved_ids: frozenset[int] = frozenset(),
  problems: TermProblems,
) -> list[list[int]]:
  """The pieces of each term the search can be asked for, in order.

  Left out, and recorded in `problems`: a term that encodes to nothing, to an unknown piece
  (a character the vocabulary lacks, which the output could never spell) or to a reserved id
  (a language tag); and, once the pieces so far fill `max_pieces` (the line's output length
  less EOS), every term that would not fit.
  """
  out: list[list[int]] = []
  used = 0
  for term in terms:
    ids = tokenizer.encode_target(term) if term.strip() else []
    if not ids or UNK_ID in ids or EOS_ID in ids or PAD_ID in ids or reserved_ids & set(ids):
      problems.not_encodable.append((line, term))
      continue
    if used + len(ids) > max_pieces:
      problems.too_long.append((line, term))
      continue
    out.append(ids)
    used += len(ids)
  return out


class Constraints(NamedTuple):
  """A batch's terms on device. T: terms per sentence (padded), L: pieces per term (padded)."""

  tokens: Array  # [batch, T, L] int32 each term's pieces; -1 past its end
  lengths: Array  # [batch, T] int32 pieces per term; 0 for a padding term (met from the start)
  borders: Array  # [batch, T, L + 1, L] bool: b is a border of the term's first q pieces

  @property
  def totals(self) -> Array:
    """[batch] pieces to meet in all."""
    return jnp.sum(self.lengths, axis=-1)


def _bucket(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def _borders(term: Sequence[int], width: int) -> np.ndarray:
  """[width + 1, width] bool: row q marks every b < len with term[:b] a suffix of term[:q] (b = q
  included): where matching may go on after q pieces matched (KMP's failure chain)."""
  out = np.zeros((width + 1, width), bool)
  for q in range(len(term) + 1):
    for b in range(min(q, len(term) - 1) + 1):
      if tuple(term[:b]) == tuple(term[q - b : q]):
        out[q, b] = True
  return out


def pack(per_row: Sequence[Sequence[Sequence[int]]]) -> tuple[np.ndarray, ...]:
  """Each row's terms (lists of piece ids; a filler row has none) as the arrays of `Constraints`,
  padded to powers of two so that few shapes are compiled."""
  terms = _bucket(max((len(t) for t in per_row), default=1))
  width = _bucket(max((len(p) for t in per_row for p in t), default=1))
  rows = len(per_row)
  tokens = np.full((rows, terms, width), -1, np.int32)
  lengths = np.zeros((rows, terms), np.int32)
  borders = np.zeros((rows, terms, width + 1, width), bool)
  for r, row in enumerate(per_row):
    for i, pieces in enumerate(row):
      tokens[r, i, : len(pieces)] = pieces
      lengths[r, i] = len(pieces)
      borders[r, i] = _borders(pieces, width)
  return tokens, lengths, borders


def advance(c: Constraints, progress: Array, token: Array) -> Array:
  """Each term's progress after one more output token.

  progress: [batch, n, T] pieces matched (== length: met, which stays); token: [batch, n].
  Returns [batch, n, T]: the longest prefix of the term that the output now ends with.
  """
  lengths = c.lengths[:, None, :]  # [batch, 1, T]
  match = c.tokens[:, None, :, :] == token[:, :, None, None]  # [batch, n, T, L]
  q = jnp.minimum(progress, c.tokens.shape[-1])  # [batch, n, T]
  borders = jnp.take_along_axis(c.borders[:, None], q[..., None, None], axis=3)[:, :, :, 0]
  width = c.tokens.shape[-1]  # borders: [batch, n, T, L]
  extended = jnp.where(borders & match, jnp.arange(1, width + 1), 0)  # [batch, n, T, L]
  new = jnp.max(extended, axis=-1).astype(jnp.int32)  # [batch, n, T]
  return jnp.where(progress >= lengths, lengths, new)


def met(c: Constraints, progress: Array) -> Array:
  """[batch, n, T] -> [batch, n]: pieces met, partial phrases counted (the bank)."""
  return jnp.sum(jnp.minimum(progress, c.lengths[:, None, :]), axis=-1)


def next_pieces(c: Constraints, progress: Array) -> Array:
  """[batch, n, T] -> [batch, n, T]: the piece that would advance each unmet term, -1 if met."""
  q = jnp.minimum(progress, c.tokens.shape[-1] - 1)[..., None]  # [batch, n, T, 1]
  piece = jnp.take_along_axis(c.tokens[:, None], q, axis=-1)[..., 0]  # [batch, n, T]
  return jnp.where(progress < c.lengths[:, None, :], piece, -1)


def encoded_terms(
  tokenizer: TermTokenizer,
  todo: Sequence[int],
  sources: dict[int, list[int]],
  constraints: Sequence[Sequence[str]],
  max_pieces: Callable[[int], int],
  reserved_ids: frozenset[int],
  problems: TermProblems,
) -> dict[int, list[list[int]]]:
  """The pieces of each decoded line's terms that the search can be asked for (`encode_terms`),
  by line; `todo`: the lines decoded (the others are blank, and their terms are recorded so),
  `sources`: their source ids, `max_pieces(source length)`: what the terms must fit in."""
  out = {}
  for i in todo:
    if constraints[i]:
      encoded = encode_terms(
        tokenizer,
        constraints[i],
        line=i,
        max_pieces=max_pieces(len(sources[i])),
        reserved_ids=reserved_ids,
        problems=problems,
      )
      if encoded:
        out[i] = encoded
  decoded = set(todo)
  blank = [i for i, c in enumerate(constraints) if c and i not in decoded]
  problems.blank_line.extend((i, t) for i in blank for t in constraints[i])
  return out


def beam_for(pieces: int, beam: int) -> int:
  """The beam a line whose terms have `pieces` pieces is searched with: at least `beam`, and a
  slot for every bank (0 .. `pieces` met), widened to a power of two so that few searches are
  compiled. Each line gets its own: one long term does not widen every line's beam."""
  return max(beam, 1 << pieces.bit_length())  # the power of two above `pieces`


def figures(
  texts: Sequence[str],
  constraints: Sequence[Sequence[str]],
  problems: TermProblems,
  beams: Sequence[int],
  beam: int,
) -> dict[str, Any]:
  """What --constraints did, for the JSON summary: terms given, and met (a substring of the best
  translation `texts`), the lines missing some (1-based, the first ones), the beams searched with
  (`beams`: each constrained line's; `beam`: the configured one, for the others), and the terms
  left out (`TermProblems.summary`)."""
  given = sum(len(c) for c in constraints)
  met = [terms_met(text, c) for text, c in zip(texts, constraints, strict=True)]
  missing = [i + 1 for i, m in enumerate(met) if not all(m)]
  out: dict[str, Any] = {
    "lines_with_terms": sum(1 for c in constraints if c),
    "terms": given,
    "terms_met": sum(map(sum, met)),
    "term_rate": sum(map(sum, met)) / given if given else 1.0,
    "beam_size": max(beams, default=beam),  # the widest
    "lines_by_beam": {str(k): beams.count(k) for k in sorted(set(beams))},
    "num_lines_missing_terms": len(missing),
    "lines_missing_terms": missing[:_NAMED_MISSING],
  }
  out.update(problems.summary())
  return out


def terms_met(text: str, terms: Sequence[str]) -> list[bool]:
  """Whether each term is a case-sensitive substring of the output line (what the user asked)."""
  return [term in text for term in terms]
