"""Word alignments in Pharaoh format ("i-j": source word i, output word j, 0-based), from the
source position each output piece attends to most (model_step.source_positions).

The model aligns pieces; a user reads words, so pieces are mapped to the words of the two texts
the user sees. Source words are the input line's, as `line.split()` counts them: a word starts at
a piece that begins with SentencePiece's "▁". Output words are the translation's, as
`text.split()` counts the decoded text, which differs in one place: SentencePiece decodes the
unknown piece `<unk>` as " ⁇ ", a word of its own, so the piece after it starts another word even
without a "▁" ("ab<unk>c" reads "ab ⁇ c": three words).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID, UNK_ID

# SentencePiece's word-start mark.
WORD_START = "\u2581"


class PieceTokenizer(Protocol):
  """What alignments need of `data.tokenizer.Tokenizer`."""

  def id_to_piece(self, i: int) -> str: ...


def word_starts(pieces: Sequence[str], unknown: Sequence[bool] = ()) -> list[int]:
  """Each piece's word index, counting words as the text's `split()` does.

  A word starts at the first piece with content after a "▁" (or at the first piece with content
  at all). A bare "▁" piece is only a space: it opens no word of its own (the text would show
  none), and is counted with the word it precedes (or, at the end, the one before). A piece marked
  in `unknown` (an `<unk>` of decoded output) is a word of its own, and the piece after it starts
  a new one.
  """
  unknown = list(unknown) or [False] * len(pieces)
  index, pending, out = -1, True, []
  for piece, is_unknown in zip(pieces, unknown, strict=True):
    if is_unknown:
      index, pending = index + 1, True
      out.append(index)
      continue
    if piece.startswith(WORD_START):
      pending = True
    if not piece.lstrip(WORD_START):
      out.append(None)
      continue
    if pending:
      index, pending = index + 1, False
    out.append(index)
  # Bare pieces take the next word's index, or the last word's, or 0 when there is no word.
  following = None
  for i in range(len(out) - 1, -1, -1):
    if out[i] is None:
      out[i] = following if following is not None else max(index, 0)
    else:
      following = out[i]
  return out  # type: ignore[return-value]


def pharaoh(source_words: Sequence[int], target_words: Sequence[int], positions) -> str:
  """ "i-j" pairs, sorted, without repeats: target piece t (word target_words[t]) aligned to
  source piece positions[t] (word source_words[...]); -1 = no alignment."""
  pairs = {
    (source_words[p], target_words[t])
    for t, p in enumerate(positions)
    if t < len(target_words) and 0 <= p < len(source_words)
  }
  return " ".join(f"{i}-{j}" for i, j in sorted(pairs))


def pharaoh_of(
  tokenizer: PieceTokenizer, source: Sequence[int], output: Sequence[int], positions
) -> str:
  """The Pharaoh alignment of one output (ids, up to EOS) to its source (ids, EOS-ended), from
  each output piece's source position."""
  source_pieces = [tokenizer.id_to_piece(int(i)) for i in source if i not in (EOS_ID, PAD_ID)]
  output_ids = [int(i) for i in output]
  end = output_ids.index(EOS_ID) if EOS_ID in output_ids else len(output_ids)
  output_ids = [i for i in output_ids[:end] if i != PAD_ID]
  output_pieces = [tokenizer.id_to_piece(i) for i in output_ids]
  target_words = word_starts(output_pieces, [i == UNK_ID for i in output_ids])
  return pharaoh(word_starts(source_pieces), target_words, list(positions))


def alignment_layer(setting: int, num_layers: int) -> int:
  """config.decode.alignment_layer as a layer index: negative counts from the top (-1 the last,
  -2 the penultimate), and a model with fewer layers than that uses its first."""
  return max(num_layers + setting, 0) if setting < 0 else setting
