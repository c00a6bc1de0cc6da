"""Tokenizer: fixed special ids, EOS/PAD handling, deterministic training, load-or-train logic."""

from __future__ import annotations

import os
import threading

import ml_collections
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.data import demo
from flaxformer_nmt.data import tokenizer as tok

_PAIRS = demo.make_demo_split("train", 2000, seed=0)
_SENTENCES = [s for pair in _PAIRS for s in pair]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tok.Tokenizer:
  return tok.train_tokenizer(_SENTENCES, str(tmp_path_factory.mktemp("spm") / "spm"), 300)


def _data_config(**overrides) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(
    dict(vocab_path="", vocab_size=300, vocab_model_type="bpe", vocab_sample_size=500)
  )
  c.update(overrides)
  return c


def test_special_ids(tokenizer: tok.Tokenizer) -> None:
  assert (tok.PAD_ID, tok.EOS_ID, tok.UNK_ID) == (0, 1, 2)
  assert tokenizer.id_to_piece(tok.PAD_ID) == "<pad>"
  assert tokenizer.id_to_piece(tok.EOS_ID) == "</s>"
  assert tokenizer.id_to_piece(tok.UNK_ID) == "<unk>"
  assert tokenizer.vocab_size == 300


def test_encode_has_no_eos_and_round_trips(tokenizer: tok.Tokenizer) -> None:
  text = "Ich habe dreihundertfünfundvierzig Äpfel."
  ids = tokenizer.encode(text)
  assert ids and tok.EOS_ID not in ids and tok.PAD_ID not in ids and tok.UNK_ID not in ids
  assert tokenizer.decode(ids) == text


def test_unknown_character_is_unk_not_pad(tokenizer: tok.Tokenizer) -> None:
  ids = tokenizer.encode("☃")
  assert tok.UNK_ID in ids and tok.PAD_ID not in ids


def test_decode_stops_at_eos_and_ignores_pad(tokenizer: tok.Tokenizer) -> None:
  a, b = tokenizer.encode("I have two apples."), tokenizer.encode("the third house")
  assert tokenizer.decode([0] + a[:1] + [0] + a[1:] + [tok.EOS_ID] + b) == "I have two apples."
  assert tokenizer.decode(a + [1, 0, 0]) == "I have two apples."


def test_decode_strips_a_lone_word_boundary(tokenizer: tok.Tokenizer) -> None:
  """A final "\u2581" piece read as a trailing space, which an export's or import's
  MarianTokenizer-style decode strips: the same hypothesis printed two ways (seen in the hf leg)."""
  boundary = tokenizer.piece_id("\u2581")
  assert boundary is not None
  ids = tokenizer.encode("the third house")
  assert tokenizer.decode([*ids, boundary]) == "the third house"
  assert tokenizer.decode([boundary, *ids, boundary, tok.EOS_ID]) == "the third house"


def test_encode_batch_matches_encode(tokenizer: tok.Tokenizer) -> None:
  texts = _SENTENCES[:50]
  assert tokenizer.encode_batch(texts) == [tokenizer.encode(t) for t in texts]


def test_training_is_deterministic_and_small_corpus_clamps(tmp_path) -> None:
  a = tok.train_tokenizer(_SENTENCES, str(tmp_path / "a"), 37_000)  # far more than the data has
  b = tok.train_tokenizer(_SENTENCES, str(tmp_path / "b"), 37_000)
  assert 300 < a.vocab_size < 37_000
  assert a.fingerprint == b.fingerprint


def test_vocab_path_missing_is_one_line(tmp_path) -> None:
  config = _data_config(vocab_path=str(tmp_path / "nope.model"))
  with pytest.raises(errors.DataError, match="config.data.vocab_path=.*nope.model") as e:
    tok.load_or_train_tokenizer(
      config, str(tmp_path / "spm.model"), lambda: iter(_PAIRS), process_index=0
    )
  assert "\n" not in str(e.value)


def test_vocab_path_is_loaded(tokenizer: tok.Tokenizer, tmp_path) -> None:
  config = _data_config(vocab_path=tokenizer.model_path)
  loaded = tok.load_or_train_tokenizer(config, str(tmp_path / "spm.model"), _fail, process_index=0)
  assert loaded.fingerprint == tokenizer.fingerprint
  assert not os.path.exists(tmp_path / "spm.model")


def _fail():
  raise AssertionError("must not read the training data")


def test_trains_once_then_reuses_workdir_model(tmp_path) -> None:
  config = _data_config()
  first = tok.load_or_train_tokenizer(
    config, str(tmp_path / "spm.model"), lambda: iter(_PAIRS), process_index=0
  )
  assert first.model_path == str(tmp_path / "spm.model") and os.path.isfile(first.model_path)
  again = tok.load_or_train_tokenizer(config, str(tmp_path / "spm.model"), _fail, process_index=0)
  assert again.fingerprint == first.fingerprint


def test_sample_is_seeded_and_bounded() -> None:
  a = tok.sample_sentences(iter(_PAIRS), 100, seed=0)
  assert a == tok.sample_sentences(iter(_PAIRS), 100, seed=0)
  assert a != tok.sample_sentences(iter(_PAIRS), 100, seed=1)
  assert len(a) == 200  # both sides of 100 pairs


def test_other_processes_wait_for_process_zero(
  tokenizer: tok.Tokenizer, tmp_path, monkeypatch
) -> None:
  monkeypatch.setattr(tok, "_WAIT_POLL_S", 0.01)
  config = _data_config()
  result = []
  waiter = threading.Thread(
    target=lambda: result.append(
      tok.load_or_train_tokenizer(config, str(tmp_path / "spm.model"), _fail, process_index=1)
    )
  )
  waiter.start()
  waiter.join(0.2)
  assert waiter.is_alive()  # nothing to load yet: process 1 must not train
  with open(tokenizer.model_path, "rb") as src, open(tmp_path / "tmp.model", "wb") as dst:
    dst.write(src.read())
  os.replace(tmp_path / "tmp.model", tmp_path / "spm.model")  # atomic, as train_tokenizer writes
  waiter.join(10)
  assert result and result[0].fingerprint == tokenizer.fingerprint
