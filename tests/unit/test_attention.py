"""Attention pictures: a grid of layers x heads (tests/e2e/test_attention.py runs the mode)."""

from __future__ import annotations

import pathlib

import numpy as np

from flaxformer_nmt.decoding import attention_pictures as attention

TEXT = "We need three hundred and forty-two chairs."


def _read_png(path: pathlib.Path) -> np.ndarray:
  """The picture's pixels; matplotlib imported here, not at collection (a few tenths of a second
  in every xdist worker)."""
  import matplotlib.image  # pylint: disable=g-import-not-at-top

  return matplotlib.image.imread(path)


def test_a_grid_has_one_panel_per_layer_and_head(tmp_path):
  weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(3, 2, 4))  # [3, 2, 4, 5]
  grid = attention.plot_grid(weights, list("abcd"), list("vwxyz"), "t", str(tmp_path / "g.png"))
  assert grid == (3, 2)
  image = _read_png(tmp_path / "g.png")
  # 2 panels of 1.6 inches wide plus 1.6 of margin, 3 high plus 0.9, at 100 dpi.
  assert image.shape[:2] == (570, 480)  # [height, width] pixels


def test_a_grid_carries_its_colour_scale(tmp_path):
  """A colour bar right of the panels runs from viridis' dark violet (0, bottom) to its yellow
  (1, top): a reader can tell what a colour means."""
  weights = np.full((1, 1, 3, 3), 1 / 3)
  attention.plot_grid(weights, list("abc"), list("xyz"), "t", str(tmp_path / "g.png"))
  image = _read_png(tmp_path / "g.png")[..., :3]  # [H, W, RGB] in [0, 1]
  height, width = image.shape[:2]
  column = image[:, int(width * 0.927)]  # the middle of the bar: 0.92 + 0.015 / 2
  top, bottom = column[int(height * 0.11)], column[int(height * 0.87)]  # inside the bar's ends
  assert top[0] > 0.8 and top[1] > 0.8 and top[2] < 0.3, top  # yellow
  assert bottom[0] > 0.2 and bottom[1] < 0.1 and bottom[2] > 0.25, bottom  # dark violet
