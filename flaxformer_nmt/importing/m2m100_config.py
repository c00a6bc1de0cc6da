"""A transformers M2M100 model (M2M100ForConditionalGeneration: facebook/m2m100_418M, 1.2B) read as
our config and parameters: its config.json checked for what this model computes (`check_m2m100`),
turned into our config (`make_config`), and its weights (`read_m2m100`).

What M2M100 is, on our fields (modeling_m2m_100.py of transformers 5.24): pre-LN with a final
norm per stack (`model.pre_ln`), its own sinusoid from position 2 (`model.positional="m2m100"`),
biases on every projection (`model.attention_bias`), torch's layer-norm epsilon 1e-5, ReLU,
scaled and tied embeddings, no logits bias, the decoder started from `</s>`
(`model.decoder_start="eos"`).

Its languages (data.lang_tokens="m2m100", data.languages): `__en__` in front of every source,
`__de__` forced as the first output (decoding/language_tokens.py), both chosen per request
(--source_lang, --target_lang; defaults: tokenizer_config.json's src_lang and tgt_lang). An
NLLB-200 model is the same architecture with NllbTokenizer's files: its tokens are the codes
themselves (`eng_Latn`, data.lang_tag_format="{}"), placed as M2M100's (transformers'
NllbTokenizer with legacy_behaviour=False, its default: `[eng_Latn] pieces </s>`, and
`deu_Latn` forced after the decoder's `</s>` start).
importing/imported_run.py makes it a run.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders, checks
from flaxformer_nmt.config.choices import ACTIVATIONS
from flaxformer_nmt.data import fairseq_vocabulary, pair_vocabulary
from flaxformer_nmt.export import m2m100
from flaxformer_nmt.importing import marian_config
from flaxformer_nmt.importing.model_folder import read_json, state_dict
from flaxformer_nmt.run.components import Components

# What M2M100Config assumes where config.json is silent (configuration_m2m_100.py).
_DEFAULTS = {
  "activation_function": "relu",
  "max_position_embeddings": 1024,
  "dropout": 0.1,
  "attention_dropout": 0.1,
  "activation_dropout": 0.0,
  "scale_embedding": True,
  "tie_word_embeddings": True,
  "pad_token_id": 1,
  "eos_token_id": 2,
  "decoder_start_token_id": 2,
}
_REQUIRED = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim")


def _get(hf: dict[str, Any], key: str) -> Any:
  return hf.get(key, _DEFAULTS.get(key))


def check_m2m100(hf: dict[str, Any], where: str) -> None:
  """ConfigError naming the first option of an M2M100 config.json this model cannot compute."""
  if hf.get("model_type") != "m2m_100":
    raise errors.ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, not 'm2m_100'.")
  missing = [k for k in _REQUIRED if k not in hf]
  if missing:
    raise errors.DataError(f"{where}: has no {missing[0]!r}; not a complete M2M100 config.")

  def refuse(what: str) -> None:
    raise errors.ConfigError(f"{where}: {what}; this model has no such option.")

  heads = (hf.get("encoder_attention_heads", 16), hf.get("decoder_attention_heads", 16))
  if heads[0] != heads[1]:
    refuse("the encoder and decoder have different numbers of attention heads")
  if hf["encoder_ffn_dim"] != hf.get("decoder_ffn_dim", hf["encoder_ffn_dim"]):
    refuse("the encoder and decoder have different feed-forward widths")
  if not _get(hf, "scale_embedding"):
    refuse("scale_embedding is false (unscaled embeddings)")
  if not _get(hf, "tie_word_embeddings"):
    refuse("its output projection is not the embedding (tie_word_embeddings is false)")
  if _get(hf, "activation_function") not in ACTIVATIONS:
    refuse(f"its activation is {hf.get('activation_function')!r}")
  if int(hf["d_model"]) % 2:
    refuse("d_model is odd")
  ids = tuple(_get(hf, k) for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id"))
  if ids != (1, 2, 2):
    raise errors.DataError(
      f"{where}: its pad, eos and decoder start ids are {ids}, not fairseq's (1, 2, 2)."
    )


def make_config(
  folder: str, hf: dict[str, Any], vocabulary: fairseq_vocabulary.FairseqVocabulary
) -> ml_collections.ConfigDict:
  """The run's config: the paper's fields overlaid with the model's."""
  config = builders.base_config("base")
  config.unlock()
  m = config.model
  m.size = "imported"
  m.num_layers = int(hf["encoder_layers"])
  decoder = int(hf["decoder_layers"])
  m.num_decoder_layers = 0 if decoder == m.num_layers else decoder
  m.d_model, m.d_ff = int(hf["d_model"]), int(hf["encoder_ffn_dim"])
  m.num_heads = int(hf.get("encoder_attention_heads", 16))
  m.max_len = int(_get(hf, "max_position_embeddings"))
  m.activation = str(_get(hf, "activation_function"))
  m.pre_ln, m.positional, m.decoder_start = True, "m2m100", "eos"
  m.attention_bias, m.logits_bias = True, False
  m.layer_norm_epsilon = 1e-5  # torch's nn.LayerNorm default, which M2M100 keeps
  m.dropout_rate = float(_get(hf, "dropout"))
  m.attention_dropout_rate = float(_get(hf, "attention_dropout"))
  m.relu_dropout_rate = float(_get(hf, "activation_dropout"))
  d = config.data
  d.source = "none"
  d.lang_tokens, d.lang_tag_format = "m2m100", vocabulary.tag_format  # `__{}__` or NLLB's `{}`
  d.languages = ",".join(vocabulary.languages)
  tok = read_json(os.path.join(folder, "tokenizer_config.json"))
  langs = vocabulary.languages
  english = next((x for x in ("en", "eng_Latn") if x in langs), langs[0])
  d.src_lang = _language(tok.get("src_lang"), langs, english)
  other = next(x for x in ("de", "deu_Latn", "en", *langs) if x in langs and x != d.src_lang)
  d.tgt_lang = _language(tok.get("tgt_lang"), langs, other)
  d.vocab_size = vocabulary.vocab_size
  d.vocab_model_type = pair_vocabulary.model_type(os.path.join(folder, fairseq_vocabulary.SPM))
  d.max_len = min(int(d.max_len), m.max_len)
  gen = read_json(os.path.join(folder, "generation_config.json"))
  if gen.get("num_beams"):
    config.decode.beam_size = int(gen["num_beams"])
  return config


def _language(given: Any, langs: list[str], default: str) -> str:
  """tokenizer_config.json's language (`__en__`, `en`, NLLB's `eng_Latn`), if the model has it,
  else `default`."""
  lang = str(given or "").strip("_")
  return lang if lang in langs else default


def check_tokenizer(folder: str) -> None:
  """ConfigError for a tokenizer this reading has not: M2M100's and NLLB-200's are read
  (data/fairseq_vocabulary.py; NLLB's checkpoints are M2M100's architecture)."""
  where = os.path.join(folder, "tokenizer_config.json")
  tok = read_json(where)
  tokenizer_class = tok.get("tokenizer_class")
  if tokenizer_class and not str(tokenizer_class).startswith(("M2M100", "Nllb")):
    raise errors.ConfigError(
      f"{where}: tokenizer_class {tokenizer_class!r}; --mode=import reads "
      "an M2M100 model with M2M100's or NLLB-200's tokenizer."
    )
  if tok.get("legacy_behaviour") is True:
    raise errors.ConfigError(
      f"{where}: legacy_behaviour is true (NLLB's old layout, the language code after </s>); "
      "--mode=import reads the code-first layout, NllbTokenizer's default."
    )


@dataclasses.dataclass(frozen=True)
class M2M100Model:
  """An M2M100 model folder read and checked."""

  config: ml_collections.ConfigDict  # validated
  vocabulary: fairseq_vocabulary.FairseqVocabulary
  params: Any  # our parameter tree, its shapes checked against the model's
  transformers_config: dict[str, Any]  # config.json as given


def read_m2m100(folder: str) -> M2M100Model:
  """The M2M100 model in `folder` as our config and parameters; every check made first."""
  where = os.path.join(folder, "config.json")
  hf = read_json(where)
  if not hf:
    raise errors.DataError(f"{where}: no such file; --input must be a transformers model folder.")
  check_m2m100(hf, where)
  check_tokenizer(folder)
  vocabulary = fairseq_vocabulary.FairseqVocabulary(folder, int(hf["vocab_size"]))
  if vocabulary.vocab_size != int(hf["vocab_size"]):
    raise errors.DataError(
      f"{folder}: its vocabulary and language tokens hold {vocabulary.vocab_size} ids where "
      f"config.json says vocab_size {hf['vocab_size']}."
    )
  config = make_config(folder, hf, vocabulary)
  checks.validate(config)
  sd = state_dict(folder)
  marian_config.shared_embedding(sd, folder)
  m = config.model
  layers = (m.num_layers, m.num_decoder_layers or m.num_layers)
  try:
    params = m2m100.to_ours(sd, vocabulary.fairseq_ids, *layers)
  except KeyError as e:
    raise errors.DataError(f"{folder}: has no weight {e.args[0]}.") from None
  marian_config.check_shapes(params, Components(config, vocabulary).abstract_params, folder)
  return M2M100Model(config, vocabulary, params, hf)
