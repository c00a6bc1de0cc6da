"""The vocabulary of a transformers M2M100 or NLLB-200 model: one SentencePiece model, fairseq's
dictionary, and a token per language.

An M2M100 folder holds `sentencepiece.bpe.model` (splits text into pieces), `vocab.json` (piece
-> fairseq id: `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, then the pieces) and tokenizer_config.json
(`language_codes`: which list of languages). transformers' M2M100Tokenizer
(tokenization_m2m_100.py) reads them so:
- a language's token `__xx__` has the id len(vocab.json) + its index in the list
  (FAIRSEQ_LANGUAGE_CODES: the 100 of M2M100's paper, or WMT21's 8), not a piece of vocab.json;
- a source is [its language's token] + pieces + `</s>`; a reference is [its language's token] +
  pieces + `</s>`, and generation forces the target language's token as the first output;
- the model's embedding has more rows than that (fairseq pads its dictionary with
  `madeupwordNNNN` entries); they are kept, so every row has our id.

An NLLB-200 folder (NllbTokenizer; its checkpoints are M2M100's architecture) holds the same
`sentencepiece.bpe.model` but no vocab.json: its dictionary is tokenizer.json's (`model.vocab`, the
pieces at fairseq's ids, spm id + 1, and `added_tokens`: the four specials, `<mask>` and its
202 language codes), and a language's token is its code itself (`eng_Latn`), listed in
tokenizer_config.json (`additional_special_tokens`, transformers 5's `extra_special_tokens`). Text
is split by the SentencePiece model in either case, as fairseq split the training data.

Ids are renumbered to this package's (model/tokens.py): `<pad>` (1) becomes 0, `</s>` (2) 1,
`<unk>` (3) 2, and every other row keeps its order from 3 on (`<s>` first).
`FairseqVocabulary.fairseq_ids` is that map; export/m2m100.py permutes the embedding rows with it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

from flaxformer_nmt import errors
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.runtime import files

SPM = "sentencepiece.bpe.model"
# What each kind's folder holds, the dictionary second; FILES is every name either kind keeps.
KIND_FILES = {
  "m2m100": (SPM, "vocab.json", "tokenizer_config.json"),
  "nllb": (SPM, "tokenizer.json", "tokenizer_config.json"),
}
FILES = (SPM, "vocab.json", "tokenizer_config.json", "tokenizer.json")
TAG_FORMATS = {"m2m100": "__{}__", "nllb": "{}"}  # a language's token: `__de__`, `deu_Latn`
BOS, PAD, EOS, UNK, MASK = "<s>", "<pad>", "</s>", "<unk>", "<mask>"
# transformers' FAIRSEQ_LANGUAGE_CODES (tokenization_m2m_100.py): the token of language i of a
# list has the id len(vocab.json) + i.
LANGUAGE_CODES = {
  "m2m100": (
    "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu "
    "ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr "
    "ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk "
    "ur uz vi wo xh yi yo zh zu"
  ).split(),
  "wmt21": "en ha is ja cs ru zh de".split(),
}


def language_token(lang: str) -> str:
  """M2M100's token of a language: `__de__`."""
  return f"__{lang}__"


def kind(path: str) -> str | None:
  """ "m2m100" or "nllb" for a folder holding that model's vocabulary files, else None."""
  if not os.path.isdir(path):
    return None
  for name, names in KIND_FILES.items():
    if all(os.path.isfile(os.path.join(path, f)) for f in names[:2]):
      return name
  return None


def is_fairseq_vocabulary(path: str) -> bool:
  """Whether `path` is a folder holding an M2M100 or NLLB vocabulary's files."""
  return kind(path) is not None


def folder_files(path: str) -> tuple[str, ...]:
  """The files of the vocabulary folder at `path` (what a run copies, an export writes)."""
  return KIND_FILES[kind(path) or "m2m100"]


def digest(path: str) -> str:
  """The vocabulary's identity: SHA-256 over its SentencePiece model's and dictionary's SHA-256s
  and its list of language codes (not the rest of tokenizer_config.json: its default languages
  change no id)."""
  parts = "".join(files.sha256(os.path.join(path, name)) for name in folder_files(path)[:2])
  tok = files.read_json_object(os.path.join(path, "tokenizer_config.json"))
  parts += str(tok.get("language_codes", "m2m100"))
  return hashlib.sha256(parts.encode()).hexdigest()


def _m2m100_dictionary(folder: str) -> tuple[dict[str, int], list[str]]:
  """vocab.json's pieces, M2M100's language tokens after them; the language codes."""
  vocab_path = os.path.join(folder, "vocab.json")
  vocab = files.read_json_object(vocab_path)
  if not vocab or not all(isinstance(i, int) for i in vocab.values()):
    raise errors.DataError(f"{vocab_path}: not a vocab.json (a map from pieces to ids).")
  tok = files.read_json_object(os.path.join(folder, "tokenizer_config.json"))
  codes = str(tok.get("language_codes", "m2m100"))
  if codes not in LANGUAGE_CODES:
    raise errors.DataError(
      f"{folder}/tokenizer_config.json: language_codes {codes!r} is none of "
      f"{', '.join(LANGUAGE_CODES)}."
    )
  languages = list(LANGUAGE_CODES[codes])
  tokens = {language_token(lang): len(vocab) + k for k, lang in enumerate(languages)}
  return {**vocab, **tokens}, languages


def _nllb_dictionary(folder: str) -> tuple[dict[str, int], list[str]]:
  """tokenizer.json's pieces and added tokens; the language codes tokenizer_config.json lists."""
  path = os.path.join(folder, "tokenizer.json")
  doc = files.read_json_object(path)
  vocab = (doc.get("model") or {}).get("vocab")
  added = doc.get("added_tokens") or []
  if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
    raise errors.DataError(f"{path}: has no BPE vocabulary (model.vocab, pieces to ids).")
  dictionary = {**vocab, **{a["content"]: int(a["id"]) for a in added if "content" in a}}
  tok = files.read_json_object(os.path.join(folder, "tokenizer_config.json"))
  # transformers 5 writes the list as extra_special_tokens (a dict there names other tokens).
  listed = [
    x
    for key in ("extra_special_tokens", "additional_special_tokens")
    if isinstance(tok.get(key), list)
    for x in tok[key]
  ]
  languages = [str(c) for c in listed if str(c) in dictionary]
  if not languages:
    raise errors.DataError(
      f"{folder}/tokenizer_config.json: lists no language code of {path} "
      "(additional_special_tokens, such as eng_Latn)."
    )
  return dictionary, languages


class FairseqVocabulary:
  """Text <-> our ids with an M2M100 folder's SentencePiece model, dictionary and language tokens
  (the methods of data/tokenizer.Tokenizer that the stages use)."""

  def __init__(self, folder: str, model_vocab_size: int | None = None) -> None:
    self.kind = kind(folder)
    if self.kind is None:
      wanted = " or ".join("+".join(names[:2]) for names in KIND_FILES.values())
      raise errors.DataError(f"{folder}: not an M2M100 or NLLB vocabulary (no {wanted}).")
    self.model_path = folder
    self.fingerprint = digest(folder)[:16]
    self.tag_format = TAG_FORMATS[self.kind]
    path = os.path.join(folder, SPM)
    try:
      self._spm = spm.SentencePieceProcessor(model_file=path)
    except (OSError, RuntimeError) as e:
      raise errors.DataError(f"{path}: not a SentencePiece model ({e}).") from None
    read = _nllb_dictionary if self.kind == "nllb" else _m2m100_dictionary
    vocab, self.languages = read(folder)
    where = os.path.join(folder, KIND_FILES[self.kind][1])
    for piece, want in ((BOS, 0), (PAD, 1), (EOS, 2), (UNK, 3)):
      if vocab.get(piece) != want:
        raise errors.DataError(f"{where}: {piece!r} is not id {want}, as fairseq's are.")
    pieces = {i: p for p, i in vocab.items()}
    size = max(model_vocab_size or 0, max(pieces) + 1)
    madeup = iter(range(size))
    theirs = [pieces.get(i) or f"madeupword{next(madeup):04d}" for i in range(size)]
    special = [vocab[PAD], vocab[EOS], vocab[UNK]]
    order = np.asarray(special + [i for i in range(size) if i not in special], np.int64)
    self.fairseq_ids = order  # ours -> fairseq's
    self._pieces = [theirs[int(i)] for i in order]  # our id -> piece
    self._ids = {p: j for j, p in enumerate(self._pieces)}  # piece -> our id
    self._unk = self._ids[UNK]
    self._language_ids = {self._ids[self.tag_format.format(lang)] for lang in self.languages}
    # fairseq's padding rows are no piece: a model that outputs one (untrained) prints nothing.
    first_padding_row = max(pieces) + 1
    padding_rows = {j for j, i in enumerate(order.tolist()) if i >= first_padding_row}
    self._silent = self._language_ids | padding_rows | {self._ids[BOS], self._unk}
    if MASK in self._ids:  # NLLB's `<mask>`: no piece of text either
      self._silent.add(self._ids[MASK])

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def _encode(self, text: str) -> list[int]:
    return [self._ids.get(p, self._unk) for p in self._spm.encode(text, out_type=str)]

  def encode(self, text: str) -> list[int]:
    """Our ids of `text`'s pieces, without a language token or EOS (the caller adds them)."""
    return self._encode(text)

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    del num_threads  # pieces are looked up in Python anyway
    return [self._encode(t) for t in texts]

  encode_target = encode
  encode_target_batch = encode_batch

  def language_id(self, lang: str) -> int | None:
    """Our id of `lang`'s token (`__de__`, `deu_Latn`), None if the model has none."""
    return self._ids.get(self.tag_format.format(lang)) if lang in self.languages else None

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids` up to the first EOS; PAD, `<s>`, `<unk>`, language tokens and fairseq's
    padding rows are dropped, as M2M100Tokenizer.decode(..., skip_special_tokens=True) drops the
    special ones."""
    pieces = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i != PAD_ID and i not in self._silent:
        pieces.append(self._pieces[i])
    return self._spm.decode_pieces(pieces)

  def id_to_piece(self, i: int) -> str:
    return self._pieces[int(i)]

  def piece_id(self, piece: str) -> int | None:
    return self._ids.get(piece)

  def reserved_ids(self) -> list[int]:
    """The language tokens: never a term of a constraint, never shown in output."""
    return sorted(self._language_ids)
