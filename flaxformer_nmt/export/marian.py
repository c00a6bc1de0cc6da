"""Our parameters <-> transformers' Marian weights (MarianMTModel), both ways, in numpy.

transformers' Marian (models/marian/modeling_marian.py, 5.x) is this package's post-LN Transformer
up to the options config.model now has, and two conventions converted here:

- Positions. `MarianSinusoidalPositionalEmbedding._init_weight` puts sin(pos / 10000^(2i/D)) in
  feature i of the first half and the cosine in feature D/2 + i (`out[:, 0:sentinel] = sin`,
  `out[:, sentinel:] = cos`); ours interleave them (features 2i and 2i+1, model/layers.py). The
  model is equivariant to one permutation of the residual stream's D features, applied to every
  weight that reads or writes it (embeddings, layer norms, the D side of each projection), so
  import permutes D into our layout and export back: the same function, exactly.
- Ids. Marian's `</s>`=0, `<unk>`=1 and `<pad>`=last (its decoder start) become our 1, 2 and 0
  (model/tokens.py), the other pieces keeping their order; the embedding rows and
  final_logits_bias are permuted with data/pair_vocabulary.marian_order.

What maps to what (W is torch's [out, in] `nn.Linear.weight`, our kernels are [in, out]):
  model.shared.weight (tied to lm_head, both stacks)  -> embedding/embedding
  *.self_attn / encoder_attn .{q,k,v,out}_proj        -> self_attention / cross_attention
                                                         .{query,key,value,out}[_bias]
  *.self_attn_layer_norm, encoder_attn_layer_norm,     -> attention_block (decoder:
    final_layer_norm                                     self_attention_block,
                                                         cross_attention_block), ffn_block /ln
  *.fc1, fc2                                           -> ffn/wi, ffn/wo
  final_logits_bias [1, V]                             -> logits_bias [V]
Attention scaling is the same product in both (MarianAttention scales q by head_dim^-0.5; we
divide the scores by sqrt(d_k)), and so is the embedding scale (`embed_scale = sqrt(d_model)`
with `scale_embedding=True`, which every OPUS-MT config has; ours always scales).
"""

from __future__ import annotations

from typing import Any

import numpy as np

PyTree = Any

# Our block names <- Marian's layer-norm names, per stack.
_ENCODER_NORMS = {"self_attn_layer_norm": "attention_block", "final_layer_norm": "ffn_block"}
_DECODER_NORMS = {
  "self_attn_layer_norm": "self_attention_block",
  "encoder_attn_layer_norm": "cross_attention_block",
  "final_layer_norm": "ffn_block",
}
_PROJECTIONS = {"q_proj": "query", "k_proj": "key", "v_proj": "value", "out_proj": "out"}


def feature_order(d_model: int) -> np.ndarray:
  """[D] int: for each of our features, the Marian feature it is (ours[f] = marian[order[f]]):
  our 2i is Marian's i (a sine), our 2i+1 is Marian's D/2 + i (its cosine)."""
  half = np.arange(d_model // 2)
  return np.stack([half, half + d_model // 2], axis=1).reshape(-1)


def _attention_to_ours(sd: dict[str, np.ndarray], prefix: str, src: np.ndarray) -> PyTree:
  out = {}
  for theirs, ours in _PROJECTIONS.items():
    w = sd[f"{prefix}.{theirs}.weight"].T  # [in, out]
    b = sd.get(f"{prefix}.{theirs}.bias")
    if ours == "out":  # heads in, residual out
      out[ours] = w[:, src]
      out[f"{ours}_bias"] = b[src] if b is not None else np.zeros(w.shape[1], w.dtype)
    else:  # residual in, heads out
      out[ours] = w[src, :]
      out[f"{ours}_bias"] = b if b is not None else np.zeros(w.shape[1], w.dtype)
  return out


def _ffn_to_ours(sd: dict[str, np.ndarray], prefix: str, src: np.ndarray) -> PyTree:
  return {
    "wi": {"kernel": sd[f"{prefix}.fc1.weight"].T[src, :], "bias": sd[f"{prefix}.fc1.bias"]},
    "wo": {"kernel": sd[f"{prefix}.fc2.weight"].T[:, src], "bias": sd[f"{prefix}.fc2.bias"][src]},
  }


def _norm_to_ours(sd: dict[str, np.ndarray], name: str, src: np.ndarray) -> PyTree:
  return {"ln": {"scale": sd[f"{name}.weight"][src], "bias": sd[f"{name}.bias"][src]}}


def to_ours(
  sd: dict[str, np.ndarray],
  order: np.ndarray,
  encoder_layers: int,
  decoder_layers: int,
  features: np.ndarray | None = None,
) -> PyTree:
  """Our parameter tree (attention biases and logits_bias included) from a MarianMTModel state
  dict `sd` (float32 numpy); `order` is pair_vocabulary.marian_order of its vocab.json.
  `features`: our feature f is theirs features[f] (default `feature_order`, Marian's sinusoid;
  the identity for a model whose position table is taken as it is: export/m2m100.py)."""
  shared = sd["model.shared.weight"]  # [V, D]
  src = feature_order(shared.shape[1]) if features is None else features
  params: dict[str, Any] = {"embedding": {"embedding": shared[order][:, src]}}
  for i in range(encoder_layers):
    p = f"model.encoder.layers.{i}"
    layer = {"self_attention": _attention_to_ours(sd, f"{p}.self_attn", src)}
    layer["ffn"] = _ffn_to_ours(sd, p, src)
    for theirs, ours in _ENCODER_NORMS.items():
      layer[ours] = _norm_to_ours(sd, f"{p}.{theirs}", src)
    params[f"encoder_{i}"] = layer
  for i in range(decoder_layers):
    p = f"model.decoder.layers.{i}"
    layer = {
      "self_attention": _attention_to_ours(sd, f"{p}.self_attn", src),
      "cross_attention": _attention_to_ours(sd, f"{p}.encoder_attn", src),
      "ffn": _ffn_to_ours(sd, p, src),
    }
    for theirs, ours in _DECODER_NORMS.items():
      layer[ours] = _norm_to_ours(sd, f"{p}.{theirs}", src)
    params[f"decoder_{i}"] = layer
  bias = sd.get("final_logits_bias")
  vocab = shared.shape[0]
  params["logits_bias"] = (
    bias.reshape(-1)[order] if bias is not None else np.zeros(vocab, shared.dtype)
  )
  return params


def _attention_to_marian(p: PyTree, prefix: str, inv: np.ndarray) -> dict[str, np.ndarray]:
  out = {}
  for theirs, ours in _PROJECTIONS.items():
    w = np.asarray(p[ours])  # [in, out]
    b = p.get(f"{ours}_bias")
    b = np.zeros(w.shape[1], w.dtype) if b is None else np.asarray(b)
    if ours == "out":
      out[f"{prefix}.{theirs}.weight"] = w[:, inv].T
      out[f"{prefix}.{theirs}.bias"] = b[inv]
    else:
      out[f"{prefix}.{theirs}.weight"] = w[inv, :].T
      out[f"{prefix}.{theirs}.bias"] = b
  return out


def _ffn_to_marian(p: PyTree, prefix: str, inv: np.ndarray) -> dict[str, np.ndarray]:
  wi, wo = p["wi"], p["wo"]
  return {
    f"{prefix}.fc1.weight": np.asarray(wi["kernel"])[inv, :].T,
    f"{prefix}.fc1.bias": np.asarray(wi["bias"]),
    f"{prefix}.fc2.weight": np.asarray(wo["kernel"])[:, inv].T,
    f"{prefix}.fc2.bias": np.asarray(wo["bias"])[inv],
  }


def _norm_to_marian(p: PyTree, name: str, inv: np.ndarray) -> dict[str, np.ndarray]:
  return {
    f"{name}.weight": np.asarray(p["ln"]["scale"])[inv],
    f"{name}.bias": np.asarray(p["ln"]["bias"])[inv],
  }


def to_marian(
  params: PyTree,
  order: np.ndarray,
  encoder_layers: int,
  decoder_layers: int,
  features: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
  """A MarianMTModel state dict (the keys `save_pretrained` writes: the tied embeddings once, as
  model.shared.weight) from our parameters; zeros where ours have no attention biases or
  logits_bias. `order[j]` is the Marian id of our id j; `features` as `to_ours`'s."""
  table = np.asarray(params["embedding"]["embedding"])  # [V, D]
  inv = np.argsort(feature_order(table.shape[1]) if features is None else features)
  rows = np.argsort(order)  # Marian id -> ours
  sd: dict[str, np.ndarray] = {"model.shared.weight": table[rows][:, inv]}
  for i in range(encoder_layers):
    p, layer = f"model.encoder.layers.{i}", params[f"encoder_{i}"]
    sd.update(_attention_to_marian(layer["self_attention"], f"{p}.self_attn", inv))
    sd.update(_ffn_to_marian(layer["ffn"], p, inv))
    for theirs, ours in _ENCODER_NORMS.items():
      sd.update(_norm_to_marian(layer[ours], f"{p}.{theirs}", inv))
  for i in range(decoder_layers):
    p, layer = f"model.decoder.layers.{i}", params[f"decoder_{i}"]
    sd.update(_attention_to_marian(layer["self_attention"], f"{p}.self_attn", inv))
    sd.update(_attention_to_marian(layer["cross_attention"], f"{p}.encoder_attn", inv))
    sd.update(_ffn_to_marian(layer["ffn"], p, inv))
    for theirs, ours in _DECODER_NORMS.items():
      sd.update(_norm_to_marian(layer[ours], f"{p}.{theirs}", inv))
  bias = params.get("logits_bias")
  bias = np.zeros(table.shape[0], table.dtype) if bias is None else np.asarray(bias)
  sd["final_logits_bias"] = bias[rows][None, :]
  return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}
