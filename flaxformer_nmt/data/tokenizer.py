"""SentencePiece vocabulary shared by source and target (the paper's shared BPE vocabulary).

One vocabulary for both languages lets the model tie the source embedding, the target embedding
and the pre-softmax projection (section 3.4 of the paper). Ids are fixed so every other module can
rely on them: PAD_ID = 0 (padding is never unknown), EOS_ID = 1 (ends every sequence), UNK_ID = 2,
and no BOS: the decoder starts from a shifted-in 0 as in the flax wmt example.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Sequence

import ml_collections
import sentencepiece as spm
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions
from flaxformer_nmt.data import fairseq_vocabulary, pair_vocabulary
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID, UNK_ID

# What a reserved piece (a language or corpus tag) looks like: `<2fr>`, `<BT>`.
_TAG = re.compile(r"<[^<>\s\u2581]+>")

# How long processes other than 0 wait for process 0 to write the vocabulary.
_WAIT_TIMEOUT_S = 6 * 3600.0
_WAIT_POLL_S = 2.0


class Tokenizer:
  """Text <-> ids with one SentencePiece model; batch methods are the fast (threaded) path."""

  def __init__(self, model_path: str) -> None:
    if not os.path.isfile(model_path):
      raise errors.DataError(f"{model_path}: no such SentencePiece model.")
    self.model_path = model_path
    with open(model_path, "rb") as f:
      proto = f.read()
    self._sp = spm.SentencePieceProcessor(model_proto=proto)
    # Identifies the vocabulary in cache keys: same bytes, same ids.
    self.fingerprint = hashlib.sha256(proto).hexdigest()[:16]
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id(), self._sp.bos_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID, -1):
      raise errors.DataError(
        f"{model_path}: (pad, eos, unk, bos) ids are {ids}; this code needs "
        f"{(PAD_ID, EOS_ID, UNK_ID, -1)} (train it with train_tokenizer)."
      )

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without EOS (the batcher appends it)."""
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    """Ids of many texts at once; SentencePiece encodes them on its own threads."""
    return self._sp.encode(list(texts), num_threads=num_threads)

  def encode_target(self, text: str) -> list[int]:
    """Ids of target text (one model for both sides: `encode`'s)."""
    return self._sp.encode(text)

  def encode_target_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    return self._sp.encode(list(texts), num_threads=num_threads)

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids` up to the first EOS; PAD ids are ignored (decoder outputs are padded).

    A lone "\u2581" piece at the end (a tiny or early model emits one) decodes to a trailing space;
    the text is stripped, as MarianTokenizer's and data/pair_vocabulary.py's decode strip theirs,
    so a run and its export or re-import print the same line.
    """
    out = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i != PAD_ID:
        out.append(i)
    return self._sp.decode(out).strip()

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def piece_id(self, piece: str) -> int | None:
    """The id of a whole piece (a language tag such as `<2fr>`), or None if the vocabulary has
    no such piece."""
    i = self._sp.piece_to_id(piece)
    return None if i == self._sp.unk_id() and piece != self._sp.id_to_piece(i) else int(i)

  def reserved_ids(self) -> list[int]:
    """The vocabulary's own tags (a multilingual run's `<2fr>`, `<BT>`), read from the model, not
    from any config: train_tokenizer puts its user symbols right after UNK, so they are the run
    of tag-shaped, non-control pieces from id UNK_ID + 1 (a bilingual vocabulary has none there:
    its id 3 is an ordinary piece)."""
    out = []
    for i in range(UNK_ID + 1, self.vocab_size):
      if self._sp.is_control(i) or self._sp.is_byte(i) or not _TAG.fullmatch(self.id_to_piece(i)):
        break
      out.append(i)
    return out


Vocabulary = Tokenizer | pair_vocabulary.PairVocabulary | fairseq_vocabulary.FairseqVocabulary


def open_vocabulary(path: str, size: int | None = None) -> Vocabulary:
  """The vocabulary at `path`: a SentencePiece model file (ours), or a folder with a Marian
  model's source.spm, target.spm and vocab.json (an imported OPUS-MT model's:
  data/pair_vocabulary.py), or an M2M100 model's sentencepiece.bpe.model and vocab.json
  (data/fairseq_vocabulary.py; `size`, config.data.vocab_size, counts its padding rows)."""
  if not os.path.isdir(path):  # a file (or nothing: Tokenizer names what is missing)
    return Tokenizer(path)
  if fairseq_vocabulary.is_fairseq_vocabulary(path):
    return fairseq_vocabulary.FairseqVocabulary(path, size)
  return pair_vocabulary.PairVocabulary(path)


def vocabulary_exists(path: str) -> bool:
  """Whether `path` holds a vocabulary `open_vocabulary` reads (a file, a Marian or an M2M100
  folder)."""
  return (
    os.path.isfile(path)
    or pair_vocabulary.is_pair_vocabulary(path)
    or fairseq_vocabulary.is_fairseq_vocabulary(path)
  )


def folder_files(path: str) -> tuple[str, ...]:
  """The files of the vocabulary folder at `path` (what a run copies and a digest reads)."""
  if fairseq_vocabulary.is_fairseq_vocabulary(path):
    return fairseq_vocabulary.folder_files(path)
  return pair_vocabulary.FILES


def digest(path: str) -> str:
  """A vocabulary's identity by content: of a file, or of a folder's vocabulary files."""
  if fairseq_vocabulary.is_fairseq_vocabulary(path):
    return fairseq_vocabulary.digest(path)
  return pair_vocabulary.digest(path)


def same_vocabulary(a: str, b: str) -> bool:
  """Whether two vocabularies are the same by content (a copy, or the same file or folder)."""
  return digest(a) == digest(b)


def pair_prefixes(
  tokenizer: Vocabulary, data_config: ml_collections.ConfigDict
) -> tuple[list[int], list[int]]:
  """(the ids every source starts with, those every target starts with) of a bilingual split: a
  many-to-many model's (data.lang_tokens="m2m100") are its source language's token and its
  target language's (the output the search forces first, which training teaches as M2M100's
  labels do); any other model's, none."""
  if not directions.many_to_many(data_config):
    return [], []
  out = []
  for lang in (data_config.src_lang, data_config.tgt_lang):
    piece = directions.lang_tag(lang, data_config)
    i = tokenizer.piece_id(piece)
    if i is None:
      raise errors.DataError(f"{tokenizer.model_path}: has no token {piece!r} of {lang!r}.")
    out.append([int(i)])
  return out[0], out[1]


def source_prefix(
  tokenizer: Vocabulary,
  target_lang: str,
  corpus_tag: str = "",
  data_config: ml_collections.ConfigDict | None = None,
) -> list[int]:
  """The ids every source into `target_lang` starts with: its language tag (spelled as
  `data_config` says: directions.lang_tag), then the corpus's tag, if any (both checked to be in
  the vocabulary when the data was made)."""
  pieces = [directions.lang_tag(target_lang, data_config)] + ([corpus_tag] if corpus_tag else [])
  ids = [tokenizer.piece_id(p) for p in pieces]
  missing = [p for p, i in zip(pieces, ids, strict=True) if i is None]
  if missing:
    raise errors.DataError(f"{tokenizer.model_path}: has no piece {missing[0]!r}.")
  return [int(i) for i in ids if i is not None]


def without_pieces(pieces: Sequence[str]) -> Callable[[str], str]:
  """`text -> text` with every whole `pieces` string (the tags) replaced by a space: removed
  before encoding, a typed tag leaves no stray "\u2581" piece behind, as dropping its id would."""
  if not pieces:
    return lambda text: text
  pattern = re.compile("|".join(re.escape(p) for p in sorted(pieces, key=len, reverse=True)))
  return lambda text: pattern.sub(" ", text)


def train_tokenizer(
  sentences: Iterable[str],
  model_prefix: str,
  vocab_size: int,
  model_type: str = "bpe",
  character_coverage: float = 1.0,
  num_threads: int = 0,
  user_symbols: Sequence[str] = (),
) -> Tokenizer:
  """Trains a SentencePiece model on `sentences` and saves it as `<model_prefix>.model`.

  `hard_vocab_limit=False` lets a small corpus (the demo, Multi30k) ask for the paper's 37k without
  crashing: SentencePiece then stops at the largest vocabulary the data supports, which is logged.
  The file is written under a temporary name and renamed, so a reader never sees half a model.
  `character_coverage=1.0` keeps every character (umlauts, accents); the input is already sampled,
  so SentencePiece's own sampling is off (deterministic for the same sentences).
  `user_symbols` (a multilingual run's tags, `<2fr>`, `<BT>`) become pieces of their own that no
  merge splits: ids right after UNK, in the order given.
  """
  sentences = [s for s in sentences if s and not s.isspace()]
  if not sentences:
    raise errors.DataError(
      f"No non-empty sentences to train the vocabulary {model_prefix}.model on."
    )
  logging.info(
    "Training a %s SentencePiece vocabulary of %d pieces on %d sentences...",
    model_type,
    vocab_size,
    len(sentences),
  )
  start = time.time()
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(sentences),
    model_writer=model,
    vocab_size=vocab_size,
    model_type=model_type,
    pad_id=PAD_ID,
    eos_id=EOS_ID,
    unk_id=UNK_ID,
    bos_id=-1,
    hard_vocab_limit=False,
    character_coverage=character_coverage,
    input_sentence_size=0,
    max_sentence_length=1 << 16,
    num_threads=num_threads or os.cpu_count() or 1,
    minloglevel=2,
    **({"user_defined_symbols": list(user_symbols)} if user_symbols else {}),
  )
  path = model_prefix + ".model"
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(model.getvalue())
  os.replace(tmp, path)
  tokenizer = Tokenizer(path)
  if tokenizer.vocab_size != vocab_size:
    logging.warning(
      "Asked for %d pieces but the data supports only %d; using %d (data.vocab_size).",
      vocab_size,
      tokenizer.vocab_size,
      tokenizer.vocab_size,
    )
  logging.info(
    "Trained vocabulary %s (%d pieces) in %.1fs.", path, tokenizer.vocab_size, time.time() - start
  )
  return tokenizer


def sample_sentences(pairs: Iterable[tuple[str, str]], sample_size: int, seed: int) -> list[str]:
  """A seeded uniform sample of `sample_size` pairs (both sides), in one streaming pass.

  Reservoir sampling keeps memory at the sample size, whatever the corpus size (4.5M WMT pairs).
  """
  rng = random.Random(seed)
  reservoir: list[tuple[str, str]] = []
  start = time.time()
  i = -1
  for i, pair in enumerate(pairs):
    if i < sample_size:
      reservoir.append(pair)
    else:
      j = rng.randrange(i + 1)
      if j < sample_size:
        reservoir[j] = pair
    if (i + 1) % 1_000_000 == 0:
      logging.info(
        "Vocabulary sample: read %d pairs (%.0f pairs/s).", i + 1, (i + 1) / (time.time() - start)
      )
  logging.info("Vocabulary sample: %d of %d pairs.", len(reservoir), i + 1)
  return [s for pair in reservoir for s in pair]


def load_or_train_tokenizer(
  data_config: ml_collections.ConfigDict,
  path: str,
  train_pairs_fn: Callable[[], Iterable[tuple[str, str]]],
  seed: int = 0,
  process_index: int | None = None,
  sentences_fn: Callable[[], list[str]] | None = None,
  user_symbols: Sequence[str] = (),
) -> Vocabulary:
  """The run's vocabulary at `path` (`data.vocab_path`, or the workdir's own `spm.model`, as
  `Workdir.vocabulary` says), trained there from `train_pairs_fn`'s sample if it is the
  workdir's own and absent.

  `sentences_fn` (a multilingual run: data/multilingual.vocabulary_sample) gives the sample
  itself instead; `user_symbols` are reserved pieces (train_tokenizer), and a vocabulary that
  lacks one is refused with one line.

  Multi-process runs: only process 0 trains; the others wait for the file to appear in the (shared)
  workdir. That is simple and enough because the write is an atomic rename.
  """
  if vocabulary_exists(path):  # the run's own (trained, kept from data.vocab_path, imported)
    logging.info("Reusing the vocabulary %s.", path)
    return check_symbols(open_vocabulary(path, data_config.vocab_size), user_symbols)
  if data_config.vocab_path:
    if not vocabulary_exists(data_config.vocab_path):
      raise errors.DataError(f"config.data.vocab_path={data_config.vocab_path}: no such file.")
    logging.info("Using the vocabulary %s (data.vocab_path).", data_config.vocab_path)
    return check_symbols(
      open_vocabulary(data_config.vocab_path, data_config.vocab_size), user_symbols
    )
  if process_index is None:
    import jax  # pylint: disable=g-import-not-at-top  # only multi-process runs need it here

    process_index = jax.process_index()
  if process_index != 0:
    logging.info("Process %d: waiting for process 0 to write %s...", process_index, path)
    deadline = time.time() + _WAIT_TIMEOUT_S
    while not vocabulary_exists(path):
      if time.time() > deadline:
        raise errors.ConfigError(
          f"Process {process_index}: {path} did not appear; is --workdir on a filesystem all "
          "processes share?"
        )
      time.sleep(_WAIT_POLL_S)
    return check_symbols(open_vocabulary(path, data_config.vocab_size), user_symbols)
  if sentences_fn is not None:
    sentences = sentences_fn()
  else:
    sentences = sample_sentences(train_pairs_fn(), data_config.vocab_sample_size, seed)
  return train_tokenizer(
    sentences,
    path.removesuffix(".model"),
    data_config.vocab_size,
    model_type=data_config.vocab_model_type,
    user_symbols=user_symbols,
  )


def check_symbols(tokenizer: Vocabulary, symbols: Sequence[str]) -> Vocabulary:
  """`tokenizer`, if it holds every reserved piece in `symbols`; else a DataError naming the
  first missing one (a bilingual vocabulary given to a multilingual config)."""
  missing = [s for s in symbols if tokenizer.piece_id(s) is None]
  if missing:
    raise errors.DataError(
      f"{tokenizer.model_path}: has no piece {missing[0]!r} (of {len(missing)} tags missing); a "
      "multilingual config needs a vocabulary trained with its tags: leave data.vocab_path "
      "empty, or train it in a fresh workdir."
    )
  return tokenizer
