"""The vocabulary of a transformers Marian model (OPUS-MT): two SentencePiece models, one id map.

A Marian folder holds `source.spm` (splits source text into pieces), `target.spm` (splits and
joins target text) and `vocab.json` (piece -> id, one map for both sides, so the model ties one
embedding matrix across source, target and logits). transformers' MarianTokenizer reads the same
three files (tokenization_marian.py: `_tokenize` cuts a leading `>>xx<<` language code, encodes
the rest with the current side's SentencePiece model as pieces, and looks each piece up in
vocab.json, `<unk>` when absent).

Ids are renumbered to this package's (model/tokens.py): Marian's `<pad>` (its last id, also its
decoder start) becomes 0, `</s>` (0) becomes 1, `<unk>` (1) becomes 2, and every other piece
keeps its order from 3 on. `marian_order` is that map; export/marian.py permutes the embedding
rows with it, so a model and its vocabulary are renumbered together and the round trip is exact.

`PairVocabulary` has the methods of data/tokenizer.Tokenizer that the stages use, so a run with
either kind of vocabulary reads, trains, decodes, scores and serves the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

from flaxformer_nmt import errors
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.runtime import files

# The files of a Marian vocabulary, in a folder (a transformers model folder, or a run's
# `vocabulary/`).
FILES = ("source.spm", "target.spm", "vocab.json")
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
# A Marian target-language code: `>>de<<`, `>>por_Latn<<`.
LANGUAGE_CODE = re.compile(r">>[^<>\s]+<<")


def is_pair_vocabulary(path: str) -> bool:
  """Whether `path` is a folder holding a Marian vocabulary's three files."""
  return os.path.isdir(path) and all(os.path.isfile(os.path.join(path, f)) for f in FILES)


def read_vocab_json(path: str) -> dict[str, int]:
  """vocab.json's piece -> id map; DataError naming the file if it is not one."""
  try:
    with open(path, encoding="utf-8") as f:
      vocab = json.load(f)
  except (OSError, ValueError) as e:
    raise errors.DataError(f"{path}: not a vocab.json ({e}).") from None
  if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
    raise errors.DataError(f"{path}: not a vocab.json (a map from pieces to ids).")
  ids = sorted(vocab.values())
  if ids != list(range(len(ids))):
    raise errors.DataError(f"{path}: its ids are not 0..{len(ids) - 1}, each once.")
  for piece in (PAD, EOS, UNK):
    if piece not in vocab:
      raise errors.DataError(f"{path}: has no {piece!r} piece.")
  return vocab


def marian_order(vocab: dict[str, int]) -> np.ndarray:
  """[V] int: the Marian id of each of our ids (`<pad>`, `</s>`, `<unk>`, then the rest in
  Marian's order)."""
  special = [vocab[PAD], vocab[EOS], vocab[UNK]]
  rest = sorted(set(vocab.values()) - set(special))
  return np.asarray(special + rest, np.int64)


def digest(path: str) -> str:
  """A vocabulary's identity: SHA-256 of a SentencePiece model file, or of a Marian folder's
  three files (nothing else in the folder counts: a model folder and a run's copy agree)."""
  if not os.path.isdir(path):
    return files.sha256(path)
  parts = "".join(files.sha256(os.path.join(path, name)) for name in FILES)
  return hashlib.sha256(parts.encode()).hexdigest()


def model_type(path: str) -> str:
  """How the SentencePiece model at `path` was trained ("unigram", OPUS-MT's; "bpe", ...), read
  from its trainer spec: an imported run's `data.vocab_model_type` says what its vocabulary is."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top

  proto = sentencepiece_model_pb2.ModelProto()
  with open(path, "rb") as f:
    proto.ParseFromString(f.read())
  return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type).lower()


def _load_spm(path: str) -> spm.SentencePieceProcessor:
  try:
    return spm.SentencePieceProcessor(model_file=path)
  except (OSError, RuntimeError) as e:  # a torn file, a git-LFS pointer
    detail = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
    raise errors.DataError(f"{path}: not a SentencePiece model ({detail}).") from None


class PairVocabulary:
  """Text <-> our ids with a Marian folder's source and target SentencePiece models."""

  def __init__(self, folder: str) -> None:
    if not is_pair_vocabulary(folder):
      missing = [f for f in FILES if not os.path.isfile(os.path.join(folder, f))]
      raise errors.DataError(f"{folder}: not a Marian vocabulary (no {', '.join(missing)}).")
    self.model_path = folder
    self.fingerprint = digest(folder)[:16]
    self._source = _load_spm(os.path.join(folder, "source.spm"))
    self._target = _load_spm(os.path.join(folder, "target.spm"))
    vocab = read_vocab_json(os.path.join(folder, "vocab.json"))
    order = marian_order(vocab)
    self.marian_ids = order  # ours -> Marian
    ours = np.empty_like(order)
    ours[order] = np.arange(len(order))
    by_marian = {i: p for p, i in vocab.items()}
    self._pieces = [by_marian[int(m)] for m in order]  # our id -> piece
    self._ids = {p: int(ours[i]) for p, i in vocab.items()}  # piece -> our id
    self._unk = self._ids[UNK]

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def _encode(self, sp: spm.SentencePieceProcessor, text: str) -> list[int]:
    code = []
    match = LANGUAGE_CODE.match(text)
    if match:  # MarianTokenizer.remove_language_code: a leading >>xx<< is one piece
      code = [self._ids.get(match.group(), self._unk)]
      text = text[match.end() :]
    return code + [self._ids.get(p, self._unk) for p in sp.encode(text, out_type=str)]

  def encode(self, text: str) -> list[int]:
    """Our ids of source `text`, without EOS (the batcher appends it)."""
    return self._encode(self._source, text)

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    del num_threads  # pieces are looked up in Python anyway
    return [self._encode(self._source, t) for t in texts]

  def encode_target(self, text: str) -> list[int]:
    """Our ids of target `text` (a reference, a term): the target SentencePiece model's."""
    return self._encode(self._target, text)

  def encode_target_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    del num_threads
    return [self._encode(self._target, t) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    """Target text of `ids` up to the first EOS; PAD and language codes are dropped.

    As MarianTokenizer.convert_tokens_to_string: SentencePiece joins the pieces, then any "\u2581"
    left is a space. A piece of vocab.json that target.spm lacks (OPUS-MT vocabularies hold both
    sides' pieces) reaches SentencePiece as an unknown string, whose word boundaries it keeps as
    "\u2581": `\u2581newspaper\u2581newspaper` must read `newspaper newspaper`.
    """
    pieces = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i != PAD_ID and not LANGUAGE_CODE.fullmatch(self._pieces[i]):
        pieces.append(self._pieces[i])
    return self._target.decode_pieces(pieces).replace("\u2581", " ").strip()

  def id_to_piece(self, i: int) -> str:
    return self._pieces[int(i)]

  def piece_id(self, piece: str) -> int | None:
    return self._ids.get(piece)

  def reserved_ids(self) -> list[int]:
    """The target-language codes (`>>de<<`) of a multi-target model."""
    return [i for i, p in enumerate(self._pieces) if LANGUAGE_CODE.fullmatch(p)]
