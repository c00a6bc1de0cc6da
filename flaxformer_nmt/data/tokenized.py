"""A split tokenized once into flat id arrays, cached in the workdir so restarts are cheap.

For WMT-sized data (4.5M pairs) one Python list per sentence would cost gigabytes; instead each side
is one flat array of ids plus an offsets array (example i is ids[offsets[i]:offsets[i + 1]]), built
chunk by chunk with SentencePiece's threaded batch encoder. Ids are stored as uint16 when the
vocabulary allows (every size in the paper does), halving memory again. EOS is not stored: the
batcher appends it, so a truncated evaluation pair still ends with EOS.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from absl import logging

from flaxformer_nmt.data import sources
from flaxformer_nmt.data import tokenizer as tokenizer_lib

_CHUNK = 20_000  # pairs encoded per SentencePiece batch call
_CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """Token ids of n pairs. Lengths exclude EOS."""

  src_ids: np.ndarray  # [total source tokens] uint16 or int32
  src_offsets: np.ndarray  # [n + 1] int64
  tgt_ids: np.ndarray  # [total target tokens]
  tgt_offsets: np.ndarray  # [n + 1] int64

  def __len__(self) -> int:
    return len(self.src_offsets) - 1

  @property
  def src_lens(self) -> np.ndarray:  # [n] int64
    return np.diff(self.src_offsets)

  @property
  def tgt_lens(self) -> np.ndarray:  # [n] int64
    return np.diff(self.tgt_offsets)

  def save(self, path: str) -> None:
    """Writes atomically (temporary name, then rename): a killed run never leaves half a cache."""
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    np.savez(tmp, **dataclasses.asdict(self))
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> TokenizedSplit:
    with np.load(path) as f:
      return cls(**{field.name: f[field.name] for field in dataclasses.fields(cls)})


def _flatten(encoded: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  lens = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
  ids = np.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype, count=int(lens.sum()))
  return ids, lens


def _offsets(lens: list[np.ndarray]) -> np.ndarray:
  all_lens = np.concatenate(lens) if lens else np.zeros([0], np.int64)
  return np.concatenate([[0], np.cumsum(all_lens)]).astype(np.int64)


def tokenize_pairs(
  pairs: Iterable[tuple[str, str]],
  tokenizer: tokenizer_lib.Tokenizer,
  name: str = "",
  size_hint: int | None = None,
  src_prefix: Sequence[int] = (),
  tgt_prefix: Sequence[int] = (),
) -> TokenizedSplit:
  """Encodes a stream of pairs chunk by chunk; logs progress with rate and ETA on long inputs.

  `src_prefix` (a multilingual split's tags, config/directions.py; a many-to-many model's source
  language token) starts every non-empty source, `tgt_prefix` (a many-to-many model's target
  language token, its forced first output) every non-empty target; an empty side stays empty,
  so training still drops the pair."""
  dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
  src_ids, src_lens, tgt_ids, tgt_lens = [], [], [], []
  start = last_log = time.time()
  done = 0
  it: Iterator[tuple[str, str]] = iter(pairs)
  while chunk := list(itertools.islice(it, _CHUNK)):
    srcs, tgts = zip(*chunk, strict=True)
    encoded = tokenizer.encode_batch(srcs)
    if src_prefix:
      prefix = list(src_prefix)
      encoded = [prefix + x if x else x for x in encoded]
    ids, lens = _flatten(encoded, dtype)
    src_ids.append(ids)
    src_lens.append(lens)
    encoded = tokenizer.encode_target_batch(tgts)
    if tgt_prefix:
      prefix = list(tgt_prefix)
      encoded = [prefix + x if x else x for x in encoded]
    ids, lens = _flatten(encoded, dtype)
    tgt_ids.append(ids)
    tgt_lens.append(lens)
    done += len(chunk)
    now = time.time()
    if now - last_log > 10:
      last_log = now
      rate = done / (now - start)
      eta = f", ETA {(size_hint - done) / rate:.0f}s" if size_hint and size_hint > done else ""
      logging.info("Tokenizing %s: %d pairs (%.0f pairs/s%s).", name, done, rate, eta)
  empty = np.zeros([0], dtype)
  result = TokenizedSplit(
    src_ids=np.concatenate(src_ids) if src_ids else empty,
    src_offsets=_offsets(src_lens),
    tgt_ids=np.concatenate(tgt_ids) if tgt_ids else empty,
    tgt_offsets=_offsets(tgt_lens),
  )
  logging.info(
    "Tokenized %s: %d pairs, %d source and %d target tokens in %.1fs.",
    name,
    len(result),
    len(result.src_ids),
    len(result.tgt_ids),
    time.time() - start,
  )
  return result


@dataclasses.dataclass(frozen=True)
class Shard:
  """Pairs i with (i // block) % count == index: blocks of `block` consecutive pairs, dealt out.

  The training pipeline gives each process the blocks of its devices' streams (block = local
  device count); Shard(0, 1, b) is the whole split.
  """

  index: int = 0
  count: int = 1
  block: int = 1

  def select(self, pairs: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    if self.count == 1:
      return iter(pairs)
    return (p for i, p in enumerate(pairs) if (i // self.block) % self.count == self.index)

  def size(self, total: int | None) -> int | None:
    """How many of `total` pairs this shard holds."""
    if not total or self.count == 1:
      return total
    span = self.block * self.count
    full, rest = divmod(total, span)
    return full * self.block + min(max(rest - self.index * self.block, 0), self.block)

  @property
  def name(self) -> str:
    return f"-shard{self.index}of{self.count}x{self.block}" if self.count > 1 else ""


def load_or_tokenize(
  source: sources.Source,
  split: str,
  tokenizer: tokenizer_lib.Tokenizer,
  cache_dir: str | None,
  shard: Shard = Shard(),
  src_prefix: Sequence[int] = (),
  tgt_prefix: Sequence[int] = (),
) -> TokenizedSplit:
  """`split` (this process's `shard` of it), tokenized and cached.

  The cache name hashes the source's fingerprint (which changes with the data), the vocabulary's
  bytes, the shard and the prefixes (tokenize_pairs), so a stale cache is never read.
  """
  parts = [
    str(_CACHE_VERSION),
    source.fingerprint(split),
    tokenizer.fingerprint,
    f"{shard.index}/{shard.count}/{shard.block}",
  ]
  if src_prefix:
    parts.append("prefix:" + " ".join(map(str, src_prefix)))
  if tgt_prefix:
    parts.append("target prefix:" + " ".join(map(str, tgt_prefix)))
  key = "|".join(parts)
  digest = hashlib.sha256(key.encode()).hexdigest()[:16]
  path = os.path.join(cache_dir, f"{split}{shard.name}-{digest}.npz") if cache_dir else None
  if path and os.path.isfile(path):
    logging.info("Loading tokenized %s from %s.", split, path)
    return TokenizedSplit.load(path)
  pairs = shard.select(source.iter_pairs(split))
  size_hint = shard.size(source.size_hint(split))
  result = tokenize_pairs(
    pairs,
    tokenizer,
    name=split + shard.name,
    size_hint=size_hint,
    src_prefix=src_prefix,
    tgt_prefix=tgt_prefix,
  )
  if path:
    os.makedirs(cache_dir, exist_ok=True)
    result.save(path)
    logging.info("Cached tokenized %s in %s.", split, path)
  return result


def concatenate(splits: Sequence[TokenizedSplit]) -> TokenizedSplit:
  """The pairs of `splits`, one after another (a multilingual split's groups)."""

  def offsets(arrays: list[np.ndarray]) -> np.ndarray:
    return _offsets([np.diff(a) for a in arrays])

  return TokenizedSplit(
    src_ids=np.concatenate([s.src_ids for s in splits]),
    src_offsets=offsets([s.src_offsets for s in splits]),
    tgt_ids=np.concatenate([s.tgt_ids for s in splits]),
    tgt_offsets=offsets([s.tgt_offsets for s in splits]),
  )
