"""A transformers Marian model (OPUS-MT) read as one of our runs: its config.json checked for what
this model computes (`check_marian`), turned into our config (`make_config`, export/marian.py
says how each Marian option maps), its languages, and its weights (`read_marian`).

Anything Marian allows that this model has not (unequal head counts or FFN widths, separate
vocabularies, unscaled embeddings) is one line, before anything is written.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import jax
import ml_collections
import numpy as np

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders, checks
from flaxformer_nmt.config import directions as directions_lib
from flaxformer_nmt.config.choices import ACTIVATIONS
from flaxformer_nmt.data import pair_vocabulary
from flaxformer_nmt.export import huggingface, marian
from flaxformer_nmt.importing.model_folder import read_json, state_dict
from flaxformer_nmt.run.components import Components

# What a Marian config.json must say, and what MarianConfig assumes where it is silent
# (configuration_marian.py).
_REQUIRED = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim")
_DEFAULTS = {
  "activation_function": "gelu",
  "max_position_embeddings": 1024,
  "dropout": 0.1,
  "encoder_attention_heads": 16,
  "decoder_attention_heads": 16,
  "decoder_ffn_dim": 4096,
}


def _get(hf: dict[str, Any], key: str) -> Any:
  return hf.get(key, _DEFAULTS.get(key))


# OPUS-MT names: opus-mt-en-de, opus-mt-tc-big-en-de, and the group models' opus-mt-gem-gem,
# opus-mt-ROMANCE-en, opus-mt-de+nl+fy-en. Each part is a language code, a "+"-joined list of
# them, or an upper-case group; anything else (opus-mt-en-medical) is not read as languages.
_PART = r"([a-z]{2,3}(?:\+[a-z]{2,3})*|[A-Z]{2,})"
_OPUS_NAME = re.compile(rf"opus-mt-(?:tc-[a-z]+-)?{_PART}-{_PART}$")
# What transformers' convert_marian_to_pytorch.py puts before a source language in
# tokenizer_config.json ("-".join of the folder name's parts but the last: "opus-mt-en").
_OPUS_PREFIX = re.compile(r"^opus-mt-(?:tc-[a-z]+-)?")
MANY = "mul"  # ISO 639-2's "multiple languages": a group model's source (ROMANCE, de+nl+fy)


def check_marian(hf: dict[str, Any], where: str) -> None:
  """ConfigError naming the first option of a Marian config.json this model cannot compute."""
  if "model_type" not in hf and {"model", "data", "decode"} <= set(hf):
    folder = os.path.dirname(where)
    raise errors.ConfigError(
      f"--input={folder} is a flaxformer_nmt run, not a transformers model: fine-tune it with "
      f"--config.init_from={folder}, or translate with --workdir={folder}."
    )
  if hf.get("model_type") != "marian":
    raise errors.ConfigError(
      f"{where}: model_type is {hf.get('model_type')!r}; --mode=import reads Marian and M2M100 "
      "models."
    )

  missing = [k for k in _REQUIRED if k not in hf]
  if missing:
    raise errors.DataError(f"{where}: has no {missing[0]!r}; not a complete Marian config.")

  def refuse(what: str) -> None:
    raise errors.ConfigError(f"{where}: {what}; this model has no such option.")

  if _get(hf, "encoder_attention_heads") != _get(hf, "decoder_attention_heads"):
    refuse("the encoder and decoder have different numbers of attention heads")
  if _get(hf, "encoder_ffn_dim") != _get(hf, "decoder_ffn_dim"):
    refuse("the encoder and decoder have different feed-forward widths")
  decoder_vocab = hf.get("decoder_vocab_size") or hf["vocab_size"]  # null: the same
  if not hf.get("share_encoder_decoder_embeddings", True) or decoder_vocab != hf["vocab_size"]:
    refuse("the source and target have separate vocabularies")
  if not hf.get("scale_embedding", False):
    refuse("scale_embedding is false (unscaled embeddings)")
  if hf.get("normalize_before") or hf.get("add_final_layer_norm"):
    refuse("its layer norms come before the sub-layers")
  if hf.get("static_position_embeddings") is False:
    refuse("its positions are learned")
  if _get(hf, "activation_function") not in ACTIVATIONS:
    refuse(f"its activation is {hf.get('activation_function')!r}")
  if int(hf.get("d_model", 0)) % 2:
    refuse("d_model is odd")


@dataclasses.dataclass(frozen=True)
class Languages:
  src: str
  tgt: str
  said: str  # where the target language was read, as given: for a message


def languages(folder: str, source: str, hf: dict[str, Any]) -> Languages:
  """The source and target languages: tokenizer_config.json's, else an OPUS-MT name's
  (opus-mt-en-de), else "src" and "tgt". A group (ROMANCE, de+nl+fy; a multi-source model) or
  anything else that is not one language code reads as MANY; the convert script's "opus-mt-"
  before the source language is dropped."""
  extra = hf.get(huggingface.EXTRA_KEY, {}).get("data", {})
  tok = read_json(os.path.join(folder, "tokenizer_config.json"))
  src = extra.get("src_lang") or tok.get("source_lang")
  tgt = extra.get("tgt_lang") or tok.get("target_lang")
  said = f"tokenizer_config.json's target_lang {tgt!r}" if tgt else "nothing"
  if not (src and tgt):
    name = source.rstrip("/").split("/")[-1]
    match = _OPUS_NAME.search(name)
    if match:
      said = said if tgt else f"the name {name!r}"
      src, tgt = src or match.group(1), tgt or match.group(2)

  def language(name: Any, unknown: str) -> str:
    if not name:
      return unknown
    name = _OPUS_PREFIX.sub("", str(name).strip())
    return name if directions_lib.is_language(name) else MANY

  return Languages(language(src, "src"), language(tgt, "tgt"), said)


def _target_codes(
  d: ml_collections.ConfigDict, vocab: dict[str, int], where: str, said: str
) -> None:
  """A multi-target model's `>>xx<<` codes as its directions (from its one source, which may be
  a group), `data.tgt_lang` one of them; ConfigError naming what the target language was read
  from when which language the model writes cannot be told."""
  code = pair_vocabulary.LANGUAGE_CODE
  codes = [p[2:-2] for p in sorted(vocab, key=vocab.get) if code.fullmatch(p)]
  valid = [c for c in codes if directions_lib.is_language(c) and c != d.src_lang]
  if valid:
    d.directions = ",".join(f"{d.src_lang}-{c}" for c in valid)
    d.lang_tag_format = ">>{}<<"
    if d.tgt_lang not in valid:
      d.tgt_lang = valid[0]
  elif d.tgt_lang in (d.src_lang, MANY):
    what = "a group" if d.tgt_lang == MANY else f"its source's ({d.src_lang!r})"
    raise errors.ConfigError(
      f"{where}: which language this model writes cannot be told: its target language, from "
      f"{said}, is {what}, and vocab.json has no >>xx<< target-language codes."
    )


def make_config(
  folder: str, source: str, hf: dict[str, Any], vocab: dict[str, int]
) -> ml_collections.ConfigDict:
  """The run's config: the paper's fields overlaid with the model's."""
  config = builders.base_config("base")
  config.unlock()
  extra = hf.get(huggingface.EXTRA_KEY, {})
  m = config.model
  m.size = "imported"
  m.num_layers = int(hf["encoder_layers"])
  decoder = int(hf["decoder_layers"])
  m.num_decoder_layers = 0 if decoder == m.num_layers else decoder
  m.d_model, m.d_ff = int(hf["d_model"]), int(hf["encoder_ffn_dim"])
  m.num_heads = int(_get(hf, "encoder_attention_heads"))
  m.max_len = int(_get(hf, "max_position_embeddings"))
  m.activation = str(_get(hf, "activation_function"))
  m.attention_bias, m.logits_bias = True, True
  m.layer_norm_epsilon = huggingface.TRANSFORMERS_EPSILON
  m.dropout_rate = float(_get(hf, "dropout"))
  m.attention_dropout_rate = float(hf.get("attention_dropout", 0.0))
  m.relu_dropout_rate = float(hf.get("activation_dropout", 0.0))
  # A run of ours exported and imported again gets its own fields back (the biases stay: they
  # are zeros, and the checkpoint holds them).
  for key, value in extra.get("model", {}).items():
    if key in m and key not in ("attention_bias", "logits_bias", "size"):
      m[key] = type(m[key])(value) if m[key] is not None else value
  d = config.data
  d.source = "none"
  langs = languages(folder, source, hf)
  d.src_lang, d.tgt_lang = langs.src, langs.tgt
  d.vocab_size = len(vocab)
  spm_file = os.path.join(folder, "target.spm")
  if os.path.isfile(spm_file):  # PairVocabulary has read it: a SentencePiece model
    d.vocab_model_type = pair_vocabulary.model_type(spm_file)
  d.max_len = min(int(d.max_len), m.max_len)
  data_extra = extra.get("data", {})
  if data_extra.get("directions"):
    d.directions = data_extra["directions"]
    d.lang_tag_format = data_extra.get("lang_tag_format", "<2{}>")
  else:
    _target_codes(d, vocab, folder, langs.said)
  gen = read_json(os.path.join(folder, "generation_config.json"))
  if gen.get("num_beams"):
    config.decode.beam_size = int(gen["num_beams"])
  return config


def shared_embedding(sd: dict[str, np.ndarray], where: str) -> None:
  """Older checkpoints name the tied table by its users; one name is kept (model.shared). BART's
  layout, so M2M100's reading calls it too."""
  names = ("model.shared.weight", "model.encoder.embed_tokens.weight", "lm_head.weight")
  found = [sd[n] for n in names if n in sd]
  if not found:
    raise errors.DataError(f"{where}: has no embedding table (model.shared.weight).")
  decoder = sd.get("model.decoder.embed_tokens.weight")
  if decoder is not None and not np.array_equal(decoder, found[0]):
    raise errors.ConfigError(
      f"{where}: its decoder has its own embedding table; this model ties one for both."
    )
  sd["model.shared.weight"] = found[0]


def check_shapes(params: Any, template: Any, where: str) -> None:
  """CheckpointMismatchError naming the first weight whose shape is not the model's (M2M100's
  reading shares it)."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  got = {jax.tree_util.keystr(k): np.shape(v) for k, v in leaves}
  want = {
    jax.tree_util.keystr(k): tuple(v.shape)
    for k, v in jax.tree_util.tree_leaves_with_path(template)
  }
  for name in sorted(set(got) | set(want)):
    if got.get(name) != want.get(name):
      raise errors.CheckpointMismatchError(
        f"{where}: the weight {name} is {got.get(name)} where the model needs {want.get(name)}."
      )


@dataclasses.dataclass(frozen=True)
class MarianModel:
  """A Marian model folder read and checked, ready to be written as a run."""

  config: ml_collections.ConfigDict  # validated
  vocabulary: pair_vocabulary.PairVocabulary
  params: Any  # our parameter tree, its shapes checked against the model's
  transformers_config: dict[str, Any]  # config.json as given

  @property
  def layers(self) -> tuple[int, int]:
    m = self.config.model
    return m.num_layers, m.num_decoder_layers or m.num_layers


def read_marian(folder: str, source: str) -> MarianModel:
  """The Marian model in `folder` (`source`: the --input it came from, for its languages) as our
  config and parameters; every check made before the caller writes anything."""
  where = os.path.join(folder, "config.json")
  hf = read_json(where)
  if not hf:
    raise errors.DataError(f"{where}: no such file; --input must be a transformers model folder.")
  check_marian(hf, where)
  vocabulary = pair_vocabulary.PairVocabulary(folder)
  vocab = pair_vocabulary.read_vocab_json(os.path.join(folder, "vocab.json"))
  if len(vocab) != int(hf["vocab_size"]):
    raise errors.DataError(
      f"{folder}/vocab.json: holds {len(vocab)} pieces where config.json says vocab_size "
      f"{hf['vocab_size']}."
    )
  pad, eos = vocab[pair_vocabulary.PAD], vocab[pair_vocabulary.EOS]
  if (hf.get("pad_token_id"), hf.get("eos_token_id"), hf.get("decoder_start_token_id", pad)) != (
    pad,
    eos,
    pad,
  ):
    raise errors.DataError(
      f"{where}: its pad, eos and decoder start ids are not vocab.json's <pad>, </s> and <pad>."
    )
  config = make_config(folder, source, hf, vocab)
  checks.validate(config)
  sd = state_dict(folder)
  shared_embedding(sd, folder)
  m = config.model
  layers = (m.num_layers, m.num_decoder_layers or m.num_layers)
  try:
    params = marian.to_ours(sd, vocabulary.marian_ids, *layers)
  except KeyError as e:
    raise errors.DataError(f"{folder}: has no weight {e.args[0]}.") from None
  check_shapes(params, Components(config, vocabulary).abstract_params, folder)
  return MarianModel(config, vocabulary, params, hf)


def parameter_count(params: Any) -> int:
  return int(sum(np.size(v) for v in jax.tree.leaves(params)))
