"""Training and evaluation batches with a deterministic, restorable position.

Training: the train split is cut into one *stream* per device of the whole run (all processes):
stream d holds pairs i with i % num_devices == d. Each epoch a stream visits its pairs in a
permutation seeded by (seed, d, epoch) and packs them (packing.py) into that device's rows of
`rows x max_len`. Because streams belong to devices, not to processes, the global batch of a step is
the same whether 8 devices sit in one process or in two processes of 4: a process packs only its
own devices' streams (the work scales with the local device count) and its local device j feeds
stream process_index * local_devices + j, which is where pmap places that device's rows.

A stream's position is two integers, the epoch and how many pairs of its permutation were consumed;
a checkpoint stores the positions of all streams, so a restored run continues with exactly the next
batch. Batches flow across epoch boundaries (a batch may end one epoch and start the next), so every
batch is full and training never pauses.

Evaluation: the split in order, nothing dropped or shuffled (over-long pairs are truncated), the
last batch padded with empty rows; every process packs the same global batches and keeps its rows,
so all processes yield the same number of batches.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt import tokenizer as tokenizer_lib
from flaxformer_nmt.data import packing, sources, tokenized

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


def _drop_note(kept: int, total: int, too_long: int, empty: int, max_len: int) -> str:
  return (
    f"{kept} of {total} pairs; dropped {too_long} with a side longer than "
    f"data.max_len={max_len} tokens (with EOS) and {empty} with an empty side"
  )


class TrainIterator(Iterator[Batch]):
  """One stream of endless packed training batches; `get_state`/`set_state` save its position."""

  def __init__(
    self,
    data: tokenized.TokenizedSplit,
    rows: int,
    max_len: int,
    seed: int,
    *,
    stream: int = 0,
    indices: np.ndarray | None = None,
    verbose: bool = True,
  ) -> None:
    """A stream over `data[indices]` (default: all of `data`) packed into `rows` rows.

    `stream` (the global device index) seeds the epoch permutations together with `seed`, so
    streams are independent; `verbose=False` leaves the per-epoch log line to another stream.
    """
    self._data = data
    self._seed = seed
    self._stream = stream
    self._verbose = verbose
    self._packer = packing.RowPacker(rows, max_len)
    src_lens, tgt_lens = data.src_lens, data.tgt_lens  # [n] without EOS
    if indices is None:
      indices = np.arange(len(data))
    sub_src, sub_tgt = src_lens[indices], tgt_lens[indices]  # [m]
    empty = (sub_src == 0) | (sub_tgt == 0)
    too_long = ~empty & ((sub_src + 1 > max_len) | (sub_tgt + 1 > max_len))
    self._kept = indices[~empty & ~too_long]  # [kept] indices into `data`
    self._src_lens = src_lens + 1  # [n] with EOS
    self._tgt_lens = tgt_lens + 1
    self.num_too_long, self.num_empty, self.num_pairs = (
      int(too_long.sum()),
      int(empty.sum()),
      len(indices),
    )
    self._drop_note = _drop_note(
      len(self._kept), len(indices), self.num_too_long, self.num_empty, max_len
    )
    if not len(self._kept):
      raise errors.DataError(f"No training pairs left: {self._drop_note}.")
    self._epoch = -1
    self._set_epoch(0, 0)

  def _set_epoch(self, epoch: int, index: int) -> None:
    if epoch != self._epoch:
      rng = np.random.default_rng([self._seed, self._stream, epoch])
      order = rng.permutation(self._kept)  # [kept]
      self._order = order
      self._order_src = self._src_lens[order]  # [kept] lengths in visiting order
      self._order_tgt = self._tgt_lens[order]
      self._epoch = epoch
      if self._verbose:
        logging.info(
          "Training epoch %d of data stream %d: %s.", epoch, self._stream, self._drop_note
        )
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
      raise errors.CheckpointError(
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
      for example, src_len, tgt_len in zip(order, src_lens, tgt_lens, strict=True):
        if not packer.add(example, src_len, tgt_len):
          return packer.batch(self._data)
        self._index += 1


class DeviceStreams(Iterator[Batch]):
  """This process's training batches: one `TrainIterator` per local device, rows concatenated.

  `next()` returns [local_devices * rows_per_device, max_len] arrays whose j-th block of rows is
  local device j's (what `parallel.shard` splits along). The position is one {epoch, index, size}
  per stream; `size` (pairs per epoch) lets a run resumed on another device count map positions.
  """

  def __init__(
    self,
    data: tokenized.TokenizedSplit,
    *,
    num_local: int,
    first_stream: int,
    rows_per_device: int,
    max_len: int,
    seed: int,
  ) -> None:
    """`data`: this process's pairs in global order (local stream j takes every num_local-th)."""
    self._streams = [
      TrainIterator(
        data,
        rows_per_device,
        max_len,
        seed,
        stream=first_stream + j,
        indices=np.arange(j, len(data), num_local),
        verbose=j == 0 and first_stream == 0,
      )
      for j in range(num_local)
    ]
    self.first_stream = first_stream
    logging.info(
      "Training data of this process: %d streams (one per local device), %s.",
      num_local,
      _drop_note(
        self.examples_per_epoch,
        sum(s.num_pairs for s in self._streams),
        sum(s.num_too_long for s in self._streams),
        sum(s.num_empty for s in self._streams),
        max_len,
      ),
    )

  @property
  def num_streams(self) -> int:
    return len(self._streams)

  @property
  def examples_per_epoch(self) -> int:
    """Pairs per epoch over this process's streams."""
    return sum(s.examples_per_epoch for s in self._streams)

  @property
  def stream_sizes(self) -> list[int]:
    return [s.examples_per_epoch for s in self._streams]

  def get_state(self) -> list[dict[str, int]]:
    return [dict(s.get_state(), size=s.examples_per_epoch) for s in self._streams]

  def set_state(self, positions: list[dict[str, Any]]) -> None:
    if len(positions) != len(self._streams):
      raise ValueError(f"{len(positions)} stream positions for {len(self._streams)} streams.")
    for stream, position in zip(self._streams, positions, strict=True):
      stream.set_state(position)

  @property
  def epoch(self) -> float:
    """Epochs completed by the first local stream, with its fraction (for logs)."""
    s = self._streams[0]
    state = s.get_state()
    return state["epoch"] + state["index"] / s.examples_per_epoch

  def __iter__(self) -> DeviceStreams:
    return self

  def __next__(self) -> Batch:
    parts = [next(s) for s in self._streams]  # [rows_per_device, max_len] each
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def resume_positions(
  saved: dict[str, Any], first_stream: int, stream_sizes: list[int], num_streams: int
) -> tuple[list[dict[str, int]], bool]:
  """This process's stream positions from a checkpoint's data item; (positions, exact).

  Exact when the checkpoint has one position per stream of this run with the same epoch sizes
  (same data, same device count). Otherwise, after a change of device count, or from a checkpoint
  whose data item predates streams, the positions are approximated: every stream starts in the
  earliest saved epoch at the smallest fraction of it that any saved stream had reached, so no data
  of that epoch is skipped (a few batches may repeat). The caller says so in a warning.
  """
  streams = saved.get("streams")
  if streams is not None and len(streams) == num_streams:
    mine = streams[first_stream : first_stream + len(stream_sizes)]
    if all(int(p.get("size", -1)) == size for p, size in zip(mine, stream_sizes, strict=True)):
      return [{"epoch": int(p["epoch"]), "index": int(p["index"])} for p in mine], True
  old = streams if streams is not None else saved.get("processes", [])
  if not old:
    return [{"epoch": 0, "index": 0} for _ in stream_sizes], False
  epoch = min(int(p["epoch"]) for p in old)
  fractions = [
    int(p["index"]) / int(p["size"]) if int(p.get("size", 0)) > 0 else 0.0
    for p in old
    if int(p["epoch"]) == epoch
  ]
  fraction = min(fractions) if fractions else 0.0
  return [{"epoch": epoch, "index": int(fraction * size)} for size in stream_sizes], False


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
  train: DeviceStreams | None  # None when made with need_train=False (eval, translate)
  global_rows: int  # rows of a global batch; each process yields global_rows / process_count
  eval_rows: int  # rows of a global evaluation batch (one micro-batch's worth)
  num_devices: int  # devices of the whole run: one training stream each
  max_len: int
  process_index: int
  process_count: int
  _eval: dict[str, tokenized.TokenizedSplit]
  _pairs: dict[str, list[tuple[str, str]]]
  _names: dict[str, str]

  def eval_batches(self, split: str) -> Iterator[Batch]:
    """'dev' or 'test' batches in order, nothing dropped (dev loss uses these)."""
    if split not in self._eval:
      raise ValueError(f"Unknown evaluation split {split!r}; choose 'dev' or 'test'.")
    return eval_batches(
      self._eval[split], self.eval_rows, self.max_len, self.process_index, self.process_count
    )

  def pairs(self, split: str) -> list[tuple[str, str]]:
    """Raw (source, reference) text of 'dev' or 'test' in file order (for BLEU)."""
    if split not in self._pairs:
      raise ValueError(f"Unknown evaluation split {split!r}; choose 'dev' or 'test'.")
    return self._pairs[split]

  def split_name(self, split: str) -> str:
    """What 'dev' or 'test' is called in its source, e.g. `newstest2014` (for reports)."""
    return self._names[split]


def make_data(
  config: ml_collections.ConfigDict,
  workdir: str,
  num_devices: int,
  process_index: int | None = None,
  process_count: int | None = None,
  need_train: bool = True,
  accumulate_steps: int = 1,
  eval_splits: Sequence[str] = ("dev", "test"),
) -> Data:
  """Checks the data, loads or trains the vocabulary, tokenizes (or loads the cache), batches.

  `num_devices` is the global device count: one training stream each, and global rows are a
  multiple of it times `accumulate_steps` (each device splits its rows into that many
  micro-batches). Cheap checks and the (small) dev and test sets are read first, so data errors
  surface before vocabulary training. `need_train=False` (evaluation, translation) skips the train
  split's tokenization and iterator; the vocabulary is still trained if the workdir has none.
  `eval_splits` are the evaluation splits read (`--mode=eval` reads only "test", so a test set
  such as the filtered newstest2014 can be scored without dev files beside it).
  """
  dc = config.data
  process_index, process_count = _process_defaults(process_index, process_count)
  if num_devices % process_count:
    raise ValueError(f"{num_devices} devices do not split over process_count={process_count}.")
  num_local = num_devices // process_count
  global_rows = packing.num_rows(dc.tokens_per_batch, dc.max_len, num_devices * accumulate_steps)
  if global_rows * dc.max_len > dc.tokens_per_batch:
    logging.warning(
      "data.tokens_per_batch=%d is below one row of data.max_len=%d per device and micro-batch; "
      "using %d rows.",
      dc.tokens_per_batch,
      dc.max_len,
      global_rows,
    )
  logging.info(
    "Batches: %d rows x %d tokens per step (%d per device%s), budget %d tokens per side.",
    global_rows,
    dc.max_len,
    global_rows // num_devices,
    f", in {accumulate_steps} micro-batches" if accumulate_steps > 1 else "",
    dc.tokens_per_batch,
  )
  source = sources.make_source(dc)
  source.check(sources.SPLITS if need_train else tuple(eval_splits))
  pairs = {split: list(source.iter_pairs(split)) for split in eval_splits}
  for split, split_pairs in pairs.items():
    logging.info("%s: %d pairs.", split, len(split_pairs))
  os.makedirs(workdir, exist_ok=True)
  tokenizer = tokenizer_lib.load_or_train_tokenizer(
    dc, workdir, lambda: source.iter_pairs("train"), seed=_VOCAB_SEED, process_index=process_index
  )
  train = None
  if need_train:
    # This process's devices' streams: pairs i with (i // num_local) % process_count == index.
    train_split = tokenized.load_or_tokenize(
      source,
      "train",
      tokenizer,
      os.path.join(workdir, "data_cache"),
      shard=tokenized.Shard(process_index, process_count, block=num_local),
    )
    train = DeviceStreams(
      train_split,
      num_local=num_local,
      first_stream=process_index * num_local,
      rows_per_device=global_rows // num_devices,
      max_len=dc.max_len,
      seed=config.seed,
    )
  return Data(
    tokenizer=tokenizer,
    train=train,
    global_rows=global_rows,
    eval_rows=global_rows // accumulate_steps,
    num_devices=num_devices,
    max_len=dc.max_len,
    process_index=process_index,
    process_count=process_count,
    _eval={s: tokenized.tokenize_pairs(p, tokenizer, name=s) for s, p in pairs.items()},
    _pairs=pairs,
    _names={split: source.split_name(split) for split in pairs},
  )
