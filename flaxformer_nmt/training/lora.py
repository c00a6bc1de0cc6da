"""Low-rank adapters (LoRA; Hu et al., 2021) for fine-tuning: `config.optim.lora_rank` > 0.

A targeted kernel W [d_in, d_out] (an attention projection, an FFN matrix) is trained as
W0 + s * A @ B, with W0 frozen (the run's starting weights), A [d_in, r] and B [r, d_out] the only
trained parameters, and s = lora_alpha / r (PEFT's `scaling`). A starts uniform in
+-1/sqrt(d_in), B at zero (PEFT's initialisation), so step 0 computes exactly the source model.

Why the adapters are applied to the weights rather than beside them (x @ W0 + s * x @ A @ B):
the model's modules, its decoding caches, its exports and every reader of a run's parameters
then stay as they are. The train state keeps `params` merged (W0 + s * A @ B for each targeted
kernel, the untargeted ones as the source's), so eval, translate, averaging, best/, exports and
fine-tuning from a LoRA run read plain parameters; `LoraState` holds W0 and the adapters beside
them. The optimizer sees only the adapters, so the frozen weights hold no Adam moments, and the
gradient of A and B is the exact LoRA gradient (s * dW @ B^T and s * A^T @ dW). Averaging
checkpoints averages the merged kernels: the mean of W0 + s * A @ B, i.e. of B.A as a product,
never of A and B apart.

PEFT's adapter dropout (`optim.lora_dropout`: dropout on the adapter path's input only,
x W0 + s drop(x) A B) is the one thing the merged form cannot compute alone: its train step also
passes the adapters to the model (`dropout_inputs`), whose adapted products add
s (drop(x) - x) A B to x W (model/layers.py `lora_dropout_term`). Evaluation and decoding never
drop out, so they still read the merged params only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
from flax import traverse_util

PyTree = Any
Path = tuple[str, ...]

# `optim.lora_targets` names (config/choices.py) -> the end of the parameter paths they adapt
# (model/attention.py's projections in every attention, self and cross; model/layers.py's
# FeedForward matrices).
TARGETS: dict[str, Path] = {
  "q": ("query",),
  "k": ("key",),
  "v": ("value",),
  "o": ("out",),
  "ffn_in": ("ffn", "wi", "kernel"),
  "ffn_out": ("ffn", "wo", "kernel"),
}
# transformers' module names for the same matrices (Marian's; PEFT's target_modules).
HF_MODULES = {
  "q": "q_proj",
  "k": "k_proj",
  "v": "v_proj",
  "o": "out_proj",
  "ffn_in": "fc1",
  "ffn_out": "fc2",
}


@flax.struct.dataclass
class LoraState:
  """What a LoRA run trains besides its merged `params`: both nested like the params, holding
  only the targeted kernels. Saved in each checkpoint (the `lora` item of the train state)."""

  base: PyTree  # W0 of each targeted kernel: [d_in, d_out], frozen
  adapters: PyTree  # {"a": [d_in, r], "b": [r, d_out]} per targeted kernel: what trains


def parse_targets(spec: str) -> tuple[str, ...]:
  """`optim.lora_targets` ("q,k,v,o", validated by config/checks.py) as names of TARGETS."""
  return tuple(t.strip() for t in spec.split(",") if t.strip())


def scale(rank: int, alpha: float) -> float:
  """s = alpha / r: the factor on A @ B (PEFT's `lora_alpha / r`)."""
  return float(alpha) / rank


def targeted_paths(params: PyTree, targets: Sequence[str]) -> list[Path]:
  """The paths of the 2-D kernels `targets` adapt, in the params' sorted order."""
  ends = [TARGETS[t] for t in targets]
  flat = traverse_util.flatten_dict(flax.core.unfreeze(params))
  return [
    path
    for path in sorted(flat)
    if len(jnp.shape(flat[path])) == 2 and any(path[-len(end) :] == end for end in ends)
  ]


def init(params: PyTree, rank: int, targets: Sequence[str], rng: jax.Array) -> LoraState:
  """W0 (copies of the targeted kernels of `params`) and fresh adapters: A uniform in
  +-1/sqrt(d_in) (PEFT's kaiming_uniform(a=sqrt(5)) bound), B zero. Works on abstract
  params (jax.eval_shape)."""
  flat = traverse_util.flatten_dict(flax.core.unfreeze(params))
  paths = targeted_paths(params, targets)
  if not paths:
    raise ValueError(f"no kernel of this model matches the LoRA targets {', '.join(targets)}")
  keys = jax.random.split(rng, len(paths))
  base, adapters = {}, {}
  for key, path in zip(keys, paths, strict=True):
    w = flat[path]
    d_in, d_out = w.shape
    bound = 1.0 / math.sqrt(d_in)
    base[path] = jnp.asarray(w, jnp.float32)
    adapters[path + ("a",)] = jax.random.uniform(key, (d_in, rank), jnp.float32, -bound, bound)
    adapters[path + ("b",)] = jnp.zeros((rank, d_out), jnp.float32)
  return LoraState(
    base=traverse_util.unflatten_dict(base), adapters=traverse_util.unflatten_dict(adapters)
  )


def delta(adapter: dict[str, jax.Array], s: float) -> jax.Array:
  """s * A @ B: [d_in, d_out], in float32 (the parameters' dtype)."""
  return s * jnp.matmul(adapter["a"], adapter["b"], precision=jax.lax.Precision.HIGHEST)


def merged(params: PyTree, lora: LoraState, s: float) -> PyTree:
  """`params` with each targeted kernel replaced by W0 + s * A @ B (the rest as they are)."""
  flat = traverse_util.flatten_dict(flax.core.unfreeze(params))
  base = traverse_util.flatten_dict(lora.base)
  adapters = traverse_util.flatten_dict(lora.adapters)
  for path, w0 in base.items():
    adapter = {"a": adapters[path + ("a",)], "b": adapters[path + ("b",)]}
    flat[path] = w0 + delta(adapter, s)
  return traverse_util.unflatten_dict(flat)


def dropout_inputs(adapters: PyTree, s: float) -> PyTree:
  """The model's "lora" collection (model/layers.py LORA_COLLECTION) for adapter dropout: per
  adapted kernel {"a": A, "b": s * B}, nested as the params. Differentiable in `adapters`."""
  flat = traverse_util.flatten_dict(flax.core.unfreeze(adapters))
  return traverse_util.unflatten_dict(
    {path: s * x if path[-1] == "b" else x for path, x in flat.items()}
  )


def count(tree: PyTree) -> int:
  """Number of scalars in a tree (the adapters' share of a model, for the log)."""
  return sum(int(math.prod(jnp.shape(x))) for x in jax.tree.leaves(tree))
