"""`--mode=export --format=huggingface` of a many-to-many run (an imported M2M100, or a run
fine-tuned from one): a transformers M2M100 model folder.

The folder loads with `M2M100ForConditionalGeneration.from_pretrained(DIR)` and
`M2M100Tokenizer.from_pretrained(DIR, src_lang=..., tgt_lang=...)`, and `--mode=import` reads it
back bitwise (tests/e2e/test_m2m100.py). It holds:
- config.json: an M2M100Config of the run's model (what importing/m2m100_config.py reads);
- generation_config.json: config.decode's beam, fairseq's ids, and `<pad>` as a bad word (our
  searches never output it, as fairseq's do not); the target language is chosen per call with
  `forced_bos_token_id` (transformers has no per-model default for it);
- model.safetensors: export/m2m100.to_m2m100's state dict;
- sentencepiece.bpe.model, vocab.json, tokenizer_config.json: the run's own vocabulary files, as
  imported (data/fairseq_vocabulary.py);
- README.md: the model card (export/huggingface.model_card).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.data import fairseq_vocabulary
from flaxformer_nmt.export import huggingface, m2m100
from flaxformer_nmt.runtime import files

_IDS = {"bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}


def is_m2m100(config: ml_collections.ConfigDict) -> bool:
  """Whether the run's model is M2M100's (its language tokens say so: data.lang_tokens)."""
  return str(config.data.get("lang_tokens", "")) == "m2m100"


def check_output(output: str, quantization: str, model: ml_collections.ConfigDict) -> None:
  """ConfigError, before any work, for a model M2M100's format cannot hold or an output in the
  way (a many-to-many run keeps the imported architecture, so only a changed one is refused)."""
  if quantization != "float32":
    raise errors.ConfigError(
      f"--quantization={quantization}: --format=huggingface writes float32 (quantize when "
      "converting it, e.g. ct2-transformers-converter --quantization)."
    )
  wanted = {
    "pre_ln": True,
    "positional": "m2m100",
    "decoder_start": "eos",
    "attention_bias": True,
    "logits_bias": False,
    "share_embeddings": True,
  }
  for field, value in wanted.items():
    if model.get(field) != value:
      raise errors.ConfigError(
        f"--format=huggingface cannot express model.{field}={model.get(field)!r} as M2M100 "
        f"(which has {value!r})."
      )
  huggingface.check_output_dir(output)


def m2m100_config(config: ml_collections.ConfigDict, vocab_size: int) -> dict[str, Any]:
  """config.json: the M2M100Config of the run's model."""
  m = config.model
  decoder_layers = int(m.num_decoder_layers or m.num_layers)
  return {
    "architectures": ["M2M100ForConditionalGeneration"],
    "model_type": "m2m_100",
    "vocab_size": vocab_size,
    "d_model": int(m.d_model),
    "encoder_layers": int(m.num_layers),
    "decoder_layers": decoder_layers,
    "encoder_attention_heads": int(m.num_heads),
    "decoder_attention_heads": int(m.num_heads),
    "encoder_ffn_dim": int(m.d_ff),
    "decoder_ffn_dim": int(m.d_ff),
    "activation_function": str(m.activation),
    "dropout": float(m.dropout_rate),
    "attention_dropout": float(m.attention_dropout_rate),
    "activation_dropout": float(m.relu_dropout_rate),
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "max_position_embeddings": int(m.max_len),
    "scale_embedding": True,
    "tie_word_embeddings": True,
    "is_encoder_decoder": True,
    **_IDS,
    "dtype": "float32",
  }


def generation_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return {
    "num_beams": int(config.decode.beam_size),
    "max_length": int(config.model.max_len),
    "early_stopping": True,
    "bad_words_ids": [[_IDS["pad_token_id"]]],
    **_IDS,
  }


def model_card(
  config: ml_collections.ConfigDict,
  description: str,
  origin: str,
  tokenizer_class: str = "M2M100Tokenizer",
) -> str:
  """README.md: what the model is, where it came from, how to call it (with M2M100's or NLLB's
  tokenizer: the forced token is the target language's tag, `__de__` or `deu_Latn`)."""
  d = config.data
  tag = str(d.lang_tag_format or "__{}__").format(d.tgt_lang)
  return "\n".join(
    [
      "---",
      "library_name: transformers",
      "pipeline_tag: translation",
      "tags: [m2m_100, flaxformer_nmt]",
      "---",
      "# Many-to-many Transformer (flaxformer_nmt, M2M100 format)",
      "",
      f"Exported by flaxformer_nmt's `--mode=export --format=huggingface` from {description}.",
      *([origin] if origin else []),
      "",
      f"Languages ({len(d.languages.split(','))}): {d.languages.replace(',', ', ')}.",
      "",
      "```python",
      f"from transformers import M2M100ForConditionalGeneration, {tokenizer_class}",
      f'tokenizer = {tokenizer_class}.from_pretrained(PATH, src_lang="{d.src_lang}")',
      "model = M2M100ForConditionalGeneration.from_pretrained(PATH)",
      'batch = tokenizer(["A sentence."], return_tensors="pt")',
      f'forced = tokenizer.convert_tokens_to_ids("{tag}")',
      "out = model.generate(**batch, forced_bos_token_id=forced)",
      "print(tokenizer.batch_decode(out, skip_special_tokens=True))",
      "```",
      "",
    ]
  )


def write(session: Any, folder: Any, output: str, quantization: str) -> dict[str, Any]:
  """--mode=export's call for a many-to-many run: its loaded model (decoding/session.Session) to
  `output`, written whole or not at all."""
  del quantization  # float32: check_output
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  c = session.components
  vocabulary = c.tokenizer
  if not isinstance(vocabulary, fairseq_vocabulary.FairseqVocabulary):
    raise errors.DataError(f"{vocabulary.model_path}: not an M2M100 vocabulary folder.")
  m = c.config.model
  layers = (int(m.num_layers), int(m.num_decoder_layers or m.num_layers))
  state = m2m100.to_m2m100(jax.device_get(session.params), vocabulary.fairseq_ids, *layers)
  description = session.description
  for path in {os.path.realpath(folder.path), os.path.abspath(folder.path)}:
    description = description.replace(path, os.path.basename(path))
  origin = huggingface.provenance(folder, c.config).replace("Marian format", "M2M100 format")
  with files.staged_folder(output) as staging:
    save_file(state, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
    docs = {
      "config.json": m2m100_config(c.config, vocabulary.vocab_size),
      "generation_config.json": generation_config(c.config),
    }
    for name, doc in docs.items():
      with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for name in fairseq_vocabulary.folder_files(vocabulary.model_path)[:2]:
      shutil.copyfile(os.path.join(vocabulary.model_path, name), os.path.join(staging, name))
    # The import's tokenizer_config.json, its default languages the run's own (a fine-tune may
    # have changed them).
    tok = files.read_json_object(os.path.join(vocabulary.model_path, "tokenizer_config.json"))
    default_class = "NllbTokenizer" if vocabulary.kind == "nllb" else "M2M100Tokenizer"
    tok = {"tokenizer_class": default_class, **tok}
    tok.update(src_lang=str(c.config.data.src_lang), tgt_lang=str(c.config.data.tgt_lang))
    with open(os.path.join(staging, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump(tok, f, indent=2)
      f.write("\n")
    with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as f:
      f.write(model_card(c.config, description, origin, tok["tokenizer_class"]))
  return {
    "format": "huggingface",
    "output": os.path.abspath(output),
    "parameters": int(sum(v.size for v in state.values())),
    "vocab_size": vocabulary.vocab_size,
  }
