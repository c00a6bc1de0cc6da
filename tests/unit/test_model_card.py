"""The model card `--mode=export --format=huggingface` writes (export/huggingface.py): issue 62
found it saying that the epsilons may differ when both were 1e-05, carrying absolute local paths
and 17-digit floats, and not saying where the model came from."""

from __future__ import annotations

import json

from flaxformer_nmt.config import builders
from flaxformer_nmt.export import huggingface
from flaxformer_nmt.run.folder import Workdir


def _config(**data):
  config = builders.base_config("tiny")
  for key, value in data.items():
    config.data[key] = value
  return config


def test_the_card_has_no_local_path_no_long_float_and_no_needless_epsilon_line(tmp_path):
  config = _config(dir=str(tmp_path / "corpus"), vocab_path=str(tmp_path / "v" / "spm.model"))
  config.model.layer_norm_epsilon = 1e-5
  config.optim.lr_scale = 0.005 * (128 * 2000) ** 0.5  # 2.5298221281347035
  results = {"eval": {"test_sacrebleu_beam4": 38.561234567890123, "test_sentences": 1000}}
  card = huggingface.model_card(config, "step 600 in my_run", results, "Trained from scratch.")
  assert str(tmp_path) not in card
  assert '"vocab_path": "spm.model"' in card and '"dir": "corpus"' in card
  assert "test_sacrebleu_beam4 38.5612, test_sentences 1000" in card
  assert "2.5298221281347035" not in card and '"lr_scale": 2.52982' in card
  assert "may differ slightly" not in card  # transformers' 1e-5 is the model's own
  assert "Trained from scratch." in card
  config.model.layer_norm_epsilon = 1e-6
  card = huggingface.model_card(config, "step 600", {}, "")
  assert "transformers' layer norms use epsilon 1e-05; this model was trained with 1e-06" in card


def test_the_card_says_where_the_model_came_from(tmp_path):
  imported = Workdir(str(tmp_path / "imported"))
  imported.create()
  imported.write_run_record("", {"kind": "imported", "source": "Helsinki-NLP/opus-mt-en-de"})
  with open(imported.import_record, "w", encoding="utf-8") as f:
    json.dump({"source": "Helsinki-NLP/opus-mt-en-de"}, f)
  config = _config()
  assert huggingface.provenance(imported, config) == (
    "Imported from `Helsinki-NLP/opus-mt-en-de` (transformers' Marian format) with `--mode=import`."
  )
  fine = Workdir(str(tmp_path / "fine"))
  fine.create()
  config.init_from = imported.path
  with open(fine.init_from_record, "w", encoding="utf-8") as f:
    json.dump({"init_from": imported.path, "source_workdir": imported.path}, f)
  assert huggingface.provenance(fine, config) == (
    "Fine-tuned with flaxformer_nmt from the run `imported`, itself imported from "
    "`Helsinki-NLP/opus-mt-en-de`."
  )
  config.init_from = ""
  assert huggingface.provenance(fine, config) == "Trained from scratch with flaxformer_nmt."


def test_a_multilingual_runs_tags_are_exported_as_marian_codes():
  config = _config(directions="en-de,en-fr", src_lang="en", tgt_lang="de")
  assert huggingface.marian_language_codes(config.data) == [">>de<<", ">>fr<<"]
  assert huggingface.marian_language_codes(_config().data) == []

  class Pieces:  # the methods marian_vocab asks of a vocabulary
    pieces = ["<pad>", "</s>", "<unk>", "<2en>", "<2de>", "<2fr>", "\u2581a"]
    vocab_size = len(pieces)

    def id_to_piece(self, i):
      return self.pieces[i]

  vocab = huggingface.marian_vocab(Pieces(), config.data)
  assert [p for p in vocab if p.startswith(">>")] == [">>en<<", ">>de<<", ">>fr<<"]
  assert (vocab["</s>"], vocab["<unk>"], vocab[">>en<<"], vocab["<pad>"]) == (0, 1, 2, 6)
  assert "<2de>" not in vocab
  card = huggingface.model_card(config, "step 1", {}, "")
  assert "`>>de<<`, `>>fr<<`" in card and "batch = tokenizer(['>>de<< A sentence.']" in card
