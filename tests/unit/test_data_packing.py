"""Packing and the training iterator on synthetic token arrays (no tokenizer, fast).

Pair i's source and target both start with token 3 + i, so a packed segment can be traced back to
its pair and the two sides of a segment checked to be the same pair.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.data import packing, streams
from flaxformer_nmt.data.tokenized import TokenizedSplit
from flaxformer_nmt.model.tokens import EOS_ID


def _split(src_lens, tgt_lens, seed: int = 0) -> TokenizedSplit:
  """Pairs of the given lengths (EOS excluded); pair i's tokens start with 3 + i."""
  rng = np.random.default_rng(seed)

  def side(lens):
    seqs = [
      np.concatenate([[3 + i], rng.integers(3, 60_000, max(n - 1, 0))])[:n]
      for i, n in enumerate(lens)
    ]
    ids = np.concatenate(seqs).astype(np.int32) if seqs else np.zeros([0], np.int32)
    return ids, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

  src_ids, src_offsets = side(np.asarray(src_lens))
  tgt_ids, tgt_offsets = side(np.asarray(tgt_lens))
  return TokenizedSplit(src_ids, src_offsets, tgt_ids, tgt_offsets)


def _multi30k_like(n: int, seed: int = 0) -> TokenizedSplit:
  """Lengths like Multi30k's with an 8k vocabulary: ~14 tokens a side, long right tail."""
  rng = np.random.default_rng(seed)
  src = np.clip(np.round(rng.lognormal(np.log(13), 0.35, n)), 2, 60).astype(int)
  tgt = np.clip(src + np.round(rng.normal(0.5, 2.5, n)), 2, 60).astype(int)
  return _split(src, tgt, seed)


def _pair(data: TokenizedSplit, i: int) -> tuple[np.ndarray, np.ndarray]:
  """Ids of pair i, source and target (EOS excluded)."""
  s, t = data.src_offsets, data.tgt_offsets
  return data.src_ids[s[i] : s[i + 1]], data.tgt_ids[t[i] : t[i + 1]]


def _segments(batch: dict[str, np.ndarray], side: str) -> dict[tuple[int, int], np.ndarray]:
  """{(row, segment id): tokens} of one side, checking positions and the closing EOS."""
  out = {}
  seg, pos, tok = batch[f"{side}_segmentation"], batch[f"{side}_position"], batch[side]
  for r in range(seg.shape[0]):
    assert np.all(tok[r][seg[r] == 0] == 0) and np.all(pos[r][seg[r] == 0] == 0)
    ids = sorted(set(seg[r][seg[r] > 0].tolist()))
    assert ids == list(range(1, len(ids) + 1))  # 1, 2, 3 ... in order
    for k in ids:
      where = np.flatnonzero(seg[r] == k)
      assert np.all(np.diff(where) == 1)  # contiguous
      assert pos[r][where].tolist() == list(range(len(where)))
      assert tok[r][where[-1]] == EOS_ID and EOS_ID not in tok[r][where[:-1]]
      out[(r, k)] = tok[r][where[:-1]]
  return out


def _pairs_in(batch: dict[str, np.ndarray], data: TokenizedSplit) -> list[int]:
  """Indices of the pairs in a batch, checking both sides of each segment are that pair's ids."""
  src, tgt = _segments(batch, "inputs"), _segments(batch, "targets")
  assert src.keys() == tgt.keys()
  pairs = []
  for key in src:
    i = int(src[key][0]) - 3
    want_src, want_tgt = _pair(data, i)
    assert np.array_equal(src[key], want_src) and np.array_equal(tgt[key], want_tgt)
    pairs.append(i)
  return pairs


def test_num_rows() -> None:
  assert packing.num_rows(25_000, 256, 1) == 97
  assert packing.num_rows(25_000, 256, 8) == 96
  assert packing.num_rows(100, 64, 8) == 8  # at least one row per device


def test_batches_are_valid_packings_within_budget() -> None:
  data = _multi30k_like(3000)
  tokens_per_batch, max_len = 2048, 64
  rows = packing.num_rows(tokens_per_batch, max_len, 8)
  it = streams.TrainIterator(data, rows, max_len, seed=0)
  for _ in range(5):
    batch = next(it)
    assert set(batch) == set(packing.FEATURES)
    for v in batch.values():
      assert v.shape == (rows, max_len) and v.dtype == np.int32
    assert rows * max_len <= tokens_per_batch
    pairs = _pairs_in(batch, data)
    assert len(pairs) == len(set(pairs)) > rows


def test_non_padding_share_on_multi30k_like_lengths() -> None:
  data = _multi30k_like(4000)
  it = streams.TrainIterator(data, packing.num_rows(4096, 64, 8), 64, seed=0)
  batches = [next(it) for _ in range(20)]
  for side in ("inputs", "targets"):
    share = np.mean([np.mean(b[side] > 0) for b in batches])
    assert share >= 0.9, (side, share)


def test_drops_are_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
  # On absl's own logger: once any test in this process has parsed absl's flags, its level is
  # --verbosity's (WARNING), whatever the root logger's is, and INFO lines never reach caplog.
  caplog.set_level(logging.INFO, logger="absl")
  #          ok  long-src  empty-tgt  ok  long-tgt  ok  max fits exactly
  src_lens = [5, 20, 4, 3, 2, 6, 15]
  tgt_lens = [5, 3, 0, 3, 16, 6, 15]
  it = streams.TrainIterator(_split(src_lens, tgt_lens), 2, 16, seed=0)
  assert it.examples_per_epoch == 4
  assert "4 of 7 pairs; dropped 2 with a side longer than data.max_len=16" in caplog.text
  assert "and 1 with an empty side" in caplog.text
  seen = set()
  for _ in range(6):
    seen |= set(_pairs_in(next(it), it._data))
  assert seen == {0, 3, 5, 6}


def test_nothing_left_is_one_clear_error() -> None:
  with pytest.raises(errors.DataError, match="No training pairs left: 0 of 2 pairs"):
    streams.TrainIterator(_split([40, 0], [3, 3]), 2, 16, seed=0)


def test_every_pair_once_per_epoch() -> None:
  data = _multi30k_like(500)
  it = streams.TrainIterator(data, 8, 64, seed=0)
  seen = []
  while it.get_state()["epoch"] == 0:
    seen += _pairs_in(next(it), data)
  carried = it.get_state()["index"]  # pairs of epoch 1 already in the last batch
  counts = np.bincount(seen, minlength=len(data))
  assert len(seen) == len(data) + carried
  assert counts.min() >= 1 and counts.max() <= 2 and (counts == 2).sum() == carried


def test_same_seed_same_batches_other_seed_other_batches() -> None:
  data = _multi30k_like(1000)
  a, b, c = (streams.TrainIterator(data, 8, 64, seed=s) for s in (0, 0, 1))
  for _ in range(4):
    x, y, z = next(a), next(b), next(c)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert not np.array_equal(x["inputs"], z["inputs"])


@pytest.mark.parametrize("skip", [3, 40])  # 40 batches cross an epoch boundary
def test_restore_continues_with_next_batch(skip: int) -> None:
  data = _multi30k_like(300)
  it = streams.TrainIterator(data, 8, 64, seed=0)
  for _ in range(skip):
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint
  expected = [next(it) for _ in range(3)]
  restored = streams.TrainIterator(data, 8, 64, seed=0)
  restored.set_state(state)
  for want in expected:
    got = next(restored)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])
  if skip == 40:
    assert state["epoch"] >= 1


def test_bad_state() -> None:
  it = streams.TrainIterator(_multi30k_like(50), 8, 64, seed=0)
  with pytest.raises(errors.CheckpointError, match="does not fit this data"):
    it.set_state({"epoch": 0, "index": 51})


def test_eval_batches_in_order_nothing_dropped() -> None:
  src_lens = [5, 40, 0, 3, 7, 12, 9, 1, 4, 30, 8]  # one over-long, one empty
  tgt_lens = [4, 3, 2, 60, 7, 11, 10, 2, 3, 2, 9]
  data = _split(src_lens, tgt_lens)
  max_len, rows = 16, 4
  batches = list(streams.eval_batches(data, rows, max_len))
  order = []
  for b in batches:
    seg_src, seg_tgt = _segments(b, "inputs"), _segments(b, "targets")
    in_batch = []
    for key in seg_tgt:
      i = int(seg_tgt[key][0]) - 3
      in_batch.append(i)
      want_src = _pair(data, i)[0][: max_len - 1]
      want_tgt = _pair(data, i)[1][: max_len - 1]  # truncated, still closed by EOS
      assert np.array_equal(seg_tgt[key], want_tgt)
      if len(want_src):
        assert np.array_equal(seg_src[key], want_src)
      else:  # an empty source is just EOS
        assert len(seg_src[key]) == 0
    order.append(sorted(in_batch))
  flat = [i for part in order for i in part]
  assert flat == list(range(len(data)))  # each once, batches in order
  assert np.all(batches[-1]["targets"][-1] == 0)  # the last batch is padded with empty rows


def test_eval_batches_split_over_processes() -> None:
  data = _multi30k_like(200)
  whole = list(streams.eval_batches(data, 8, 64))
  parts = [list(streams.eval_batches(data, 8, 64, p, 2)) for p in range(2)]
  assert len(parts[0]) == len(parts[1]) == len(whole)
  for w, p0, p1 in zip(whole, *parts, strict=True):
    np.testing.assert_array_equal(np.concatenate([p0["targets"], p1["targets"]]), w["targets"])


def test_each_epoch_has_its_own_order() -> None:
  data = _multi30k_like(300)
  first, second = (streams.TrainIterator(data, 8, 64, seed=0) for _ in range(2))
  second.set_state({"epoch": 1, "index": 0})
  assert _pairs_in(next(first), data) != _pairs_in(next(second), data)
