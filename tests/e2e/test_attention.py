"""Attention pictures: `--mode=attention` on a trained demo model, and what is drawn."""

from __future__ import annotations

import json

import matplotlib.image
import numpy as np
import pytest

from flaxformer_nmt.decoding import attention_pictures as attention

import helpers

# The tests share module fixtures: one worker runs them all (pyproject: --dist=loadgroup).
pytestmark = pytest.mark.xdist_group("attention")

TEXT = "We need three hundred and forty-two chairs."


@pytest.fixture(scope="module")
def pictures(trained_demo, tmp_path_factory):
  """main.py --mode=attention on a copy of the trained demo: (result, output folder)."""
  folder = tmp_path_factory.mktemp("attention")
  result, work, out = helpers.mode_on_a_copy(trained_demo[1], folder, "attention", f"--text={TEXT}")
  assert result == json.loads((work / "attention_result.json").read_text())
  return result, out


def test_attention_pngs_are_layer_by_head_grids(pictures):
  result, out = pictures
  layers, heads = 2, 4  # configs/demo.py: the tiny size
  # 1.6-inch panels plus margins of 1.6 (width: labels and the colour scale) and 0.9 (height)
  # inches, at 100 dpi: 4 panels wide (1.6 + 6.4 = 8.0 inches) and 2 high (0.9 + 3.2 = 4.1).
  expected = (410, 800)  # [height, width] pixels
  for kind in attention.KINDS:
    assert result["grids"][kind] == [layers, heads]
    image = matplotlib.image.imread(out / f"{kind}.png")  # [height, width, RGBA]
    assert image.shape[:2] == expected, kind
    assert image.std() > 0.05  # not a blank canvas
  assert matplotlib.image.imread(out / "positional_encoding.png").shape[0] > 100
  assert result["source_pieces"][-1] == "</s>" and result["translation"]


def test_attention_probabilities_are_what_is_drawn(pictures):
  result, out = pictures
  maps = np.load(out / "attention.npz")
  src, tgt = len(result["source_pieces"]), len(result["target_pieces"])
  shapes = {
    "encoder_self_attention": (2, 4, src, src),
    "decoder_self_attention": (2, 4, tgt, tgt),
    "cross_attention": (2, 4, tgt, src),
  }
  for kind, shape in shapes.items():
    assert maps[kind].shape == shape
    np.testing.assert_allclose(maps[kind].sum(-1), 1.0, atol=1e-5)  # each row a distribution
  # The decoder sees only the past: nothing above the diagonal.
  assert np.all(np.triu(maps["decoder_self_attention"], k=1) < 1e-6)
