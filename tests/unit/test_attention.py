"""Attention pictures: a grid of layers x heads (tests/e2e/test_attention.py runs the mode)."""

from __future__ import annotations

import matplotlib.image
import numpy as np

from flaxformer_nmt.decoding import attention_pictures as attention

TEXT = "We need three hundred and forty-two chairs."


def test_a_grid_has_one_panel_per_layer_and_head(tmp_path):
  weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(3, 2, 4))  # [3, 2, 4, 5]
  grid = attention.plot_grid(weights, list("abcd"), list("vwxyz"), "t", str(tmp_path / "g.png"))
  assert grid == (3, 2)
  image = matplotlib.image.imread(tmp_path / "g.png")
  # 2 panels of 1.6 inches wide plus 1.2 of margin, 3 high plus 0.9, at 100 dpi.
  assert image.shape[:2] == (570, 440)  # [height, width] pixels
