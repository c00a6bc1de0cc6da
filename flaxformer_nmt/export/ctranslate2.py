"""Export a trained model to CTranslate2, a C++ inference engine for Transformer translation.

`main.py --mode=export --format=ctranslate2 --output=DIR` writes a CTranslate2 model directory
(`model.bin`, `config.json`, `shared_vocabulary.json`) plus our `spm.model` (an imported model's
source.spm and target.spm), built with
CTranslate2's model-spec API (`TransformerSpec`), not with one of its converters: none of them
reads Flax parameters, and each would assume another toolkit's conventions. What differs from
CTranslate2's defaults is set by hand:

- post-LN residual blocks (the paper), or pre-LN with a final norm per stack (`model.pre_ln`);
- our positional table, given explicitly: sines and cosines *interleave* over the features
  (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos, as the paper indexes them), where CTranslate2's
  built-in sinusoid puts all sines first; a learned table (`positional="learned"`) the same way;
- layer-norm epsilon `model.layer_norm_epsilon` (the paper runs' 1e-6; CTranslate2's default is
  1e-5);
- embeddings scaled by sqrt(d_model), and one matrix for source, target and the output
  projection (`share_embeddings`), or separate ones;
- attention projections fused (Q/K/V for self-attention, K/V for cross-attention, in
  CTranslate2's [out, in] layout), bias-free as the paper's or with `model.attention_bias`;
  biased FFN layers with `model.activation`; `model.logits_bias` as the projection's bias; the
  decoder's own depth (`model.num_decoder_layers`): an imported OPUS-MT model exports too;
- the decoder starts from id 0 (our PAD piece) rather than a BOS token, and EOS is appended to
  every source (`add_source_eos`), as our encoder sees it.

`ctranslate2` is an optional dependency (`pip install -e ".[export]"`).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import jax
import numpy as np

from flaxformer_nmt import errors
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.data.tokenizer import Vocabulary
from flaxformer_nmt.model import layers
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID, UNK_ID
from flaxformer_nmt.model.transformer import TransformerConfig
from flaxformer_nmt.runtime import files

FORMATS = ("ctranslate2",)
# Weight types CTranslate2 stores (its ACCEPTED_MODEL_TYPES); float32 keeps our weights exactly.
QUANTIZATIONS = (
  "float32",
  "int8",
  "int8_float32",
  "int8_float16",
  "int8_bfloat16",
  "int16",
  "float16",
  "bfloat16",
)


def import_ctranslate2() -> Any:
  """The `ctranslate2` module, or a one-line ConfigError saying how to install it."""
  try:
    import ctranslate2  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.ConfigError(
      f"--mode=export --format=ctranslate2 needs the ctranslate2 package ({e}); install it with "
      "pip install -e '.[export]'."
    ) from None
  return ctranslate2


def check_output_dir(output: str) -> None:
  """Refuses a missing --output or one that would overwrite something (before any work)."""
  if not output or output == "-":
    raise errors.ConfigError("--mode=export writes a directory: give --output=DIR.")
  if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
    raise errors.ConfigError(
      f"--output={output} already exists and is not an empty directory; nothing was written. "
      "Remove it or choose another."
    )
  parent = os.path.dirname(os.path.abspath(output))
  if not os.path.isdir(parent):
    raise errors.ConfigError(f"--output={output}: its parent directory {parent} does not exist.")


def check_model(model: Any) -> None:
  """A one-line ConfigError for a model CTranslate2 cannot hold (`config.model` or the model's
  TransformerConfig): queries and keys narrower than values (Table 3 row B)."""
  if model.d_k and model.d_k != model.d_model // model.num_heads:
    raise errors.ConfigError(
      f"config.model.d_k={model.d_k}: CTranslate2's attention splits queries, keys and values "
      f"into equal widths (d_model / num_heads = {model.d_model // model.num_heads}), so this "
      "model (Table 3 row B) cannot be exported; translate with --mode=translate."
    )


def check_output(output: str, quantization: str, model: Any = None) -> None:
  """Every check of an export's arguments and of `config.model` that needs no trained model:
  one line each, before any work."""
  if model is not None:
    check_model(model)
  if quantization not in QUANTIZATIONS:
    raise errors.ConfigError(
      f"--quantization={quantization}: choose one of {', '.join(QUANTIZATIONS)}."
    )
  check_output_dir(output)
  import_ctranslate2()


def write(session: Any, folder: Any, output: str, quantization: str) -> dict[str, Any]:
  """--mode=export's call (modes.export): the loaded model (decoding/session.Session) to
  `output`."""
  c = session.components
  params = jax.device_get(session.params)
  return export_ctranslate2(c.model_cfg, params, c.tokenizer, output, quantization)


def _np(x: Any) -> np.ndarray:
  return np.asarray(x, dtype=np.float32)


def _linear(spec: Any, kernel: Any, bias: Any = None) -> None:
  """Our y = x @ kernel ([in, out]) as CTranslate2's weight [out, in] (and bias [out])."""
  spec.weight = np.ascontiguousarray(_np(kernel).T)
  if bias is not None:
    spec.bias = _np(bias)


def _layer_norm(spec: Any, ln: dict[str, Any]) -> None:
  spec.gamma, spec.beta = _np(ln["scale"]), _np(ln["bias"])


def _bias(attn: dict[str, Any], *names: str) -> np.ndarray | None:
  """The projections' biases, concatenated as their kernels are (None: a paper model has none)."""
  if f"{names[0]}_bias" not in attn:
    return None
  return np.concatenate([_np(attn[f"{name}_bias"]) for name in names])


def _self_attention(spec: Any, attn: dict[str, Any], ln: dict[str, Any]) -> None:
  fused = np.concatenate([_np(attn["query"]), _np(attn["key"]), _np(attn["value"])], axis=1)
  _linear(spec.linear[0], fused, _bias(attn, "query", "key", "value"))  # [3D, D]
  _linear(spec.linear[1], attn["out"], _bias(attn, "out"))
  _layer_norm(spec.layer_norm, ln)


def _cross_attention(spec: Any, attn: dict[str, Any], ln: dict[str, Any]) -> None:
  _linear(spec.linear[0], attn["query"], _bias(attn, "query"))
  kv = np.concatenate([_np(attn["key"]), _np(attn["value"])], axis=1)
  _linear(spec.linear[1], kv, _bias(attn, "key", "value"))
  _linear(spec.linear[2], attn["out"], _bias(attn, "out"))
  _layer_norm(spec.layer_norm, ln)


def _ffn(spec: Any, ffn: dict[str, Any], ln: dict[str, Any]) -> None:
  _linear(spec.linear_0, ffn["wi"]["kernel"], ffn["wi"]["bias"])
  _linear(spec.linear_1, ffn["wo"]["kernel"], ffn["wo"]["bias"])
  _layer_norm(spec.layer_norm, ln)


def position_table(cfg: TransformerConfig, params: dict[str, Any], which: str) -> np.ndarray:
  """[max_len, d_model]: what our model adds at positions 0 .. max_len - 1."""
  if cfg.positional == "learned":
    return _np(params[f"{which}_positions"]["pos_embedding"])
  if cfg.positional == "m2m100":
    return _np(layers.m2m100_encoding(np.arange(cfg.max_len), cfg.d_model))
  return _np(layers.sinusoidal_encoding(np.arange(cfg.max_len), cfg.d_model))


def build_spec(cfg: TransformerConfig, params: dict[str, Any], vocabulary: list[str]) -> Any:
  """A validated CTranslate2 `TransformerSpec` holding `params` (float32)."""
  import_ctranslate2()
  from ctranslate2.specs import common_spec, transformer_spec  # pylint: disable=g-import-not-at-top

  check_model(cfg)

  activations = {
    "relu": common_spec.Activation.RELU,
    "swish": common_spec.Activation.SWISH,
    "silu": common_spec.Activation.SWISH,
    "gelu": common_spec.Activation.GELU,
    "gelu_new": common_spec.Activation.GELUTanh,
  }
  spec = transformer_spec.TransformerSpec.from_config(
    (cfg.num_layers, cfg.decoder_depth),
    cfg.num_heads,
    pre_norm=cfg.pre_ln,
    activation=activations[cfg.activation],
  )
  encoder, decoder = spec.encoder, spec.decoder
  embedding = _np(params["embedding"]["embedding"])  # [V, D]
  encoder.embeddings[0].weight = embedding
  encoder.scale_embeddings = True  # x * sqrt(d_model), then + position (model._embed)
  decoder.scale_embeddings = True
  encoder.position_encodings.encodings = position_table(cfg, params, "encoder")
  decoder.position_encodings.encodings = position_table(cfg, params, "decoder")
  if cfg.share_embeddings:
    decoder.embeddings.weight = embedding
    decoder.projection.weight = embedding  # logits = y @ E^T: [V, D] is CTranslate2's layout
  else:
    decoder.embeddings.weight = _np(params["target_embedding"]["embedding"])
    _linear(decoder.projection, params["logits_dense"]["kernel"])
  if cfg.logits_bias:
    decoder.projection.bias = _np(params["logits_bias"])
  if cfg.pre_ln:
    _layer_norm(encoder.layer_norm, params["encoder_norm"])
    _layer_norm(decoder.layer_norm, params["decoder_norm"])

  for i, layer in enumerate(encoder.layer):
    p = params[f"encoder_{i}"]
    _self_attention(layer.self_attention, p["self_attention"], p["attention_block"]["ln"])
    _ffn(layer.ffn, p["ffn"], p["ffn_block"]["ln"])
  for i, layer in enumerate(decoder.layer):
    p = params[f"decoder_{i}"]
    _self_attention(layer.self_attention, p["self_attention"], p["self_attention_block"]["ln"])
    _cross_attention(layer.attention, p["cross_attention"], p["cross_attention_block"]["ln"])
    _ffn(layer.ffn, p["ffn"], p["ffn_block"]["ln"])

  spec.register_source_vocabulary(vocabulary)
  spec.register_target_vocabulary(vocabulary)
  spec.config.layer_norm_epsilon = cfg.layer_norm_epsilon
  spec.config.unk_token = vocabulary[UNK_ID]
  spec.config.eos_token = vocabulary[EOS_ID]
  spec.config.bos_token = vocabulary[PAD_ID]  # we have no BOS; never added (add_source_bos)
  # model.shift_right puts 0 (PAD) first, which the model reads as EOS for decoder_start="eos".
  spec.config.decoder_start_token = vocabulary[EOS_ID if cfg.decoder_start == "eos" else PAD_ID]
  spec.config.add_source_bos = False
  spec.config.add_source_eos = True
  spec.validate()
  return spec


def export_ctranslate2(
  cfg: TransformerConfig,
  params: dict[str, Any],
  tokenizer: Vocabulary,
  output: str,
  quantization: str = "float32",
) -> dict[str, Any]:
  """Writes the CTranslate2 model directory `output` (with our spm.model); returns its figures.

  The directory is assembled beside `output` and renamed into place at the end, so an
  interrupted export leaves no half-written model behind.
  """
  check_output(output, quantization)
  vocabulary = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  spec = build_spec(cfg, params, vocabulary)
  spec.optimize(quantization=quantization)
  with files.staged_folder(output) as staging:
    spec.save(staging)
    if os.path.isdir(tokenizer.model_path):  # an imported model's vocabulary files
      for name in tokenizer_lib.folder_files(tokenizer.model_path):
        path = os.path.join(tokenizer.model_path, name)
        if name.endswith((".spm", ".model")):  # CTranslate2 reads the ids from the spec
          shutil.copyfile(path, os.path.join(staging, name))
    else:
      shutil.copyfile(tokenizer.model_path, os.path.join(staging, "spm.model"))
  size = sum(os.path.getsize(os.path.join(output, f)) for f in os.listdir(output))
  return {
    "format": "ctranslate2",
    "output": output,
    "quantization": quantization,
    "files": sorted(os.listdir(output)),
    "bytes": size,
  }
