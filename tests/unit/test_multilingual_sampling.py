"""Many directions in one model: temperature sampling of a multilingual training split, in this
process. Each epoch draws each group's share (p proportional to n^(1/T)), deterministically; a
restored position gives exactly the next batches; and 2 processes x 2 devices give the batches of
1 x 4. The rest of the multilingual tests: test_multilingual.py.
"""

from __future__ import annotations

import numpy as np

from flaxformer_nmt.data import direction_mix, streams, tokenized

import helpers


def test_temperature_probabilities():
  sizes = [1000.0, 100.0, 10.0]
  p1 = direction_mix.sampling_probabilities([0, 1, 2], sizes, 1.0)
  np.testing.assert_allclose(p1, np.array(sizes) / sum(sizes))
  p5 = direction_mix.sampling_probabilities([0, 1, 2], sizes, 5.0)
  expected = np.array(sizes) ** 0.2 / np.sum(np.array(sizes) ** 0.2)
  np.testing.assert_allclose(p5, expected)
  flat = direction_mix.sampling_probabilities([0, 1, 2], sizes, 1e9)
  np.testing.assert_allclose(flat, [1 / 3] * 3, rtol=1e-6)
  sharp = direction_mix.sampling_probabilities([0, 1, 2], [1e4, 10.0, 1.0], 0.01)  # no overflow
  np.testing.assert_allclose(sharp, [1.0, 0.0, 0.0], atol=1e-12)
  # Leftover draws go by remainder: a group owed 0.3 of a draw per epoch gets ~0.3 on average.
  tiny = [0.9 * 10 / 10.3, 0.1 * 10 / 10.3, 0.3 / 10.3]  # 10 draws: owed 8.74, 0.97, 0.29
  got = np.mean(
    [direction_mix.epoch_counts(tiny, 10, np.random.default_rng(e)) for e in range(2000)], axis=0
  )
  np.testing.assert_allclose(got, np.array(tiny) / sum(tiny) * 10, atol=0.05)
  # Two corpora of one direction share its probability by weighted size.
  p = direction_mix.sampling_probabilities([0, 0, 1], [300.0, 100.0, 400.0], 5.0)
  np.testing.assert_allclose(p, [0.375, 0.125, 0.5])
  counts = direction_mix.epoch_counts(p5, 1111)
  assert counts.sum() == 1111 and np.all(np.abs(counts - p5 * 1111) < 1)


def _grouped(sizes: list[int]) -> tuple[tokenized.TokenizedSplit, streams.Groups]:
  """A split of `sizes[g]` pairs per group; pair ids encode (group, index) in their tokens."""
  parts = []
  for g, n in enumerate(sizes):
    lens = np.full(n, 3, np.int64)
    ids = np.stack([np.full(n, 3 + g), 3 + np.arange(n) // 50, 3 + np.arange(n) % 50], 1)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    parts.append(tokenized.TokenizedSplit(ids.reshape(-1), offsets, ids.reshape(-1), offsets))
  split = tokenized.concatenate(parts)
  of_pair = np.concatenate([np.full(n, g, np.int32) for g, n in enumerate(sizes)])
  groups = streams.Groups(of_pair, tuple(range(len(sizes))), (1.0,) * len(sizes), 5.0)
  return split, groups


def _group_of_rows(batch: dict[str, np.ndarray]) -> list[int]:
  """The group of each packed pair: its first source token minus 3."""
  out = []
  for row, seg in zip(batch["inputs"], batch["inputs_segmentation"], strict=True):
    for s in sorted(set(seg.tolist()) - {0}):
      out.append(int(row[seg == s][0]) - 3)
  return out


def test_unequal_corpora_are_sampled_by_temperature_deterministically_and_resume_exactly():
  sizes = [2000, 200, 20]
  split, groups = _grouped(sizes)
  it = streams.TrainIterator(split, rows=8, max_len=16, seed=3, groups=groups)
  counts = it.group_counts.copy()  # epoch 0's
  assert counts.sum() == sum(sizes)
  expected = direction_mix.sampling_probabilities([0, 1, 2], sizes, 5.0) * sum(sizes)
  np.testing.assert_array_less(np.abs(counts - expected), 1.0)
  seen = np.zeros(3, int)
  while it.get_state()["epoch"] == 0:
    seen += np.bincount(_group_of_rows(next(it)), minlength=3)
  # One epoch draws each group's count (the batch that crossed into epoch 1 adds a few).
  assert np.all(seen >= counts) and seen.sum() - sum(sizes) < 8 * 5
  # The small group is repeated (20 pairs drawn ~ 13x), the large one subsampled.
  assert counts[2] > 10 * 20 and counts[0] < 2000
  # Deterministic, and a restored position gives exactly the next batches.
  a = streams.TrainIterator(split, rows=8, max_len=16, seed=3, groups=groups)
  for _ in range(30):
    next(a)
  state = a.get_state()
  want = [next(a) for _ in range(40)]  # crosses an epoch boundary
  b = streams.TrainIterator(split, rows=8, max_len=16, seed=3, groups=groups)
  b.set_state(state)
  for w in want:
    helpers.assert_trees_equal(w, next(b))


def test_grouped_streams_are_the_same_for_one_process_and_for_two():
  sizes = [301, 77, 45]
  split, groups = _grouped(sizes)

  def process(index: int, count: int, local: int) -> streams.DeviceStreams:
    shard = tokenized.Shard(index, count, block=local)
    parts, of_pair = [], []
    for g, n in enumerate(sizes):
      mine = [i for i in range(n) if (i // local) % count == index]
      start = sum(sizes[:g])
      sel = [start + i for i in mine]
      assert len(mine) == shard.size(n)
      parts.append(_take(split, sel))
      of_pair.append(np.full(len(sel), g, np.int32))
    local_groups = streams.Groups(
      np.concatenate(of_pair), groups.direction_of, groups.weights, groups.temperature
    )
    return streams.DeviceStreams(
      tokenized.concatenate(parts),
      num_local=local,
      first_stream=index * local,
      rows_per_device=2,
      max_len=16,
      seed=1,
      groups=local_groups,
    )

  one = process(0, 1, 4)
  two = [process(0, 2, 2), process(1, 2, 2)]
  for _ in range(25):
    whole = next(one)
    halves = [next(p) for p in two]
    joined = {k: np.concatenate([h[k] for h in halves]) for k in whole}
    helpers.assert_trees_equal(whole, joined)


def _take(split: tokenized.TokenizedSplit, rows: list[int]) -> tokenized.TokenizedSplit:
  def pick(ids, offsets):
    chunks = [ids[offsets[i] : offsets[i + 1]] for i in rows]
    lens = np.array([len(c) for c in chunks], np.int64)
    flat = np.concatenate(chunks) if chunks else ids[:0]
    return flat, np.concatenate([[0], np.cumsum(lens)])

  src, src_off = pick(split.src_ids, split.src_offsets)
  tgt, tgt_off = pick(split.tgt_ids, split.tgt_offsets)
  return tokenized.TokenizedSplit(src, src_off, tgt, tgt_off)
