"""Model parameters for unit tests of structure, drawn on the host (no init program compiled)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def random_params(cfg: Any, seed: int = 0) -> Any:
  """Parameters for the model config `cfg`, drawn on the host from the distributions
  `init_params` uses (model/layers.py, attention.py, transformer.py): Xavier-uniform projections,
  normal embeddings (std d_model^-0.5; a learned position table 0.02), flax's default (LeCun
  truncated normal) for an unshared output matrix, zero biases, unit scales. Read-only arrays,
  as `init_params`' are immutable: a test that edits parameters copies them first.

  For tests of structure (masks, caches, searches, conversions), which hold for any parameters of
  the right shapes and scales: `init_params` is a program of its own per model config (per xdist
  worker), the costliest the unit tier compiles per config (1.6 s from an empty cache, 0.4 s to
  load from a kept one; tests/compile_profile.py), and these tests don't check its values. Tests
  of the initialization itself, and those whose tolerances were set on its values, keep
  `init_params`. A parameter this does not know (a new layer's) fails here, by name.
  """
  from flaxformer_nmt.model.shapes import abstract_params  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)

  def draw(path: tuple[Any, ...], leaf: jax.ShapeDtypeStruct) -> np.ndarray:
    names = [getattr(p, "key", str(p)) for p in path]
    name, shape = names[-1], leaf.shape
    if name == "scale":  # layer norms
      out = np.ones(shape)
    elif name == "bias" or name.endswith("_bias"):  # dense, layer norm, attention, logits
      out = np.zeros(shape)
    elif name == "embedding":
      out = rng.normal(0.0, cfg.d_model**-0.5, shape)
    elif name == "pos_embedding":
      out = rng.normal(0.0, 0.02, shape)
    elif names[-2:] == ["logits_dense", "kernel"]:  # nn.Dense's default: LeCun truncated normal
      z = rng.normal(size=shape)
      while (outside := np.abs(z) > 2.0).any():  # truncated at two standard deviations
        z[outside] = rng.normal(size=int(outside.sum()))
      out = z * shape[0] ** -0.5 / 0.87962566103423978  # 0.88: the truncated unit normal's std
    elif name in ("kernel", "query", "key", "value", "out") and len(shape) == 2:
      limit = np.sqrt(6.0 / sum(shape))  # Xavier uniform of a [fan_in, fan_out] matrix
      out = rng.uniform(-limit, limit, shape)
    else:
      raise ValueError(f"random_params: no initializer known for {'/'.join(names)} {shape}")
    out = out.astype(leaf.dtype)
    out.setflags(write=False)
    return out

  return jax.tree_util.tree_map_with_path(draw, abstract_params(cfg))
