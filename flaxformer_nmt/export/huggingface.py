"""`--mode=export --format=huggingface`: any run as a transformers Marian model folder.

The folder loads with `MarianMTModel.from_pretrained(DIR)` and `MarianTokenizer.from_pretrained(
DIR)` and goes to the Hub as it is. CTranslate2's transformers converter reads it too, but starts
the decoder from a zero embedding (OPUS-MT's `<pad>` row), which our own runs do not have:
docs/pretrained.md. It holds:

- config.json: a MarianConfig. Our model fields that transformers has no key for (the layer norms'
  epsilon, the dropout generator, ...) and the run's languages are kept under the extra key
  "flaxformer_nmt", which transformers carries along untouched and --mode=import reads back (so
  export then import is exact, tests/e2e/test_pretrained.py).
- generation_config.json: beam search as config.decode says, as close as `generate` allows. What
  differs: transformers divides a hypothesis's log-probability by length^length_penalty where we
  divide by ((5 + length) / 6)^alpha (GNMT's), and its maximum length is one number
  (`max_length`, the model's max_len) where ours is the input's length + decode.max_len_offset.
  `<pad>` is a bad word, as in OPUS-MT's own configs: it is the decoder's start symbol, never an
  output.
- model.safetensors: export/marian.to_marian's state dict (tied embeddings once, as
  `save_pretrained` writes them; zeros for the attention biases and final_logits_bias our paper
  model has not).
- source.spm, target.spm, vocab.json, tokenizer_config.json: MarianTokenizer's files. A run with
  one shared SentencePiece model writes it as both .spm files; vocab.json maps its pieces to the
  Marian ids (`</s>` 0, `<unk>` 1, the others in order, `<pad>` last), a multilingual run's
  language tags spelled as Marian's codes (`>>de<<`, which MarianTokenizer keeps whole). An
  imported run writes its own three files back.
- README.md: a model card: where the model came from (trained, imported, fine-tuned from which
  run), the run's recorded figures (four decimals), how to call it, and its config without local
  paths.

What transformers computes differently: the layer norms' epsilon is 1e-5 in MarianEncoderLayer
(nn.LayerNorm's default; transformers has no config key for it), where our paper runs use 1e-6.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import ml_collections
import numpy as np

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions
from flaxformer_nmt.data import pair_vocabulary
from flaxformer_nmt.data.tokenizer import Vocabulary
from flaxformer_nmt.export import marian
from flaxformer_nmt.export.ctranslate2 import check_output_dir  # the one rule for --output
from flaxformer_nmt.model.transformer import TransformerConfig
from flaxformer_nmt.runtime import files

EXTRA_KEY = "flaxformer_nmt"  # config.json's key for what transformers has no key for
TRANSFORMERS_EPSILON = 1e-5  # MarianEncoderLayer's nn.LayerNorm(embed_dim)
# Our model fields that MarianConfig expresses itself (the rest go under EXTRA_KEY).
_EXPRESSED = ("num_layers", "d_model", "d_ff", "num_heads", "max_len", "num_decoder_layers")


def check_output(output: str, quantization: str, model: ml_collections.ConfigDict) -> None:
  """ConfigError, before any work, for a model Marian cannot express or an output in the way."""
  if quantization != "float32":
    raise errors.ConfigError(
      f"--quantization={quantization}: --format=huggingface writes float32 (quantize when "
      "converting it, e.g. ct2-transformers-converter --quantization)."
    )
  what = None
  if model.pre_ln:
    what = "model.pre_ln=True (Marian is post-LN)"
  elif model.positional != "sinusoidal":
    what = f"model.positional={model.positional!r} (Marian's positions are sinusoidal)"
  elif model.get("decoder_start", "pad") != "pad":
    what = f"model.decoder_start={model.decoder_start!r} (Marian's decoder starts from <pad>)"
  elif not model.share_embeddings:
    what = "model.share_embeddings=False (the export ties one embedding matrix)"
  elif model.d_k and model.d_k != model.d_model // model.num_heads:
    what = f"model.d_k={model.d_k} (Marian's heads are d_model / num_heads wide)"
  if what:
    raise errors.ConfigError(f"--format=huggingface cannot express {what}.")
  check_output_dir(output)


MARIAN_CODE = ">>{}<<"  # how MarianTokenizer spells a language code (remove_language_code)


def marian_language_codes(data: ml_collections.ConfigDict) -> list[str]:
  """A multilingual run's target languages as Marian's codes (`>>de<<`), [] for a bilingual one."""
  if not directions.is_multilingual(data):
    return []
  return [MARIAN_CODE.format(lang) for lang in directions.target_languages(data)]


def marian_vocab(tokenizer: Vocabulary, data: ml_collections.ConfigDict) -> dict[str, int]:
  """vocab.json of a run's vocabulary: piece -> Marian id (an imported run's own; for ours,
  `</s>` 0, `<unk>` 1, the other pieces in our order, `<pad>` last).

  A multilingual run's language tags are written as Marian's codes (`<2en>` as `>>en<<`, the same
  id): MarianTokenizer cuts a leading `>>en<<` off the text as one token, where it would hand
  `<2en>` to SentencePiece, which puts a stray "\u2581" piece before it that training never saw.
  """
  if isinstance(tokenizer, pair_vocabulary.PairVocabulary):
    order = tokenizer.marian_ids
  else:
    v = tokenizer.vocab_size
    order = np.concatenate([[v - 1, 0, 1], np.arange(2, v - 1)])
  renamed = {}
  if directions.is_multilingual(data):
    renamed = {
      directions.lang_tag(lang, data): MARIAN_CODE.format(lang)
      for lang in directions.languages(data)
    }
  pieces = [tokenizer.id_to_piece(j) for j in range(tokenizer.vocab_size)]
  return {renamed.get(p, p): int(order[j]) for j, p in enumerate(pieces)}


def marian_config(
  cfg: TransformerConfig, config: ml_collections.ConfigDict, vocab: dict[str, int]
) -> dict[str, Any]:
  """config.json: a MarianConfig's fields, plus EXTRA_KEY."""
  pad, eos = vocab[pair_vocabulary.PAD], vocab[pair_vocabulary.EOS]
  ours = {k: v for k, v in config.model.to_dict().items() if k not in _EXPRESSED}
  data = config.data
  return {
    "architectures": ["MarianMTModel"],
    "model_type": "marian",
    "vocab_size": cfg.vocab_size,
    "decoder_vocab_size": cfg.vocab_size,
    "d_model": cfg.d_model,
    "encoder_layers": cfg.num_layers,
    "decoder_layers": cfg.decoder_depth,
    "encoder_attention_heads": cfg.num_heads,
    "decoder_attention_heads": cfg.num_heads,
    "encoder_ffn_dim": cfg.d_ff,
    "decoder_ffn_dim": cfg.d_ff,
    "activation_function": cfg.activation,
    "dropout": float(config.model.dropout_rate),
    "attention_dropout": float(config.model.attention_dropout_rate),
    "activation_dropout": float(config.model.relu_dropout_rate),
    "max_position_embeddings": cfg.max_len,
    "scale_embedding": True,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "is_encoder_decoder": True,
    "pad_token_id": pad,
    "eos_token_id": eos,
    "forced_eos_token_id": eos,
    "decoder_start_token_id": pad,
    "dtype": "float32",
    EXTRA_KEY: {
      "model": ours,
      "data": {
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "directions": data.directions,
        # marian_vocab writes the tags as Marian's codes; an import spells them so again.
        "lang_tag_format": MARIAN_CODE
        if directions.is_multilingual(data)
        else data.get("lang_tag_format", "<2{}>"),
      },
    },
  }


def generation_config(config: ml_collections.ConfigDict, vocab: dict[str, int]) -> dict[str, Any]:
  pad, eos = vocab[pair_vocabulary.PAD], vocab[pair_vocabulary.EOS]
  return {
    "num_beams": int(config.decode.beam_size),
    "length_penalty": float(config.decode.alpha),
    "max_length": int(config.model.max_len),
    "early_stopping": True,
    "bad_words_ids": [[pad]],
    "pad_token_id": pad,
    "eos_token_id": eos,
    "forced_eos_token_id": eos,
    "decoder_start_token_id": pad,
  }


def tokenizer_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return {
    "tokenizer_class": "MarianTokenizer",
    "source_lang": config.data.src_lang,
    "target_lang": config.data.tgt_lang,
    "separate_vocabs": False,
    "model_max_length": int(config.model.max_len),
    "eos_token": pair_vocabulary.EOS,
    "unk_token": pair_vocabulary.UNK,
    "pad_token": pair_vocabulary.PAD,
  }


def _figure(value: float) -> float | int:
  """A recorded figure as the card shows it: four decimals at most (38.5612, not 17 digits)."""
  return value if isinstance(value, int) else round(float(value), 4)


def _portable(tree: Any) -> Any:
  """The config as the card shows it: an absolute local path becomes its last part (the card
  goes to the Hub; /home/me/runs/x means nothing there), a float has 6 significant digits."""
  if isinstance(tree, dict):
    return {k: _portable(v) for k, v in tree.items()}
  if isinstance(tree, list):
    return [_portable(v) for v in tree]
  if isinstance(tree, str) and os.path.isabs(tree):
    return os.path.basename(tree.rstrip("/")) or tree
  if isinstance(tree, float):
    return float(f"{tree:.6g}")
  return tree


def provenance(folder: Any, config: ml_collections.ConfigDict) -> str:
  """Where the model came from, in one sentence: trained here, imported (--mode=import: its
  source), or fine-tuned from another run (config.init_from: that run, and its own source if it
  was imported)."""

  def imported_from(run: Any) -> str | None:
    if not run.imported():
      return None
    source = str(read_json_file(run.import_record).get("source") or "a transformers model")
    return os.path.basename(source.rstrip("/")) if os.path.isabs(source) else source

  own = imported_from(folder)
  if own:
    return f"Imported from `{own}` (transformers' Marian format) with `--mode=import`."
  if not config.get("init_from"):
    return "Trained from scratch with flaxformer_nmt."
  record = read_json_file(folder.init_from_record)
  source = record.get("source_workdir") or config.init_from
  line = f"Fine-tuned with flaxformer_nmt from the run `{os.path.basename(source.rstrip('/'))}`"
  from flaxformer_nmt.run.folder import Workdir  # pylint: disable=g-import-not-at-top

  above = imported_from(Workdir(source)) if os.path.isdir(source) else None
  return line + (f", itself imported from `{above}`." if above else " (config.init_from).")


def read_json_file(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      doc = json.load(f)
  except (OSError, ValueError):
    return {}
  return doc if isinstance(doc, dict) else {}


def model_card(
  config: ml_collections.ConfigDict,
  description: str,
  results: dict[str, dict[str, Any]],
  origin: str = "",
) -> str:
  """README.md: what the model is, where it came from, its recorded figures, how to use it, its
  config (no local paths)."""
  d = config.data
  langs = d.directions or f"{d.src_lang}-{d.tgt_lang}"
  lines = [
    "---",
    "library_name: transformers",
    "pipeline_tag: translation",
    "tags: [marian, flaxformer_nmt]",
    "---",
    f"# {langs} Transformer (flaxformer_nmt)",
    "",
    f"Exported by flaxformer_nmt's `--mode=export --format=huggingface` from {description}.",
    "A post-LN Transformer (Vaswani et al., 2017) in transformers' Marian format.",
    *([origin] if origin else []),
    "",
    "## Recorded figures",
    "",
  ]
  shown = False
  for mode, result in results.items():
    figures = {
      k: _figure(v)
      for k, v in result.items()
      if isinstance(v, int | float) and not isinstance(v, bool)
    }
    if figures:
      shown = True
      lines.append(f"- `{mode}_result.json`: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
  if not shown:
    lines.append("None recorded in the run.")
  codes = marian_language_codes(d)
  example = "A sentence."
  usage = ""
  if codes:
    example = f"{codes[0]} A sentence."
    usage = (
      "Multilingual: start each source with its target language's code, one of "
      + ", ".join(f"`{c}`" for c in codes)
      + " (MarianTokenizer keeps a leading `>>xx<<` as one token).\n\n"
    )
  lines += [
    "",
    "## Use",
    "",
    usage + "```python",
    "from transformers import MarianMTModel, MarianTokenizer",
    "tokenizer = MarianTokenizer.from_pretrained(PATH)",
    "model = MarianMTModel.from_pretrained(PATH)",
    f'batch = tokenizer([{example!r}], return_tensors="pt")',
    "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
    "```",
    "",
  ]
  epsilon = float(config.model.layer_norm_epsilon)
  if epsilon != TRANSFORMERS_EPSILON:
    lines += [
      f"transformers' layer norms use epsilon {TRANSFORMERS_EPSILON:g}; this model was trained "
      f"with {epsilon:g}, so its scores there may differ slightly from flaxformer_nmt's.",
      "",
    ]
  lines += [
    "## Config",
    "",
    "```json",
    json.dumps(_portable(config.to_dict()), indent=2, sort_keys=True, default=str),
    "```",
    "",
  ]
  return "\n".join(lines)


def write(session: Any, folder: Any, output: str, quantization: str) -> dict[str, Any]:
  """--mode=export's call (modes.export): the loaded model (decoding/session.Session) of `folder`
  (its recorded train and eval figures go into the model card) to `output`."""
  del quantization  # float32: check_output
  c = session.components
  results = {m: folder.read_result(m) or {} for m in ("train", "eval")}
  params = jax.device_get(session.params)
  # The description names the checkpoint's folder: the card says the run's name, not its path.
  description = session.description
  for path in {os.path.realpath(folder.path), os.path.abspath(folder.path)}:
    description = description.replace(path, os.path.basename(path))
  return export_huggingface(
    c.model_cfg,
    c.config,
    params,
    c.tokenizer,
    output,
    description,
    results,
    provenance(folder, c.config),
  )


def export_huggingface(
  cfg: TransformerConfig,
  config: ml_collections.ConfigDict,
  params: Any,
  tokenizer: Vocabulary,
  output: str,
  description: str,
  results: dict[str, dict[str, Any]],
  origin: str = "",
) -> dict[str, Any]:
  """Writes the folder (into a scratch folder beside `output`, renamed when complete); returns
  the figures of the export."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  vocab = marian_vocab(tokenizer, config.data)
  order = pair_vocabulary.marian_order(vocab)
  state = marian.to_marian(params, order, cfg.num_layers, cfg.decoder_depth)
  with files.staged_folder(output) as staging:
    save_file(state, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
    docs = {
      "config.json": marian_config(cfg, config, vocab),
      "generation_config.json": generation_config(config, vocab),
      "tokenizer_config.json": tokenizer_config(config),
      "vocab.json": vocab,
    }
    for name, doc in docs.items():
      with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    if isinstance(tokenizer, pair_vocabulary.PairVocabulary):
      sources = {n: os.path.join(tokenizer.model_path, n) for n in ("source.spm", "target.spm")}
    else:
      sources = {n: tokenizer.model_path for n in ("source.spm", "target.spm")}
    for name, path in sources.items():
      shutil.copyfile(path, os.path.join(staging, name))
    with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as f:
      f.write(model_card(config, description, results, origin))
  return {
    "format": "huggingface",
    "output": os.path.abspath(output),
    "parameters": int(sum(v.size for v in state.values())),
    "vocab_size": cfg.vocab_size,
  }
