"""Attention and positional-encoding pictures: `--mode=attention --text="..."`.

The model translates the sentence (config.decode's search), then one teacher-forced pass over
(source, its own translation) collects every attention probability matrix, which the layers sow
only when asked (`MultiHeadAttention` under the `intermediates` collection). Each picture is a
grid of layers (rows) x heads (columns):

- encoder self-attention: source pieces attending to source pieces;
- decoder self-attention: rows are the target pieces being predicted, columns the decoder's
  inputs (`<s>` then the target shifted right), so row t sees columns 0..t;
- cross-attention: rows are the target pieces being predicted, columns the source pieces.

Source rows end with `</s>` (EOS is appended to every source, as in training); targets end with
the predicted `</s>`. The probabilities are also saved, as `attention.npz`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flaxformer_nmt.decoding import decode
from flaxformer_nmt.model import layers
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.model.transformer import Transformer


def _pyplot() -> Any:
  """matplotlib.pyplot on the file-only Agg backend, imported when a picture is drawn, not with
  this module (about a second: each test worker that imports the module paid it)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")  # files only; no display needed
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  return plt


KINDS = ("encoder_self_attention", "decoder_self_attention", "cross_attention")
PANEL_INCHES = 1.6  # side of one layer x head panel
MARGIN_INCHES = (1.6, 0.9)  # added to the width and height: labels, titles, the colour scale
DPI = 100


def attention_maps(
  model: Transformer, params: Any, source_ids: Sequence[int], target_ids: Sequence[int]
) -> dict[str, np.ndarray]:
  """Every layer's attention probabilities for one sentence pair.

  source_ids and target_ids end in EOS. Returns {kind: [layers, heads, queries, keys]} float32.
  """
  inputs = jnp.asarray([list(source_ids)], jnp.int32)  # [1, S]
  targets = jnp.asarray([list(target_ids)], jnp.int32)  # [1, T]
  _, state = _forward(model, params, inputs, targets)
  sown = state["intermediates"]
  maps: dict[str, list[np.ndarray]] = {kind: [] for kind in KINDS}
  for i in range(model.cfg.num_layers):
    maps["encoder_self_attention"].append(_weights(sown[f"encoder_{i}"]["self_attention"]))
  for i in range(model.cfg.decoder_depth):  # an imported model's decoder may differ in depth
    dec = sown[f"decoder_{i}"]
    maps["decoder_self_attention"].append(_weights(dec["self_attention"]))
    maps["cross_attention"].append(_weights(dec["cross_attention"]))
  return {kind: np.stack(ws) for kind, ws in maps.items()}


def _forward(model: Transformer, params: Any, inputs: jax.Array, targets: jax.Array):
  return jax.jit(lambda p, x, y: model.apply({"params": p}, x, y, mutable=["intermediates"]))(
    params, inputs, targets
  )


def _weights(module: dict) -> np.ndarray:
  # Sown as a one-element tuple of [1, heads, queries, keys].
  return np.asarray(module["attention_weights"][0][0], np.float32)


def translate_ids(
  model: Transformer,
  params: Any,
  source_ids: Sequence[int],
  search: decode.SearchConfig,
  first_id: int | None = None,
) -> list[int]:
  """The model's own translation of one source (ids ending in EOS), EOS included when produced;
  `first_id`: its forced first token (a many-to-many model's target language)."""
  first = None if first_id is None else jnp.asarray([first_id], jnp.int32)
  if first is not None:
    search = dataclasses.replace(search, force_first=True)
  inputs = jnp.asarray([list(source_ids)], jnp.int32)
  result = decode.decode_batch(model, params, inputs, search, first_ids=first)
  tokens = [int(t) for t in np.asarray(result.tokens[0])[: int(result.lengths[0])]]
  return [t for t in tokens if t != PAD_ID]


def plot_grid(
  weights: np.ndarray,
  row_labels: Sequence[str],
  col_labels: Sequence[str],
  title: str,
  path: str,
) -> tuple[int, int]:
  """Writes a layers x heads grid of heatmaps to `path` (PNG); returns the grid (rows, columns).

  weights: [layers, heads, queries, keys]. Only the outer panels carry piece labels (the left
  column the query pieces, the bottom row the key pieces), so a base-size grid stays legible.
  The figure is PANEL_INCHES per panel plus fixed margins, at DPI dots per inch.
  """
  num_layers, num_heads = weights.shape[:2]
  size = grid_figure_inches(num_layers, num_heads)
  plt = _pyplot()
  fig, axes = plt.subplots(num_layers, num_heads, figsize=size, squeeze=False)
  font = max(3.0, min(7.0, 110.0 / max(len(row_labels), len(col_labels), 1)))
  for layer in range(num_layers):
    for head in range(num_heads):
      ax = axes[layer, head]
      image = ax.imshow(weights[layer, head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
      ax.set_xticks(range(len(col_labels)))
      ax.set_yticks(range(len(row_labels)))
      ax.set_xticklabels(col_labels if layer == num_layers - 1 else [], rotation=90, fontsize=font)
      ax.set_yticklabels(row_labels if head == 0 else [], fontsize=font)
      ax.tick_params(length=0)
      if layer == 0:
        ax.set_title(f"head {head}", fontsize=8)
      if head == 0:
        ax.set_ylabel(f"layer {layer}", fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.subplots_adjust(left=0.12, right=0.9, bottom=0.12, top=0.9, wspace=0.08, hspace=0.08)
  # One colour scale for every panel (all share vmin 0, vmax 1): what a colour means.
  scale = fig.add_axes((0.92, 0.12, 0.015, 0.78))  # [left, bottom, width, height] of the figure
  fig.colorbar(image, cax=scale).ax.tick_params(labelsize=6)
  scale.set_ylabel("attention probability", fontsize=7)
  fig.savefig(path, dpi=DPI)
  plt.close(fig)
  return num_layers, num_heads


def grid_figure_inches(num_layers: int, num_heads: int) -> tuple[float, float]:
  """(width, height) of a layers x heads grid figure; its PNG is that times DPI pixels."""
  return (
    MARGIN_INCHES[0] + PANEL_INCHES * num_heads,
    MARGIN_INCHES[1] + PANEL_INCHES * num_layers,
  )


def plot_positional_encoding(d_model: int, length: int, path: str) -> None:
  """The sinusoidal table (Sec. 3.5), positions x dimensions, as used by the model."""
  table = np.asarray(layers.sinusoidal_encoding(jnp.arange(length), d_model))  # [length, d_model]
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(8, 4))
  image = ax.imshow(table, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto")
  ax.set_xlabel("dimension (sin and cos interleaved: 2i, 2i + 1)")
  ax.set_ylabel("position")
  ax.set_title(f"Sinusoidal positional encoding, d_model = {d_model}")
  fig.colorbar(image, ax=ax, fraction=0.03)
  fig.tight_layout()
  fig.savefig(path, dpi=DPI)
  plt.close(fig)


def write_pictures(
  model: Transformer,
  params: Any,
  pieces: Any,  # a callable id -> piece
  source_ids: Sequence[int],
  target_ids: Sequence[int],
  out_dir: str,
) -> dict[str, Any]:
  """All three attention grids, the positional-encoding picture and attention.npz, in out_dir."""
  os.makedirs(out_dir, exist_ok=True)
  maps = attention_maps(model, params, source_ids, target_ids)
  src = [_label(pieces, i) for i in source_ids]
  tgt = [_label(pieces, i) for i in target_ids]
  tgt_in = ["<s>", *tgt[:-1]]
  axes = {
    "encoder_self_attention": (src, src),
    "decoder_self_attention": (tgt, tgt_in),
    "cross_attention": (tgt, src),
  }
  files: dict[str, str] = {}
  grids: dict[str, list[int]] = {}
  for kind, (rows, cols) in axes.items():
    path = os.path.join(out_dir, f"{kind}.png")
    title = f"{kind.replace('_', ' ')}: rows attend to columns (layers x heads)"
    grids[kind] = list(plot_grid(maps[kind], rows, cols, title, path))
    files[kind] = path
  length = max(64, len(source_ids), len(target_ids))
  files["positional_encoding"] = os.path.join(out_dir, "positional_encoding.png")
  plot_positional_encoding(
    model.cfg.d_model, min(length, model.cfg.max_len), files["positional_encoding"]
  )
  np.savez(os.path.join(out_dir, "attention.npz"), **maps)
  return {"source_pieces": src, "target_pieces": tgt, "grids": grids, "files": files}


def _label(pieces: Any, i: int) -> str:
  return "</s>" if i == EOS_ID else pieces(i)
