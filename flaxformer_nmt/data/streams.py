"""Training streams and evaluation batches, with a deterministic, restorable position.

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
batch is full and training never pauses. `resume_positions` maps a checkpoint's positions onto a
run with another device count.

Evaluation: the split in order, nothing dropped or shuffled (over-long pairs are truncated), the
last batch padded with empty rows; every process packs the same global batches and keeps its rows,
so all processes yield the same number of batches.

pipeline.py's `make_data` builds these from a config; this module takes tokenized arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.data import direction_mix, packing, tokenized

Batch = packing.Batch

_CHUNK = 512  # pairs of the epoch's order converted to Python ints at a time


@dataclasses.dataclass(frozen=True)
class Groups:
  """A multilingual training split's groups (one per direction and corpus) and how each is
  sampled (direction_mix.sampling_probabilities).

  `of_pair[i]` is pair i's group; group g belongs to direction `direction_of[g]` and counts
  `weights[g]` times its size. Each stream computes its groups' probabilities from its own kept
  pairs: the same for the same stream whatever the process layout, so 2 processes x 4 devices
  still train exactly as 1 x 8."""

  of_pair: np.ndarray  # [n] int32
  direction_of: tuple[int, ...]  # [groups]
  weights: tuple[float, ...]  # [groups]
  temperature: float


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
    groups: Groups | None = None,
  ) -> None:
    """A stream over `data[indices]` (default: all of `data`) packed into `rows` rows.

    `stream` (the global device index) seeds the epoch permutations together with `seed`, so
    streams are independent; `verbose=False` leaves the per-epoch log line to another stream.
    `groups` (a multilingual split): each epoch draws as many pairs as the stream keeps, each
    group's share by its sampling probability: a small group's pairs are repeated (every pair
    once before any twice), a large group's subsampled, a fresh draw every epoch.
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
    self._by_group: list[np.ndarray] = []
    self.group_probabilities: np.ndarray | None = None  # [groups]: the share of each epoch
    if groups is not None and len(groups.weights) > 1:
      kept_groups = groups.of_pair[self._kept]  # [kept]
      self._by_group = [self._kept[kept_groups == g] for g in range(len(groups.weights))]
      sizes = [len(ix) * w for ix, w in zip(self._by_group, groups.weights, strict=True)]
      self.group_probabilities = direction_mix.sampling_probabilities(
        groups.direction_of, sizes, groups.temperature
      )
    self.group_counts: np.ndarray | None = None  # [groups]: the current epoch's draws
    self._epoch = -1
    self._set_epoch(0, 0)

  def _set_epoch(self, epoch: int, index: int) -> None:
    if epoch != self._epoch:
      rng = np.random.default_rng([self._seed, self._stream, epoch])
      if self.group_probabilities is None:
        order = rng.permutation(self._kept)  # [kept]
      else:
        self.group_counts = direction_mix.epoch_counts(
          self.group_probabilities, len(self._kept), rng
        )
        order = rng.permutation(self._sampled(rng))  # [kept]
      self._order = order
      self._order_src = self._src_lens[order]  # [kept] lengths in visiting order
      self._order_tgt = self._tgt_lens[order]
      self._epoch = epoch
      if self._verbose and epoch == 0:
        # Once: a small corpus runs through hundreds of epochs, and the training line counts
        # them (`epoch` in training/trainer.py's log).
        logging.info("Training data of stream %d: %s.", self._stream, self._drop_note)
    self._index = index

  def _sampled(self, rng: np.random.Generator) -> np.ndarray:
    """One epoch's draw: group_counts[g] pairs of group g, in group order (then shuffled)."""
    assert self.group_counts is not None
    parts = []
    for pairs, count in zip(self._by_group, self.group_counts.tolist(), strict=True):
      if not len(pairs) or not count:
        continue
      repeats, extra = divmod(count, len(pairs))
      parts.extend(rng.permutation(pairs) for _ in range(repeats))
      if extra:
        parts.append(rng.permutation(pairs)[:extra])
    return np.concatenate(parts)  # [kept]

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
    groups: Groups | None = None,
  ) -> None:
    """`data`: this process's pairs in global order (local stream j takes every num_local-th).
    With `groups`, `data` is the groups' process shards one after another, and local stream j
    takes every num_local-th pair of each group's shard: the pairs i of each group with
    i % num_devices == its global stream, as in one process."""
    self._streams = [
      TrainIterator(
        data,
        rows_per_device,
        max_len,
        seed,
        stream=first_stream + j,
        indices=_stream_indices(j, num_local, len(data), groups),
        verbose=j == 0 and first_stream == 0,
        groups=groups,
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

  def __iter__(self) -> DeviceStreams:
    return self

  def __next__(self) -> Batch:
    parts = [next(s) for s in self._streams]  # [rows_per_device, max_len] each
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _stream_indices(j: int, num_local: int, n: int, groups: Groups | None) -> np.ndarray:
  """Local stream j's pairs: every num_local-th of the split, or of each group's run."""
  if groups is None:
    return np.arange(j, n, num_local)
  starts = np.flatnonzero(np.r_[True, groups.of_pair[1:] != groups.of_pair[:-1]])  # group runs
  ends = np.r_[starts[1:], n]
  return np.concatenate([np.arange(a + j, b, num_local) for a, b in zip(starts, ends, strict=True)])


def resume_positions(
  saved: dict[str, Any], first_stream: int, stream_sizes: list[int], num_streams: int
) -> tuple[list[dict[str, int]], bool]:
  """This process's stream positions from a checkpoint's data item; (positions, exact).

  Exact when the checkpoint has one position per stream of this run with the same epoch sizes
  (same data, same device count). Otherwise, after a change of device count, the positions are
  approximated: every stream starts in the earliest saved epoch at the smallest fraction of it that
  any saved stream had reached, so no data of that epoch is skipped (a few batches may repeat). The
  caller says so in a warning. A data item without positions starts every stream afresh.
  """
  saved_streams = saved.get("streams") or []
  if len(saved_streams) == num_streams:
    mine = saved_streams[first_stream : first_stream + len(stream_sizes)]
    if all(int(p["size"]) == size for p, size in zip(mine, stream_sizes, strict=True)):
      return [{"epoch": int(p["epoch"]), "index": int(p["index"])} for p in mine], True
  if not saved_streams:
    return [{"epoch": 0, "index": 0} for _ in stream_sizes], False
  epoch = min(int(p["epoch"]) for p in saved_streams)
  in_epoch = [p for p in saved_streams if int(p["epoch"]) == epoch]
  fraction = min(int(p["index"]) / int(p["size"]) for p in in_epoch)
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
