"""Packs several sentence pairs per row, so every batch has one shape and little padding.

As in flax's wmt example and T5, a row of `max_len` tokens holds pair 1, then pair 2, ... on both
the source and the target side; `*_segmentation` (1, 2, 3... per pair, 0 at padding) keeps attention
inside a pair and `*_position` restarts at 0 for each pair. One compiled shape for the whole run
means no recompilation, and packing instead of bucketing keeps the non-padding share above 90%.

Packing is greedy first-fit: each pair goes to the first row where both its sides fit; when a pair
fits in no row the batch is complete and that pair starts the next batch.
"""

from __future__ import annotations

import numpy as np

from flaxformer_nmt.data.tokenized import TokenizedSplit
from flaxformer_nmt.model.tokens import EOS_ID

Batch = dict[str, np.ndarray]
_BLOCK = 16  # rows per block of the first-fit scan
FEATURES = (
  "inputs",
  "targets",
  "inputs_segmentation",
  "targets_segmentation",
  "inputs_position",
  "targets_position",
)


def num_rows(tokens_per_batch: int, max_len: int, num_devices: int) -> int:
  """Global rows per step: the token budget over max_len, rounded down to a multiple of devices.

  At least one row per device, so a small budget still runs (and says so in the caller's log).
  """
  if num_devices <= 0:
    raise ValueError(f"num_devices must be > 0, got {num_devices}.")
  rows = tokens_per_batch // max_len
  return max(num_devices, rows - rows % num_devices)


def empty_batch(rows: int, max_len: int) -> Batch:
  return {k: np.zeros([rows, max_len], np.int32) for k in FEATURES}


class RowPacker:
  """First-fit packing of (source, target) pairs into `rows` rows of `max_len`, a batch at a time.

  Lengths passed in include EOS. `add` only records where a pair goes; `batch` copies all ids at
  once with vectorised numpy, which is what makes packing cheap per pair.
  """

  def __init__(self, rows: int, max_len: int) -> None:
    self.rows = rows
    self.max_len = max_len
    self.reset()

  def reset(self) -> None:
    # Plain lists: per-pair work is a short scan, where numpy's per-call overhead would dominate.
    # Rows are grouped in blocks of _BLOCK with the most free space of each block kept up to date,
    # so the scan skips blocks where the pair cannot fit (most of them, late in a batch).
    self._src_free = [self.max_len] * self.rows  # [rows] tokens still free
    self._tgt_free = [self.max_len] * self.rows  # [rows]
    num_blocks = -(-self.rows // _BLOCK)
    self._src_block_free = [self.max_len] * num_blocks  # [blocks] max of _src_free over the block
    self._tgt_block_free = [self.max_len] * num_blocks  # [blocks]
    self._segments = [0] * self.rows  # [rows] pairs placed so far
    # (example, row, segment id, source start, target start) of each pair placed.
    self._placed: list[tuple[int, int, int, int, int]] = []

  def __len__(self) -> int:
    return len(self._placed)

  def add(self, example: int, src_len: int, tgt_len: int) -> bool:
    """Places a pair in the first row with room on both sides; False (nothing placed) if none."""
    src_free, tgt_free = self._src_free, self._tgt_free
    src_block_free, tgt_block_free = self._src_block_free, self._tgt_block_free
    for block in range(len(src_block_free)):
      if src_block_free[block] < src_len or tgt_block_free[block] < tgt_len:
        continue
      start = block * _BLOCK
      end = min(start + _BLOCK, self.rows)
      for row in range(start, end):
        if src_free[row] >= src_len and tgt_free[row] >= tgt_len:
          break
      else:
        continue  # each side fits some row of the block, but no row fits both
      self._segments[row] += 1
      src_start, tgt_start = self.max_len - src_free[row], self.max_len - tgt_free[row]
      self._placed.append((example, row, self._segments[row], src_start, tgt_start))
      src_free[row] -= src_len
      tgt_free[row] -= tgt_len
      src_block_free[block] = max(src_free[start:end])
      tgt_block_free[block] = max(tgt_free[start:end])
      return True
    return False

  def batch(self, data: TokenizedSplit, row_slice: slice = slice(None)) -> Batch:
    """The packed batch of the pairs placed since `reset` (rows `row_slice` of it)."""
    out = empty_batch(self.rows, self.max_len)
    if self._placed:
      placed = np.asarray(self._placed, np.int64)  # [pairs, 5]
      examples, rows, segs, src_starts, tgt_starts = placed.T
      for side, ids, offsets, starts in (
        ("inputs", data.src_ids, data.src_offsets, src_starts),
        ("targets", data.tgt_ids, data.tgt_offsets, tgt_starts),
      ):
        lens = np.minimum(offsets[examples + 1] - offsets[examples], self.max_len - 1)  # [pairs]
        _fill(out, side, ids, offsets[examples], lens, rows * self.max_len + starts, segs)
    return {k: v[row_slice] for k, v in out.items()}


def _fill(
  out: Batch,
  side: str,
  ids: np.ndarray,  # [total tokens] the split's flat ids
  id_starts: np.ndarray,  # [pairs] where each pair's ids start in `ids`
  lens: np.ndarray,  # [pairs] tokens to copy (EOS excluded)
  dest_starts: np.ndarray,  # [pairs] flat index in the [rows * max_len] output
  segs: np.ndarray,  # [pairs] segment id of each pair in its row
) -> None:
  """Writes ids + EOS, segment ids and positions of all pairs of one side with a handful of ops."""
  lens_eos = lens + 1  # [pairs]
  total = int(lens_eos.sum())
  first = np.cumsum(lens_eos) - lens_eos  # [pairs] where each pair starts in the token stream
  within = np.arange(total) - np.repeat(first, lens_eos)  # [total] position inside its pair
  is_eos = within == np.repeat(lens, lens_eos)  # [total]
  src_index = np.repeat(id_starts, lens_eos) + within  # [total]
  if len(ids):
    tokens = np.where(is_eos, EOS_ID, ids[np.where(is_eos, 0, src_index)])
  else:
    tokens = np.full([total], EOS_ID)
  dest = np.repeat(dest_starts, lens_eos) + within  # [total]
  out[side].reshape(-1)[dest] = tokens
  out[f"{side}_segmentation"].reshape(-1)[dest] = np.repeat(segs, lens_eos)
  out[f"{side}_position"].reshape(-1)[dest] = within
