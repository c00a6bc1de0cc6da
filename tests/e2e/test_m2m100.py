"""M2M100 read into this model, checked against transformers itself (the `hf` extra; CI's `hf`
leg): a tiny random M2M100 model's teacher-forced scores of 40 pairs equal transformers' within
1e-4 per sentence, its vocabulary gives M2M100Tokenizer's ids and text, and its weights go back
out bitwise; imported as a run (`--mode=import`), its greedy translations with the target
language's token forced equal transformers' generate(forced_bos_token_id=...), and its export
loads in transformers with no missing or unexpected weight. (The torch-free run checks:
tests/e2e/test_m2m100_run.py.)"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from flaxformer_nmt import api
from flaxformer_nmt.decoding import scoring
from flaxformer_nmt.export import m2m100
from flaxformer_nmt.importing import m2m100_config
from flaxformer_nmt.importing.model_folder import state_dict
from flaxformer_nmt.model.tokens import EOS_ID
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig

import m2m100_models
import marian_models

pytestmark = [pytest.mark.hf, pytest.mark.xdist_group("pretrained")]


def _pairs_as_ids(vocab, src_lang: str, tgt_lang: str):
  """40 demo test pairs, and our ids of each side as the model reads them: the language's token,
  the pieces, EOS."""
  pairs = marian_models.demo_pairs("test", 40)
  sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
  first, second = vocab.language_id(src_lang), vocab.language_id(tgt_lang)
  src = [[first, *vocab.encode(s), EOS_ID] for s in sources]
  tgt = [[second, *vocab.encode_target(t), EOS_ID] for t in targets]
  return sources, targets, src, tgt


def _scores_as_transformers(
  cfg, params, folder, sources, targets, src, tgt, src_lang, tgt_lang, name
):
  """Our teacher-forced totals of `src` -> `tgt` within 1e-4 per sentence of transformers' own."""
  mine, _ = scoring.token_log_probs(Transformer(cfg), params, _padded(src), _padded(tgt))
  theirs = m2m100_models.teacher_forced_log_probs(folder, sources, targets, src_lang, tgt_lang)
  diffs = np.abs(np.asarray(mine) - np.asarray(theirs))
  print(f"{name}: largest |difference| {diffs.max():.3g}")
  assert diffs.max() < 1e-4, diffs.max()


def _padded(rows: list[list[int]]) -> np.ndarray:
  width = max(map(len, rows))
  return np.asarray([r + [0] * (width - len(r)) for r in rows], np.int32)


@pytest.mark.parametrize("encoder_layers,decoder_layers", [(2, 1), (1, 3)])
def test_m2m100_scores_as_transformers(tmp_path, encoder_layers, decoder_layers):
  from transformers import M2M100Tokenizer  # pylint: disable=g-import-not-at-top

  folder = tmp_path / "m2m100"
  m2m100_models.tiny_m2m100(folder, encoder_layers=encoder_layers, decoder_layers=decoder_layers)
  model = m2m100_config.read_m2m100(str(folder))
  m = model.config.model
  assert (m.pre_ln, m.positional, m.decoder_start, m.logits_bias) == (True, "m2m100", "eos", False)
  vocab = model.vocabulary
  sources, targets, src, tgt = _pairs_as_ids(vocab, "en", "de")
  # Our ids are M2M100Tokenizer's, renumbered.
  tokenizer = M2M100Tokenizer.from_pretrained(folder, src_lang="en", tgt_lang="de")
  batch = tokenizer(sources[:5], text_target=targets[:5])
  for ours, theirs in zip(src[:5] + tgt[:5], batch["input_ids"] + batch["labels"], strict=True):
    assert [int(vocab.fairseq_ids[i]) for i in ours] == theirs
  # transformers 5.24's decode keeps the language token (`__de__ Wir ...`); a translation does not.
  text = tokenizer.decode(batch["labels"][0][1:], skip_special_tokens=True)
  assert vocab.decode(tgt[0]) == text and text == targets[0]
  cfg = TransformerConfig.from_config(m, vocab.vocab_size)
  scored = (folder, sources, targets, src, tgt, "en", "de")
  _scores_as_transformers(cfg, model.params, *scored, f"M2M100 {encoder_layers}/{decoder_layers}")
  # And back out: every weight transformers saved, bitwise.
  sd = state_dict(str(folder))
  out = m2m100.to_m2m100(
    jax.device_get(model.params), vocab.fairseq_ids, encoder_layers, decoder_layers
  )
  for name, value in out.items():
    np.testing.assert_array_equal(value, sd[name], err_msg=name)
  assert not {k for k in sd if "embed_positions" not in k and k != "lm_head.weight"} - set(out)


def test_an_imported_m2m100_translates_as_transformers_generates(tmp_path):
  """Greedy search with the target language's token forced first, ours through `--mode=import`
  and the API, against transformers' generate(forced_bos_token_id=...), on 40 lines into two
  languages. transformers may output `<pad>` (a random model's zero row can win); fairseq's search,
  and ours, never do, so generate is told so (suppress_tokens). Its ids are read back through our
  vocabulary, so the comparison is of tokens, not of two decoders' spellings."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import (  # pylint: disable=g-import-not-at-top
    M2M100Tokenizer,
  )

  folder = tmp_path / "m2m100"
  model = m2m100_models.tiny_m2m100(folder, encoder_layers=2, decoder_layers=2, seed=1)
  api.import_model(str(folder), str(tmp_path / "run"))
  session = api.load(str(tmp_path / "run"), overrides={"decode.method": "greedy"})
  lines = [s for s, _ in marian_models.demo_pairs("test", 40)]
  for tgt in ("de", "fr"):
    tokenizer = M2M100Tokenizer.from_pretrained(folder, src_lang="en", tgt_lang=tgt)
    _greedy_as_generate(model, tokenizer, session, lines, tgt, tokenizer.get_lang_id(tgt))
  # Exported back: transformers loads every weight, and its tokenizer reads the files.
  again = _exported(tmp_path)
  tokenizer = M2M100Tokenizer.from_pretrained(tmp_path / "hf", src_lang="en", tgt_lang="de")
  batch = tokenizer(lines[:3], return_tensors="pt", padding=True)
  settings = dict(num_beams=1, max_new_tokens=30, suppress_tokens=[1], do_sample=False)
  with torch.no_grad():
    a = model.generate(**batch, forced_bos_token_id=tokenizer.get_lang_id("de"), **settings)
    b = again.generate(**batch, forced_bos_token_id=tokenizer.get_lang_id("de"), **settings)
  assert torch.equal(a, b)


def test_an_nllb_model_scores_tokenizes_and_generates_as_transformers(tmp_path):
  """An NLLB-200-shaped model with transformers' own NllbTokenizer files (tokenizer.json, no
  vocab.json; codes such as eng_Latn): through `--mode=import`, our ids are NllbTokenizer's
  (renumbered) on 40 pairs, teacher-forced scores within 1e-4, and greedy with the target code
  forced equal to generate(forced_bos_token_id=...) on >= 95% of 40 lines into two languages;
  the export's tokenizer reads the same ids and transformers loads every weight."""
  from transformers import (  # pylint: disable=g-import-not-at-top
    NllbTokenizer,
  )

  folder = tmp_path / "nllb"
  model = m2m100_models.tiny_nllb(folder, seed=4)
  api.import_model(str(folder), str(tmp_path / "run"))
  session = api.load(str(tmp_path / "run"), overrides={"decode.method": "greedy"})
  vocab = session.components.tokenizer
  sources, targets, src, tgt = _pairs_as_ids(vocab, "eng_Latn", "deu_Latn")
  tokenizer = NllbTokenizer.from_pretrained(folder, src_lang="eng_Latn", tgt_lang="deu_Latn")
  batch = tokenizer(sources, text_target=targets)
  for ours, theirs in zip(src + tgt, batch["input_ids"] + batch["labels"], strict=True):
    assert [int(vocab.fairseq_ids[i]) for i in ours] == theirs
  cfg = TransformerConfig.from_config(session.config.model, vocab.vocab_size)
  scored = (folder, sources, targets, src, tgt, "eng_Latn", "deu_Latn")
  _scores_as_transformers(cfg, session.params, *scored, "NLLB")
  for code in ("deu_Latn", "fra_Latn"):
    _greedy_as_generate(
      model, tokenizer, session, sources, code, tokenizer.convert_tokens_to_ids(code)
    )
  _exported(tmp_path)
  exported = NllbTokenizer.from_pretrained(tmp_path / "hf", src_lang="eng_Latn")
  assert exported(sources[:5])["input_ids"] == batch["input_ids"][:5]


def _greedy_as_generate(model, tokenizer, session, lines, lang: str, forced: int) -> None:
  """Our greedy translations into `lang` (its token forced first) against transformers'
  generate(forced_bos_token_id=forced) on >= 95% of `lines`. transformers may output `<pad>` (a
  random model's zero row can win); fairseq's search, and ours, never do, so generate is told so
  (suppress_tokens). Its ids are read back through our vocabulary, so the comparison is of
  tokens, not of two decoders' spellings."""
  import torch  # pylint: disable=g-import-not-at-top

  vocab = session.components.tokenizer
  ours_of = np.argsort(vocab.fairseq_ids)  # fairseq id -> ours
  ours = session.translate(lines, target_lang=lang)
  theirs = []
  with torch.no_grad():
    for line in lines:
      batch = tokenizer([line], return_tensors="pt")
      out = model.generate(
        **batch,
        num_beams=1,
        do_sample=False,
        forced_bos_token_id=forced,
        suppress_tokens=[model.config.pad_token_id],
        max_new_tokens=batch["input_ids"].shape[1] + 50,  # our decode.max_len_offset
      )
      assert int(out[0][1]) == forced
      theirs.append(vocab.decode([int(ours_of[int(i)]) for i in out[0][1:]]))
  agree = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(lines)
  print(f"greedy into {lang}: {agree:.1%} of {len(lines)} lines equal to transformers' generate")
  assert agree >= 0.95, [(a, b) for a, b in zip(ours, theirs, strict=True) if a != b][:3]


def _exported(tmp_path):
  """The run at tmp_path/run exported to tmp_path/hf and loaded by transformers, every weight
  found and none left over."""
  from transformers import M2M100ForConditionalGeneration  # pylint: disable=g-import-not-at-top

  api.export(None, str(tmp_path / "run"), str(tmp_path / "hf"), fmt="huggingface")
  again, info = M2M100ForConditionalGeneration.from_pretrained(
    tmp_path / "hf", output_loading_info=True
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  return again
