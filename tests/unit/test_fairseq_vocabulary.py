"""data/fairseq_vocabulary.py on NLLB-200's tokenizer files (tokenizer.json's dictionary, codes
such as eng_Latn as the tokens themselves) beside M2M100's (vocab.json, `__en__`), made by hand
as the Hub's folders hold them (tests/m2m100_models.py); and each malformed folder one line."""

from __future__ import annotations

import json
import shutil

import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.data import fairseq_vocabulary, tokenizer
from flaxformer_nmt.model.tokens import EOS_ID

import m2m100_models

CODES = m2m100_models.NLLB_CODES


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("vocabularies")
  dictionary = m2m100_models.nllb_vocabulary(root / "nllb")
  m2m100_models.m2m100_vocabulary(root / "m2m100")
  return root, dictionary


def test_nllb_ids_are_tokenizer_json_s_and_its_codes_the_tokens(folders):
  root, dictionary = folders
  vocab = fairseq_vocabulary.FairseqVocabulary(str(root / "nllb"), model_vocab_size=216)
  assert (vocab.kind, vocab.tag_format, vocab.languages) == ("nllb", "{}", list(CODES))
  assert vocab.vocab_size == 216  # fairseq's padding rows kept, as the model has them
  for code in CODES:
    ours = vocab.language_id(code)
    assert vocab.id_to_piece(ours) == code == vocab.id_to_piece(vocab.piece_id(code))
    assert int(vocab.fairseq_ids[ours]) == dictionary[code]
  line = "three hundred and forty-two chairs"
  ids = vocab.encode(line)
  assert [int(vocab.fairseq_ids[i]) for i in ids] == [dictionary[vocab.id_to_piece(i)] for i in ids]
  assert all(dictionary[vocab.id_to_piece(i)] >= 4 for i in ids)  # pieces, no special
  mask = vocab.piece_id("<mask>")
  spoken = [vocab.language_id("deu_Latn"), *ids, mask, EOS_ID, *ids]
  assert vocab.decode(spoken) == line  # the code and <mask> are no text; EOS ends it
  assert sorted(vocab.reserved_ids()) == sorted(vocab.language_id(c) for c in CODES)
  assert vocab.language_id("de") is None


def test_each_kind_has_its_files_and_its_own_identity(folders):
  root, _ = folders
  assert fairseq_vocabulary.kind(str(root / "nllb")) == "nllb"
  assert fairseq_vocabulary.kind(str(root / "m2m100")) == "m2m100"
  assert tokenizer.folder_files(str(root / "nllb")) == (
    "sentencepiece.bpe.model",
    "tokenizer.json",
    "tokenizer_config.json",
  )
  assert isinstance(
    tokenizer.open_vocabulary(str(root / "nllb")), fairseq_vocabulary.FairseqVocabulary
  )
  assert not tokenizer.same_vocabulary(str(root / "nllb"), str(root / "m2m100"))  # same spm


@pytest.mark.parametrize(
  "spoil, message",
  [
    ("tokenizer.json", "not an M2M100 or NLLB vocabulary (no sentencepiece.bpe.model+vocab.json"),
    ("vocab", "tokenizer.json: has no BPE vocabulary (model.vocab, pieces to ids)."),
    ("codes", "tokenizer_config.json: lists no language code of"),
    ("pad", "tokenizer.json: '<pad>' is not id 1, as fairseq's are."),
  ],
)
def test_a_malformed_nllb_folder_is_one_line(folders, tmp_path, spoil, message):
  root, _ = folders
  folder = tmp_path / "nllb"
  shutil.copytree(root / "nllb", folder)
  doc = json.loads((folder / "tokenizer.json").read_text())
  if spoil == "tokenizer.json":
    (folder / "tokenizer.json").unlink()
  elif spoil == "vocab":
    doc["model"] = {"type": "Unigram", "vocab": [["a", 0.0]]}
  elif spoil == "codes":
    (folder / "tokenizer_config.json").write_text(json.dumps({"src_lang": "eng_Latn"}))
  else:
    doc["model"]["vocab"]["<pad>"] = 7
    for token in doc["added_tokens"]:
      token["id"] = 7 if token["content"] == "<pad>" else token["id"]
  if spoil in ("vocab", "pad"):
    (folder / "tokenizer.json").write_text(json.dumps(doc))
  with pytest.raises(errors.DataError) as info:
    fairseq_vocabulary.FairseqVocabulary(str(folder))
  assert message in str(info.value) and "\n" not in str(info.value)


def test_the_codes_are_read_from_whichever_list_names_them(folders, tmp_path):
  """transformers 4 lists the codes as additional_special_tokens, 5 as extra_special_tokens; a
  dict under either name (named extra tokens) lists no code."""
  root, _ = folders
  folder = tmp_path / "nllb"
  shutil.copytree(root / "nllb", folder)
  config = {
    "extra_special_tokens": {"image_token": "<x>"},
    "additional_special_tokens": list(CODES),
  }
  (folder / "tokenizer_config.json").write_text(json.dumps(config))
  assert fairseq_vocabulary.FairseqVocabulary(str(folder)).languages == list(CODES)
  (folder / "tokenizer_config.json").write_text(json.dumps({"extra_special_tokens": list(CODES)}))
  assert fairseq_vocabulary.FairseqVocabulary(str(folder)).languages == list(CODES)
