"""Our parameters <-> transformers' M2M100 weights (M2M100ForConditionalGeneration, also
NLLB-200's), both ways, in numpy.

M2M100 (models/m2m_100/modeling_m2m_100.py) names its weights as Marian does (BART's layout:
export/marian.py maps each), and differs in three ways handled here or by the model's options:
- pre-LN with a final layer norm per stack (`model.encoder.layer_norm`, `model.decoder.layer_norm`
  -> our `encoder_norm`, `decoder_norm`; `model.pre_ln`);
- its own position table (`model.positional="m2m100"`, model/layers.py), taken as it is: the
  features are not permuted, unlike Marian's;
- no final_logits_bias; the decoder starts from `</s>` (`model.decoder_start="eos"`).
Ids: fairseq's `<pad>` 1, `</s>` 2, `<unk>` 3 become our 0, 1, 2 (data/fairseq_vocabulary.py),
the embedding rows permuted with `FairseqVocabulary.fairseq_ids`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flaxformer_nmt.export import marian

PyTree = Any
_FINAL_NORMS = {
  "model.encoder.layer_norm": "encoder_norm",
  "model.decoder.layer_norm": "decoder_norm",
}


def to_ours(
  sd: dict[str, np.ndarray], order: np.ndarray, encoder_layers: int, decoder_layers: int
) -> PyTree:
  """Our parameter tree (attention biases, final norms) from an M2M100 state dict `sd` (float32
  numpy); `order[j]` is the fairseq id of our id j."""
  identity = np.arange(sd["model.shared.weight"].shape[1])
  params = marian.to_ours(sd, order, encoder_layers, decoder_layers, features=identity)
  del params["logits_bias"]  # M2M100 has none
  for theirs, ours in _FINAL_NORMS.items():
    params[ours] = {"scale": sd[f"{theirs}.weight"], "bias": sd[f"{theirs}.bias"]}
  return params


def to_m2m100(
  params: PyTree, order: np.ndarray, encoder_layers: int, decoder_layers: int
) -> dict[str, np.ndarray]:
  """An M2M100 state dict (the keys `save_pretrained` writes: the tied embeddings once, as
  model.shared.weight) from our parameters."""
  identity = np.arange(np.asarray(params["embedding"]["embedding"]).shape[1])
  sd = marian.to_marian(params, order, encoder_layers, decoder_layers, features=identity)
  del sd["final_logits_bias"]
  for theirs, ours in _FINAL_NORMS.items():
    sd[f"{theirs}.weight"] = np.asarray(params[ours]["scale"], np.float32)
    sd[f"{theirs}.bias"] = np.asarray(params[ours]["bias"], np.float32)
  return sd
