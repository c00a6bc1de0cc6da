"""Many directions in one model, in this process: parsing, temperature sampling (deterministic,
see test_multilingual_sampling.py), corpora found by fairseq's names, tags in the
vocabulary and in front of every source, per-direction data and figures, and the one-line errors
(config, command line, server). tests/e2e/test_multilingual.py trains and decodes such a model.
"""

from __future__ import annotations

import pathlib
import types

import jax
import ml_collections
import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders, checks, directions, run_config
from flaxformer_nmt.data import direction_mix, multilingual, pipeline, sources
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.decoding import evaluation, language_id
from flaxformer_nmt.decoding import translator as translate
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.serving import protocol

import helpers

_WORDS = {
  "en": ["a", "dog", "runs", "two", "men", "talk", "the", "red", "car", "is", "fast", "small"],
  "de": [
    "ein",
    "hund",
    "rennt",
    "zwei",
    "männer",
    "reden",
    "das",
    "rote",
    "auto",
    "ist",
    "schnell",
  ],
  "fr": ["un", "chien", "court", "deux", "hommes", "parlent", "la", "voiture", "rouge", "est"],
}


def _sentences(lang: str, n: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  words = _WORDS[lang]
  return [" ".join(rng.choice(words, size=int(rng.integers(2, 7)))) for _ in range(n)]


def _write(path: pathlib.Path, lines: list[str]) -> None:
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _multiway(folder: pathlib.Path, sizes: dict[str, int] | None = None) -> pathlib.Path:
  """Multi-way files <prefix>.<lang> for en, de, fr: train 120, val 10, test 12 lines."""
  sizes = sizes or {"train": 120, "val": 10, "test": 12}
  folder.mkdir(parents=True, exist_ok=True)
  for s, (split, n) in enumerate(sizes.items()):
    for i, lang in enumerate(_WORDS):
      _write(folder / f"{split}.{lang}", _sentences(lang, n, seed=10 * s + i))
  return folder


def _config(folder: pathlib.Path, **data: object) -> ml_collections.ConfigDict:
  c = builders.base_config("tiny")
  c.data.source = "files"
  c.data.dir = str(folder)
  c.data.directions = "en-de,de-en,en-fr"
  c.data.vocab_size = 120
  c.data.max_len = 16
  c.data.tokens_per_batch = 16 * 8
  c.data.update(data)
  return c


# ------------------------------------------------------------------------- parsing and checks


def test_directions_and_corpora_parse_or_fail_in_one_line():
  got = directions.parse_directions(" en-de, de-en ,fr-en")
  assert [d.name for d in got] == ["en-de", "de-en", "fr-en"]
  for bad in ("en", "en-en", "en-de,en-de", "EN-de", "en_de"):
    with pytest.raises(errors.ConfigError) as e:
      directions.parse_directions(bad)
    assert "\n" not in str(e.value) and "data.directions" in str(e.value)
  corpora = directions.parse_corpora("train, bt:0.5:<BT>, extra:2", "train")
  assert corpora == [
    directions.Corpus("train"),
    directions.Corpus("bt", 0.5, "<BT>"),
    directions.Corpus("extra", 2.0),
  ]
  assert directions.parse_corpora("", "main") == [directions.Corpus("main")]
  for bad in ("bt:0", "bt:x", "bt:1:BT", "bt:1:<2de>", "a,a", "bt:1:<BT>:more", "bt:1:<pad>"):
    with pytest.raises(errors.ConfigError) as e:
      directions.parse_corpora(bad, "train")
    assert "\n" not in str(e.value) and "data.corpora" in str(e.value)


def test_config_checks_of_directions(tmp_path):
  c = _config(tmp_path, zero_shot="de-fr")
  checks.validate(c)
  assert directions.languages(c.data) == ["en", "de", "fr"]
  assert directions.user_symbols(c.data) == ["<2en>", "<2de>", "<2fr>"]
  for data, culprit in (
    (dict(source="demo"), "data.source"),
    (dict(zero_shot="en-de"), "trains"),
    (dict(zero_shot="de-cs"), "none into 'cs'"),
    (dict(zero_shot="fr-de"), "from 'fr'"),  # fr is only ever a target
    (dict(temperature=0.0), "temperature"),
    (dict(directions="", zero_shot="de-fr"), "data.zero_shot"),
  ):
    bad = _config(tmp_path, **data)
    with pytest.raises(errors.ConfigError) as e:
      checks.validate(bad)
    assert culprit in str(e.value) and "\n" not in str(e.value)


def test_target_language_resolution():
  bilingual = builders.base_config("tiny").data
  assert directions.resolve_target(bilingual, None) is None
  assert directions.resolve_target(bilingual, "de") is None  # its own: no tag
  with pytest.raises(errors.ConfigError, match="translates en-de only"):
    directions.resolve_target(bilingual, "fr")
  multi = ml_collections.ConfigDict({"directions": "en-de,en-fr", "zero_shot": ""})
  assert directions.resolve_target(multi, "fr") == "fr"
  with pytest.raises(errors.ConfigError, match="translates into de, fr"):
    directions.resolve_target(multi, "en")  # only ever a source: its tag is not trained
  with pytest.raises(errors.ConfigError, match="give --target_lang"):
    directions.resolve_target(multi, None)
  with pytest.raises(errors.ConfigError, match="unknown language"):
    directions.resolve_target(multi, "xx")
  one_target = ml_collections.ConfigDict({"directions": "de-en,fr-en", "zero_shot": ""})
  assert directions.resolve_target(one_target, None) == "en"  # the one it translates into


def test_a_decoding_command_may_narrow_the_directions_and_nothing_else(tmp_path):
  saved = _config(tmp_path)
  narrowed = _config(tmp_path, directions="en-fr")
  got = run_config.reconcile(narrowed, saved, "eval", "config.json")
  assert got.data.directions == "en-fr"
  for mode, value in (("train", "en-fr"), ("eval", "en-fr,fr-en"), ("translate", "")):
    with pytest.raises(errors.ConfigError, match="data.directions"):
      run_config.reconcile(_config(tmp_path, directions=value), saved, mode, "config.json")


# --------------------------------------------------------------------- files and vocabulary


def test_fairseq_names_the_reverse_pair_and_missing_corpora(tmp_path):
  _write(tmp_path / "train.en-de.en", ["a dog", "two men"])
  _write(tmp_path / "train.en-de.de", ["ein hund", "zwei männer"])
  (tmp_path / "bt.en-de.tsv").write_text("a car\tein auto\n", encoding="utf-8")
  c = _config(tmp_path, directions="en-de,de-en", corpora="train,bt:0.5:<BT>")
  found = {(t.direction.name, t.corpus.prefix): t for t in multilingual.train_corpora(c.data)}
  assert sorted(found) == [("de-en", "bt"), ("de-en", "train"), ("en-de", "bt"), ("en-de", "train")]
  assert list(found["de-en", "train"].source.iter_pairs("train")) == [
    ("ein hund", "a dog"),
    ("zwei männer", "two men"),
  ]
  # A TSV named en-de holds (en, de): read as (de, en) for de-en, and the other way for en-de.
  assert list(found["en-de", "bt"].source.iter_pairs("train")) == [("a car", "ein auto")]
  assert list(found["de-en", "bt"].source.iter_pairs("train")) == [("ein auto", "a car")]
  a = found["en-de", "bt"].source.fingerprint("train")
  assert a != found["de-en", "bt"].source.fingerprint("train")
  with pytest.raises(errors.DataError, match=r"'train' of en-fr: none of .*train\.en-fr\.en"):
    multilingual.train_corpora(_config(tmp_path, directions="en-de,en-fr").data)
  with pytest.raises(errors.DataError, match="no direction has files of 'typo'"):
    multilingual.train_corpora(_config(tmp_path, directions="en-de", corpora="train,typo").data)


def test_vocabulary_has_the_tags_and_every_source_starts_with_them(tmp_path):
  _multiway(tmp_path / "data", {"train": 120, "val": 10, "test": 12})
  c = _config(tmp_path / "data", directions="en-de,de-en,en-fr", zero_shot="de-fr")
  run = Workdir(str(tmp_path / "run"))
  run.create()
  data = pipeline.make_data(
    c, run, num_devices=jax.device_count(), process_index=0, process_count=1
  )
  tok = data.tokenizer
  tags = {lang: tok.piece_id(directions.lang_tag(lang)) for lang in ("en", "de", "fr")}
  assert None not in tags.values() and len(set(tags.values())) == 3
  # One piece, never split (SentencePiece may put its word-start piece before it).
  assert [tok.id_to_piece(i) for i in tok.encode("<2de>")] in (["<2de>"], ["▁", "<2de>"])
  assert data.directions == ("en-de", "de-en", "en-fr") and data.zero_shot == ("de-fr",)
  assert len(data.pairs("dev", "en-de")) == 10 and len(data.pairs("test", "de-fr")) == 12
  with pytest.raises(ValueError, match="dev/de-fr"):
    data.pairs("dev", "de-fr")  # zero-shot directions have a test set only
  batch = next(data.eval_batches("test", "de-fr"))
  starts = batch["inputs"][batch["inputs_position"] == 0]
  assert set(starts.tolist()) <= {tags["fr"], PAD_ID} and tags["fr"] in starts
  # Training rows: every pair starts with the tag of its direction's target.
  train = next(data.train)
  first = train["inputs"][(train["inputs_position"] == 0) & (train["inputs"] != PAD_ID)]
  assert set(first.tolist()) <= {tags["de"], tags["en"], tags["fr"]}
  # A vocabulary without the tags is refused in one line.
  plain = tokenizer_lib.train_tokenizer(_sentences("en", 60, 0), str(tmp_path / "plain"), 60)
  with pytest.raises(errors.DataError, match="has no piece '<2en>'"):
    tokenizer_lib.check_symbols(plain, directions.user_symbols(c.data))


def test_language_balanced_vocabulary_sample(tmp_path):
  folder = tmp_path / "data"
  folder.mkdir()
  _write(folder / "train.en-de.en", _sentences("en", 400, 1))
  _write(folder / "train.en-de.de", _sentences("de", 400, 2))
  _write(folder / "train.en-fr.en", _sentences("en", 40, 3))
  _write(folder / "train.en-fr.fr", _sentences("fr", 40, 4))
  c = _config(folder, directions="en-de,en-fr", vocab_sample_size=50)
  sample = multilingual.vocabulary_sample(c.data, seed=0)
  assert sample == multilingual.vocabulary_sample(c.data, seed=0)  # deterministic
  n = {"en": 440, "de": 400, "fr": 40}
  q = direction_mix.sampling_probabilities([0, 1, 2], list(n.values()), 5.0)
  want = {lang: min(n[lang], round(share * 150)) for lang, share in zip(n, q, strict=True)}
  got_fr = sum(s.split()[0] in _WORDS["fr"] for s in sample)
  assert got_fr == want["fr"] and len(sample) == sum(want.values())


# ---------------------------------------------------------------------- decoding and scoring


class _EchoDecoder:
  """Outputs each source as it is (tags included); records the sources it saw."""

  def __init__(self) -> None:
    self.sources: list[list[int]] = []

  def __call__(self, inputs: np.ndarray, line_ids: np.ndarray) -> np.ndarray:
    out = np.zeros((inputs.shape[0], inputs.shape[1] + 1), np.int32)
    for r, row in enumerate(inputs):
      ids = [int(i) for i in row if i not in (PAD_ID, EOS_ID)]
      if ids:
        self.sources.append(ids)
        out[r, : len(ids) + 1] = [*ids, EOS_ID]
    return out


def test_translator_puts_each_line_prefix_first():
  tok = helpers.CharTokenizer()
  decoder = _EchoDecoder()
  x = tok.encode("x")[0]  # stands for a tag piece inside the text: dropped
  t = translate.Translator(
    tok, decoder, batch_size=4, max_src_len=12, source_prefix=[99], reserved_ids=[x]
  )
  t.translate(["ab", "cx"])
  assert sorted(decoder.sources) == sorted([[99, *tok.encode("ab")], [99, *tok.encode("c")]])
  decoder.sources.clear()
  t.translate_nbest(["ab", "c"], prefixes=[[97], [98, 96]])
  assert sorted(decoder.sources) == sorted([[97, *tok.encode("ab")], [98, 96, *tok.encode("c")]])


def test_tags_come_from_the_runs_vocabulary_and_leave_no_stray_piece(tmp_path):
  """Defect 4 of issue 52: the tags dropped from the input came from the command's config, so a
  narrowed data.directions let a typed `<2fr>` through (switching the output language), and a
  dropped tag left its word-start piece behind. Now: the vocabulary's own tags, removed as text."""
  symbols = ["<2en>", "<2de>", "<2fr>"]
  sentences = _sentences("en", 60, 0) + _sentences("de", 60, 1)
  tok = tokenizer_lib.train_tokenizer(sentences, str(tmp_path / "v"), 80, user_symbols=symbols)
  ids = translate.reserved_ids(_parts(tok, "en-de"))
  assert sorted(tok.id_to_piece(i) for i in ids) == sorted(symbols)
  decoder = _EchoDecoder()
  tag = tok.piece_id("<2de>")
  t = translate.Translator(
    tok, decoder, batch_size=4, max_src_len=32, source_prefix=[tag], reserved_ids=ids
  )
  t.translate(["<2fr> the house", "the house", "the<2fr>house"])
  # Each line is the tag asked for, then "the house": "the<2fr>house" is two words.
  assert decoder.sources == [[tag, *tok.encode("the house")]] * 3
  plain = tokenizer_lib.train_tokenizer(sentences, str(tmp_path / "plain"), 80)
  assert plain.reserved_ids() == []  # a bilingual vocabulary: nothing is a tag


def test_alignments_leave_the_tag_out():
  class Pieces(helpers.CharTokenizer):
    def id_to_piece(self, i: int) -> str:
      return "<2de>" if i == 50 else "▁" + self.chars.get(int(i), "?")

  class Decoded:
    def __init__(self, tokens, positions):
      self.tokens, self.source_positions = tokens, positions
      self.normalized_scores = np.zeros((len(tokens), 1))

  tok = Pieces()
  src = tok.encode("xy")  # two words of one piece each
  t = translate.Translator(tok, lambda *a: None, batch_size=1, max_src_len=8, alignments=True)
  out = np.array([[*src, EOS_ID]])
  # Output piece 0 looked at the tag (position 0), piece 1 at "y" (position 2).
  decoded = Decoded(out, np.array([[0, 2, 0]]))
  (h,) = t._hypotheses(decoded, 0, [50, *src, EOS_ID], prefix_len=1)
  assert h.alignment == "1-1"


def test_dev_figures_per_direction_and_their_mean(tmp_path, monkeypatch):
  _multiway(tmp_path / "data")
  c = _config(tmp_path / "data", directions="en-de,en-fr")
  run = Workdir(str(tmp_path / "run"))
  run.create()
  data = pipeline.make_data(
    c, run, num_devices=jax.device_count(), process_index=0, process_count=1, need_train=False
  )
  losses = {"de": 2.0, "fr": 4.0}
  asked = []

  def eval_step(params, batch):  # tokens of each direction: its loss x tokens
    del params
    tag = int(np.asarray(batch["inputs"]).reshape(-1)[0])
    lang = "de" if tag == data.tokenizer.piece_id("<2de>") else "fr"
    tokens = float(np.sum(np.asarray(batch["targets"]) > 0))
    return {"loss_sum": losses[lang] * tokens, "nll_sum": tokens, "correct": 0.0, "tokens": tokens}

  def translate_with(sources, beam_size, target_lang=None):
    asked.append(target_lang)
    return ["x"] * len(sources)

  # A decoding session's surface dev_figures uses.
  session = types.SimpleNamespace(replicated=None, translate_with=translate_with)
  monkeypatch.setattr(evaluation.parallel, "local_replica", lambda x: x)
  monkeypatch.setattr(evaluation.parallel, "shard", lambda x: x)
  got = evaluation.dev_figures(data, eval_step, session, 5, 1)
  assert asked == ["de", "fr"]
  assert got["dev_loss.en-de"] == pytest.approx(2.0) and got["dev_loss.en-fr"] == pytest.approx(4)
  assert got["dev_loss"] == pytest.approx(3.0)  # the mean of the directions
  assert set(got) >= {"dev_bleu", "dev_bleu.en-de", "dev_bleu.en-fr"}


def test_off_target_rate():
  lines = ["Ein Mann fährt Fahrrad.", "Un homme sur un vélo.", "A man on a bike.", ""]
  assert language_id.identify(lines, ["en", "de", "fr"]) == ["de", "fr", "en", ""]
  assert language_id.off_target_rate(lines, "fr", ["en", "de", "fr"]) == 0.75
  assert language_id.off_target_rate([], "fr", ["en", "fr"]) == 0.0


def test_server_requests_name_a_known_target_language():
  multi = protocol.Limits(targets=("en", "de", "fr"), default_target="")
  asked = protocol.parse_request(b'{"text": "hi", "target_lang": "fr"}', multi)
  assert asked.kind.target_lang == "fr"
  for body, culprit in (
    (b'{"text": "hi"}', '"target_lang" is missing'),
    (b'{"text": "hi", "target_lang": "xx"}', "is unknown"),
    (b'{"text": "hi", "target_lang": 3}', "must be a language code"),
  ):
    with pytest.raises(protocol.BadRequest, match=culprit):
      protocol.parse_request(body, multi)
  with_default = protocol.Limits(targets=("en", "de"), default_target="de")
  assert protocol.parse_request(b'{"text": "hi"}', with_default).kind.target_lang == "de"
  bilingual = protocol.Limits(default_target="de")
  assert (
    protocol.parse_request(b'{"text": "hi", "target_lang": "de"}', bilingual).kind.target_lang == ""
  )
  with pytest.raises(protocol.BadRequest, match="translates into de only"):
    protocol.parse_request(b'{"text": "hi", "target_lang": "fr"}', bilingual)


def test_bilingual_file_lookup_is_unchanged(tmp_path):
  _write(tmp_path / "train.en", ["a"])
  _write(tmp_path / "train.de", ["b"])
  c = builders.base_config("tiny").data
  c.source, c.dir = "files", str(tmp_path)
  source = sources.FilesSource(c)
  assert source.files("train") == (str(tmp_path / "train.en"), str(tmp_path / "train.de"))
  assert source.fingerprint("train").startswith("files-v1-")
  with pytest.raises(errors.DataError, match=r"data.dev_prefix='val': missing .*val\.en\[\.gz\]"):
    source.files("dev")


def test_a_default_request_of_a_multilingual_model_gets_its_one_targets_tag(tmp_path):
  """A request resolved once (requests.check_request) reaches target_prefix with its language;
  one that names none (a default Request, a scorer's default) gets the model's one target
  language's tag, as before, and a model of several targets says which to choose."""
  symbols = ["<2en>", "<2de>"]
  sentences = _sentences("en", 60, 0) + _sentences("de", 60, 1)
  tok = tokenizer_lib.train_tokenizer(sentences, str(tmp_path / "v"), 80, user_symbols=symbols)

  one = _parts(tok, "en-de")
  assert translate.target_prefix(one, "de") == [tok.piece_id("<2de>")]
  assert translate.target_prefix(one, "") == [tok.piece_id("<2de>")]
  assert translate.target_prefix(one, None) == [tok.piece_id("<2de>")]
  with pytest.raises(errors.ConfigError, match="target"):
    translate.target_prefix(_parts(tok, "en-de,de-en"), "")


def _parts(tok, directions: str) -> Components:
  """A multilingual model's Components of `directions` around the vocabulary `tok` (no model)."""
  data = {"directions": directions, "tgt_lang": "", "train_prefix": "train", "corpora": ""}
  return Components.around(
    tok, None, ml_collections.ConfigDict({"batch_size": 4}), 32, ml_collections.ConfigDict(data)
  )
