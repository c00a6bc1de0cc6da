"""Training and evaluation batches with a deterministic, restorable position.

Training: each epoch visits this process's pairs in a permutation seeded by (seed, epoch) and packs
them (packing.py) into batches of exactly `rows x max_len`. The position is two integers, the epoch
and how many pairs of its permutation were consumed, so a checkpoint stores it as a tiny dict and a
restored run continues with exactly the next batch. Batches flow across epoch boundaries (a batch
may end one epoch and start the next), so every batch is full and training never pauses.

Evaluation: the split in order, nothing dropped or shuffled (over-long pairs are truncated), the
last batch padded with empty rows; every process packs the same global batches and keeps its rows,
so all processes yield the same number of batches.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator

from absl import logging
import ml_collections
import numpy as np

from flaxformer_nmt import tokenizer as tokenizer_lib
from flaxformer_nmt.data import packing
from flaxformer_nmt.data import sources
from flaxformer_nmt.data import tokenized

Batch = packing.Batch

# The vocabulary sample is seeded by this, not by config.seed, so runs that differ only in their
# training seed share the same vocabulary.
_VOCAB_SEED = 0
_CHUNK = 512  # pairs of the epoch's order converted to Python ints at a time


def _process_defaults(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top  # keep the data side importable without jax

    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} is not in [0, process_count={process_count}).")
  return process_index, process_count


class TrainIterator(Iterator[Batch]):
  """Endless packed training batches of this process; `get_state`/`set_state` save the position."""

  def __init__(self, data: tokenized.TokenizedSplit, rows: int, max_len: int, seed: int) -> None:
    """`data`: this process's shard of the train split; `rows`: this process's rows per batch."""
    self._data = data
    self._seed = seed
    self._packer = packing.RowPacker(rows, max_len)
    src_lens, tgt_lens = data.src_lens, data.tgt_lens  # [n] without EOS
    empty = (src_lens == 0) | (tgt_lens == 0)
    too_long = ~empty & ((src_lens + 1 > max_len) | (tgt_lens + 1 > max_len))
    self._kept = np.flatnonzero(~empty & ~too_long)  # [kept] indices into `data`
    self._src_lens = src_lens + 1  # [n] with EOS
    self._tgt_lens = tgt_lens + 1
    self._drop_note = (
        f"{len(self._kept)} of {len(data)} pairs; dropped {int(too_long.sum())} with a side longer "
        f"than data.max_len={max_len} tokens (with EOS) and {int(empty.sum())} with an empty side"
    )
    if not len(self._kept):
      raise sources.DataError(f"No training pairs left: {self._drop_note}.")
    self._epoch = -1
    self._set_epoch(0, 0)

  def _set_epoch(self, epoch: int, index: int) -> None:
    if epoch != self._epoch:
      rng = np.random.default_rng([self._seed, epoch])
      order = rng.permutation(self._kept)  # [kept]
      self._order = order
      self._order_src = self._src_lens[order]  # [kept] lengths in visiting order
      self._order_tgt = self._tgt_lens[order]
      self._epoch = epoch
      logging.info("Training epoch %d: %s.", epoch, self._drop_note)
    self._index = index

  @property
  def examples_per_epoch(self) -> int:
    return len(self._kept)

  def get_state(self) -> dict[str, int]:
    """The position: the epoch and how many pairs of its permutation are consumed."""
    return {"epoch": self._epoch, "index": self._index}

  def set_state(self, state: dict[str, Any]) -> None:
    epoch, index = int(state["epoch"]), int(state["index"])
    if epoch < 0 or not 0 <= index <= len(self._kept):
      raise ValueError(
          f"Data position {state} does not fit this data ({len(self._kept)} pairs per epoch); "
          "was the checkpoint made with other data or data.max_len?"
      )
    self._set_epoch(epoch, index)

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> Batch:
    packer = self._packer
    packer.reset()
    while True:
      if self._index == len(self._order):
        self._set_epoch(self._epoch + 1, 0)
      # Python ints in chunks: indexing numpy arrays pair by pair costs more than the packing.
      i = self._index
      stop = min(i + _CHUNK, len(self._order))
      order = self._order[i:stop].tolist()
      src_lens = self._order_src[i:stop].tolist()
      tgt_lens = self._order_tgt[i:stop].tolist()
      for example, src_len, tgt_len in zip(order, src_lens, tgt_lens):
        if not packer.add(example, src_len, tgt_len):
          return packer.batch(self._data)
        self._index += 1


def eval_batches(
    data: tokenized.TokenizedSplit,
    global_rows: int,
    max_len: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[Batch]:
  """Packed batches of all pairs in order; this process's `global_rows / process_count` rows."""
  local = global_rows // process_count
  rows = slice(process_index * local, (process_index + 1) * local)
  packer = packing.RowPacker(global_rows, max_len)
  src_lens = np.minimum(data.src_lens, max_len - 1) + 1  # [n] truncated, with EOS
  tgt_lens = np.minimum(data.tgt_lens, max_len - 1) + 1
  truncated = int(((data.src_lens >= max_len) | (data.tgt_lens >= max_len)).sum())
  if truncated:
    logging.info(
        "Evaluation: truncated %d of %d pairs to data.max_len=%d.", truncated, len(data), max_len
    )
  for i in range(len(data)):
    if not packer.add(i, int(src_lens[i]), int(tgt_lens[i])):
      yield packer.batch(data, rows)
      packer.reset()
      packer.add(i, int(src_lens[i]), int(tgt_lens[i]))
  if len(packer):
    yield packer.batch(data, rows)


@dataclasses.dataclass
class Data:
  """Everything the trainer needs from the input side."""

  tokenizer: tokenizer_lib.Tokenizer
  train: TrainIterator | None  # None when made with need_train=False (eval, translate)
  global_rows: int  # rows of a global batch; each process yields global_rows / process_count
  max_len: int
  process_index: int
  process_count: int
  _eval: dict[str, tokenized.TokenizedSplit]
  _pairs: dict[str, list[tuple[str, str]]]

  def eval_batches(self, split: str) -> Iterator[Batch]:
    """'dev' or 'test' batches in order, nothing dropped (dev loss uses these)."""
    if split not in self._eval:
      raise ValueError(f"Unknown evaluation split {split!r}; choose 'dev' or 'test'.")
    return eval_batches(
        self._eval[split], self.global_rows, self.max_len, self.process_index, self.process_count
    )

  def pairs(self, split: str) -> list[tuple[str, str]]:
    """Raw (source, reference) text of 'dev' or 'test' in file order (for BLEU)."""
    if split not in self._pairs:
      raise ValueError(f"Unknown evaluation split {split!r}; choose 'dev' or 'test'.")
    return self._pairs[split]


def make_data(
    config: ml_collections.ConfigDict,
    workdir: str,
    num_devices: int,
    process_index: int | None = None,
    process_count: int | None = None,
    need_train: bool = True,
) -> Data:
  """Checks the data, loads or trains the vocabulary, tokenizes (or loads the cache), batches.

  `num_devices` is the global device count: global rows are a multiple of it. Cheap checks and the
  (small) dev and test sets are read first, so data errors surface before vocabulary training.
  `need_train=False` (evaluation, translation) skips the train split's tokenization and iterator;
  the vocabulary is still trained if the workdir has none.
  """
  dc = config.data
  process_index, process_count = _process_defaults(process_index, process_count)
  global_rows = packing.num_rows(dc.tokens_per_batch, dc.max_len, num_devices)
  if global_rows % process_count:
    raise ValueError(f"{global_rows} rows do not split over process_count={process_count}.")
  if global_rows * dc.max_len > dc.tokens_per_batch:
    logging.warning(
        "data.tokens_per_batch=%d is below one row of data.max_len=%d per device; using %d rows.",
        dc.tokens_per_batch,
        dc.max_len,
        global_rows,
    )
  logging.info(
      "Batches: %d rows x %d tokens per step (%d per process), budget %d tokens per side.",
      global_rows,
      dc.max_len,
      global_rows // process_count,
      dc.tokens_per_batch,
  )
  source = sources.make_source(dc)
  source.check(sources.SPLITS if need_train else ("dev", "test"))
  pairs = {split: list(source.iter_pairs(split)) for split in ("dev", "test")}
  for split, split_pairs in pairs.items():
    logging.info("%s: %d pairs.", split, len(split_pairs))
  os.makedirs(workdir, exist_ok=True)
  tokenizer = tokenizer_lib.load_or_train_tokenizer(
      dc, workdir, lambda: source.iter_pairs("train"), seed=_VOCAB_SEED, process_index=process_index
  )
  train = None
  if need_train:
    train_split = tokenized.load_or_tokenize(
        source,
        "train",
        tokenizer,
        os.path.join(workdir, "data_cache"),
        process_index=process_index,
        process_count=process_count,
    )
    train = TrainIterator(train_split, global_rows // process_count, dc.max_len, config.seed)
  return Data(
      tokenizer=tokenizer,
      train=train,
      global_rows=global_rows,
      max_len=dc.max_len,
      process_index=process_index,
      process_count=process_count,
      _eval={s: tokenized.tokenize_pairs(p, tokenizer, name=s) for s, p in pairs.items()},
      _pairs=pairs,
  )
