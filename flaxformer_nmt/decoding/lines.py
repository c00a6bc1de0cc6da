"""What a translator works with, line by line: the tokenizer it needs, the hypotheses and figures it
returns and the decode functions it calls (translator.py, which also owns its batches' padded
shapes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

# ([batch, src_len] int32 source ids, [batch] int32 input line numbers (-1: filler row)) ->
# the search's result (decode.decode_batch's, as numpy or jax arrays), or just the output ids
# [batch, out_len] (EOS, then PAD) for a decoder that has no scores (the tests' stand-ins).
BatchDecodeFn = Callable[[np.ndarray, np.ndarray], Any]
# The constrained search with a given beam: (beam) -> (source ids, line numbers, then the terms as
# constraints.pack's arrays) -> the search's result.
ConstrainedDecodeFn = Callable[[int], Callable[..., Any]]


class TextTokenizer(Protocol):
  """What translation needs of `tokenizer.Tokenizer` (tests pass a stub); alignments also call
  `id_to_piece`."""

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One output for one input line."""

  text: str
  score: float  # what the search ranks by: log-probability / length penalty (0.0 for no output)
  alignment: str | None = None  # Pharaoh "i-j ..." when alignments were asked for


@dataclasses.dataclass
class TranslationStats:
  num_lines: int = 0
  num_empty: int = 0
  num_truncated: int = 0
  num_batches: int = 0
  seconds: float = 0.0
  # --constraints: what was asked and met (constraints.figures); None without.
  constraints: dict[str, Any] | None = None

  @property
  def sentences_per_s(self) -> float:
    translated = self.num_lines - self.num_empty
    return translated / self.seconds if self.seconds > 0 else 0.0

  def as_dict(self) -> dict[str, Any]:
    out = {**dataclasses.asdict(self), "sentences_per_s": self.sentences_per_s}
    if out["constraints"] is None:
      del out["constraints"]
    return out
