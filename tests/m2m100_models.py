"""Tiny transformers M2M100 models built in the test, laid out as facebook/m2m100_418M's (the `hf`
extra): a random M2M100ForConditionalGeneration of a few layers, saved with `save_pretrained`,
and M2M100Tokenizer's files (a SentencePiece model trained on the demo corpus's two sides,
fairseq's vocab.json, tokenizer_config.json). The model's vocabulary is, as the real one's, the
dictionary, then the 100 language tokens, then fairseq's padding rows (`madeupword`s). Weights are
drawn wider than transformers' init, so that a wrong norm, bias, position or permutation changes
the scores far beyond the 1e-4 the tests allow; the pad row stays zero, as fairseq keeps it."""

from __future__ import annotations

import io
import json
import pathlib
from typing import Any

import sentencepiece as spm

from flaxformer_nmt.data import demo


def layout(vocab_size: int, **sizes: Any) -> Any:
  """Our TransformerConfig of M2M100's layout (pre-LN with final norms, its positions from 2,
  attention biases, the decoder started from `</s>`), tiny unless `sizes` say otherwise."""
  from flaxformer_nmt.model.transformer import TransformerConfig  # pylint: disable=g-import-not-at-top

  shape = {"num_layers": 1, "d_model": 16, "d_ff": 32, "num_heads": 2, **sizes}
  return TransformerConfig(
    vocab_size=vocab_size,
    pre_ln=True,
    positional="m2m100",
    attention_bias=True,
    decoder_start="eos",
    **shape,
  )


def m2m100_vocabulary(folder: pathlib.Path, vocab_size: int = 200) -> dict[str, int]:
  folder.mkdir(parents=True, exist_ok=True)
  pairs = demo.make_demo_split("train", 3000, 0)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter([s for s, _ in pairs] + [t for _, t in pairs]),
    model_writer=model,
    vocab_size=vocab_size,
    model_type="bpe",
    hard_vocab_limit=False,
    minloglevel=2,
  )
  (folder / "sentencepiece.bpe.model").write_bytes(model.getvalue())
  sp = spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.bpe.model"))
  vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
  for i in range(sp.get_piece_size()):
    if not (sp.is_control(i) or sp.is_unknown(i)):
      vocab.setdefault(sp.id_to_piece(i), len(vocab))
  (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
  return vocab


NLLB_CODES = ("eng_Latn", "deu_Latn", "fra_Latn")  # three of NLLB-200's 202 (FLORES-200's codes)


def nllb_vocabulary(folder: pathlib.Path, codes: tuple[str, ...] = NLLB_CODES) -> dict[str, int]:
  """An NLLB-200 tokenizer's files as the Hub's facebook/nllb-200-distilled-600M holds them,
  without transformers: the SentencePiece model, tokenizer.json (fairseq's dictionary as its BPE
  vocabulary, spm id + 1; the specials, the language codes and then `<mask>` as added tokens) and
  tokenizer_config.json (NllbTokenizer, the codes listed). Returns the whole dictionary."""
  vocab = m2m100_vocabulary(folder)
  (folder / "vocab.json").unlink()  # NLLB's folders have none
  added = {p: i for p, i in vocab.items() if i < 4}
  for code in (*codes, "<mask>"):
    added[code] = len(vocab) + len(added) - 4
  tokenizer = {
    "version": "1.0",
    "added_tokens": [{"id": i, "content": p, "special": True} for p, i in added.items()],
    "model": {"type": "BPE", "vocab": vocab, "merges": []},
  }
  (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
  config = {
    "tokenizer_class": "NllbTokenizer",
    "additional_special_tokens": list(codes),
    "src_lang": codes[0],
    "tgt_lang": codes[1],
  }
  (folder / "tokenizer_config.json").write_text(json.dumps(config))
  return {**vocab, **added}


def tiny_m2m100(
  folder: pathlib.Path, *, encoder_layers: int = 2, decoder_layers: int = 1, seed: int = 0
) -> Any:
  """A random M2M100ForConditionalGeneration (float32, eval mode) saved in `folder` with its
  tokenizer (source en, target de)."""
  from transformers import M2M100Tokenizer  # pylint: disable=g-import-not-at-top

  vocab = m2m100_vocabulary(folder)
  tokenizer = M2M100Tokenizer(
    str(folder / "vocab.json"),
    str(folder / "sentencepiece.bpe.model"),
    src_lang="en",
    tgt_lang="de",
  )
  tokenizer.save_pretrained(str(folder))
  return _random_m2m100(folder, len(vocab) + 100, encoder_layers, decoder_layers, seed)


def tiny_nllb(
  folder: pathlib.Path, *, encoder_layers: int = 2, decoder_layers: int = 2, seed: int = 0
) -> Any:
  """A random NLLB-200-shaped model (M2M100ForConditionalGeneration) saved in `folder` with
  transformers' own NllbTokenizer files, made from the SentencePiece model with three of NLLB's
  codes (source eng_Latn, target deu_Latn); the SentencePiece model stays beside them, as in the
  Hub's NLLB folders."""
  from transformers import NllbTokenizer  # pylint: disable=g-import-not-at-top

  m2m100_vocabulary(folder)
  (folder / "vocab.json").unlink()
  tokenizer = NllbTokenizer.from_pretrained(
    str(folder),
    additional_special_tokens=list(NLLB_CODES),
    src_lang=NLLB_CODES[0],
    tgt_lang=NLLB_CODES[1],
  )
  tokenizer.save_pretrained(str(folder))
  return _random_m2m100(folder, len(tokenizer), encoder_layers, decoder_layers, seed)


def _random_m2m100(
  folder: pathlib.Path, size: int, encoder_layers: int, decoder_layers: int, seed: int
) -> Any:
  """A random M2M100ForConditionalGeneration of `size` ids (padded to a multiple of 8, as fairseq
  pads its dictionary), saved in `folder`."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import (  # pylint: disable=g-import-not-at-top
    M2M100Config,
    M2M100ForConditionalGeneration,
  )

  size += -size % 8
  config = M2M100Config(
    vocab_size=size,
    d_model=32,
    encoder_layers=encoder_layers,
    decoder_layers=decoder_layers,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=128,
    dropout=0.0,
    attention_dropout=0.0,
    encoder_layerdrop=0.0,
    decoder_layerdrop=0.0,
    init_std=0.3,
  )
  torch.manual_seed(seed)
  model = M2M100ForConditionalGeneration(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "embed_positions" not in name:
        p.add_(0.2 * torch.randn_like(p))
    model.model.shared.weight[config.pad_token_id].zero_()
  model.eval()
  model.save_pretrained(folder)
  return model


def teacher_forced_log_probs(
  folder: pathlib.Path, sources: list[str], targets: list[str], src: str, tgt: str
) -> list[float]:
  """transformers' own sum of log-probabilities of each target (its language token and EOS
  included), one pair at a time, with the folder's tokenizer (M2M100's or NLLB's)."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import (  # pylint: disable=g-import-not-at-top
    AutoTokenizer,
    M2M100ForConditionalGeneration,
  )

  model = M2M100ForConditionalGeneration.from_pretrained(folder).eval()
  tokenizer = AutoTokenizer.from_pretrained(folder, src_lang=src, tgt_lang=tgt)
  out = []
  with torch.no_grad():
    for s, t in zip(sources, targets, strict=True):
      batch = tokenizer([s], text_target=[t], return_tensors="pt")
      logits = model(**batch).logits  # decoder input: labels shifted right after </s>
      logp = torch.log_softmax(logits.double(), dim=-1)
      labels = batch["labels"]
      out.append(float(logp[0].gather(-1, labels[0][:, None]).sum()))
  return out


def handmade_m2m100(
  folder: pathlib.Path,
  *,
  dummy_pieces: int = 0,
  d_model: int = 16,
  encoder_layers: int = 2,
  decoder_layers: int = 1,
  seed: int = 0,
  nllb: bool = False,
) -> dict[str, Any]:
  """An M2M100 model folder made without torch or transformers (the unit and e2e tiers): the
  vocabulary of `m2m100_vocabulary` (after `dummy_pieces` made-up pieces at fairseq ids 4.., so
  that every real piece's id can lie above 65,535 as in NLLB's 256k vocabulary), config.json and
  tokenizer_config.json as transformers writes them, and random weights of our model written by
  export/m2m100.to_m2m100 (what transformers' save_pretrained names them); with `nllb`, NLLB-200's
  tokenizer files instead (`nllb_vocabulary`). Returns config.json."""
  import jax  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.data import fairseq_vocabulary  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.export import m2m100  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.model.transformer import init_params  # pylint: disable=g-import-not-at-top

  vocab = nllb_vocabulary(folder) if nllb else m2m100_vocabulary(folder)
  if dummy_pieces and not nllb:
    special = {p: i for p, i in vocab.items() if i < 4}
    rest = sorted((i, p) for p, i in vocab.items() if i >= 4)
    vocab = {**special, **{f"dummy{k}": 4 + k for k in range(dummy_pieces)}}
    for _, piece in rest:
      vocab[piece] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
  if not nllb:
    (folder / "tokenizer_config.json").write_text(
      json.dumps({"tokenizer_class": "M2M100Tokenizer", "src_lang": "en", "tgt_lang": "de"})
    )
  size = len(vocab) + (0 if nllb else 100)
  size += -size % 8  # fairseq pads its dictionary to a multiple of 8
  hf = {
    "architectures": ["M2M100ForConditionalGeneration"],
    "model_type": "m2m_100",
    "vocab_size": size,
    "d_model": d_model,
    "encoder_layers": encoder_layers,
    "decoder_layers": decoder_layers,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 2 * d_model,
    "decoder_ffn_dim": 2 * d_model,
    "max_position_embeddings": 128,
    "dropout": 0.0,
    "attention_dropout": 0.0,
  }
  (folder / "config.json").write_text(json.dumps(hf))
  vocabulary = fairseq_vocabulary.FairseqVocabulary(str(folder), size)
  cfg = layout(
    size,
    num_layers=encoder_layers,
    num_decoder_layers=decoder_layers if decoder_layers != encoder_layers else 0,
    d_model=d_model,
    d_ff=2 * d_model,
    layer_norm_epsilon=1e-5,
    max_len=128,
  )
  params = jax.device_get(init_params(cfg, jax.random.PRNGKey(seed)))
  state = m2m100.to_m2m100(params, vocabulary.fairseq_ids, encoder_layers, decoder_layers)
  save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
  return hf
