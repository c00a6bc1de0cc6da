"""How a multilingual run samples its training pairs among directions and corpora.

Training draws its pairs from every (direction, corpus) with a temperature (M2M-100, mBART):
direction d gets p_d proportional to n_d^(1/T), where n_d is its corpora's weighted size, and
within a direction each corpus gets its weighted share. T = 1 samples as the data is; T = inf
samples every direction equally.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flaxformer_nmt import errors


def sampling_probabilities(
  direction_of: Sequence[int], weighted_sizes: Sequence[float], temperature: float
) -> np.ndarray:
  """Probability of each group (a direction's corpus) from its direction and weighted size:
  direction d gets p_d proportional to n_d^(1/T), n_d its groups' summed weighted sizes, split
  among its groups in proportion to their weighted sizes. Returns [groups], summing to 1."""
  direction_of = np.asarray(direction_of, np.int64)  # [groups]
  sizes = np.asarray(weighted_sizes, np.float64)  # [groups]
  totals = np.bincount(direction_of, weights=sizes)  # [directions]
  if not totals.sum() > 0:
    raise errors.DataError("No training pairs in any direction.")
  # Relative to the largest, so that a low temperature cannot overflow: (n / n_max)^(1/T) <= 1.
  relative = totals / totals.max()
  scaled = np.where(totals > 0, np.maximum(relative, 1e-300) ** (1.0 / temperature), 0.0)
  p_dir = scaled / scaled.sum()  # [directions]
  share = np.divide(sizes, totals[direction_of], out=np.zeros_like(sizes), where=sizes > 0)
  return p_dir[direction_of] * share


def epoch_counts(
  probabilities: Sequence[float], total: int, rng: np.random.Generator | None = None
) -> np.ndarray:
  """How many of an epoch's `total` draws each group gets: probability x total, rounded down,
  and the draws left over given to groups by their remainders, so the counts sum to `total`
  exactly. With `rng` (an epoch's generator: deterministic) the leftovers are drawn, each group
  with probability its remainder, so its expected count is exactly its share and a group owed
  less than one draw an epoch still gets it over epochs; without `rng` they go to the largest
  remainders."""
  p = np.asarray(probabilities, np.float64)
  exact = p / p.sum() * total
  counts = np.floor(exact).astype(np.int64)
  rest = total - int(counts.sum())
  remainders = exact - counts
  if rest and rng is not None:
    # Systematic sampling: group i is chosen with probability exactly remainders[i] (< 1 each,
    # summing to `rest`), so its expected count is its exact share.
    points = rng.random() + np.arange(rest)  # [rest]
    chosen = np.minimum(np.searchsorted(np.cumsum(remainders), points, side="right"), len(p) - 1)
  else:
    chosen = np.argsort(-remainders, kind="stable")[:rest]
  counts[chosen] += 1
  return counts
