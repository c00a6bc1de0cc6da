"""A many-to-many model's language tokens (an imported M2M100: issue 62): the target language's
token forced as the first output in every search, scored as the search scores it, and the
languages of a request resolved once, with one line naming the closest language the model has.

The model here is a tiny random Transformer of M2M100's options (pre-LN, its positions, the
decoder started from `</s>`); tests/e2e/test_m2m100_run.py imports a whole model folder, and the
`hf` leg checks greedy output against transformers' generate(forced_bos_token_id=...)."""

from __future__ import annotations

import dataclasses

import ml_collections
import model_params
import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders, checks, directions
from flaxformer_nmt.decoding import constraints as constraints_lib
from flaxformer_nmt.decoding import decode, scoring
from flaxformer_nmt.model.tokens import EOS_ID
from flaxformer_nmt.model.transformer import Transformer
from flaxformer_nmt.serving import protocol

import m2m100_models

_VOCAB = 40


@pytest.fixture(scope="module")
def m2m_like():
  cfg = m2m100_models.layout(_VOCAB, max_len=64)
  return Transformer(cfg), model_params.random_params(cfg, seed=3)


_SOURCES = np.array([[7, 8, 9, 10, EOS_ID, 0], [11, 12, EOS_ID, 0, 0, 0]], np.int32)
_FIRST = np.array([31, 35], np.int32)  # each row its own language token


@pytest.mark.parametrize(
  "search",
  [
    decode.SearchConfig(method="greedy", beam_size=1, force_first=True),
    decode.SearchConfig(beam_size=3, nbest=2, force_first=True),
    decode.SearchConfig(beam_size=3, style="t2t", force_first=True),
    decode.SearchConfig(method="sample", nbest=3, force_first=True),
  ],
  ids=["greedy", "beam-nbest", "beam-t2t", "sample"],
)
def test_every_search_starts_with_each_rows_forced_token(m2m_like, search):
  model, params = m2m_like
  result = decode.decode_batch(model, params, _SOURCES, search, first_ids=_FIRST)
  tokens = np.asarray(result.tokens).reshape(2, -1, result.tokens.shape[-1])  # [batch, n, T]
  assert (tokens[:, :, 0] == _FIRST[:, None]).all(), tokens[:, :, :3]
  # Forced, not chosen: the search without it starts elsewhere on this random model.
  free = decode.decode_batch(
    model, params, _SOURCES, dataclasses.replace(search, force_first=False)
  )
  assert not (np.asarray(free.tokens).reshape(tokens.shape)[:, :, 0] == _FIRST[:, None]).all()


def test_first_ids_go_with_force_first_only(m2m_like):
  model, params = m2m_like
  with pytest.raises(ValueError, match="first_ids"):
    decode.decode_batch(model, params, _SOURCES, decode.SearchConfig(), first_ids=_FIRST)
  with pytest.raises(ValueError, match="first_ids"):
    decode.decode_batch(model, params, _SOURCES, decode.SearchConfig(force_first=True))


def test_the_constrained_beam_keeps_the_forced_token_and_its_terms(m2m_like):
  model, params = m2m_like
  terms = constraints_lib.pack([[[20, 21]], [[22]]])
  search = decode.SearchConfig(beam_size=2, force_first=True)
  result = decode.decode_batch(
    model,
    params,
    _SOURCES,
    search,
    constraints=constraints_lib.Constraints(*terms),
    first_ids=_FIRST,
  )
  tokens = np.asarray(result.tokens)
  assert (tokens[:, 0] == _FIRST).all()
  assert [20, 21] in [tokens[0, i : i + 2].tolist() for i in range(tokens.shape[1] - 1)]
  assert 22 in tokens[1].tolist()


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_the_scorer_scores_a_forced_token_as_the_search_does(m2m_like):
  """Greedy's total log-probability of its own output equals the teacher-forced one in which the
  forced token counts 0 (scoring.token_log_probs(forced_first=True)); without that rule the
  teacher-forced total is lower by the model's own log-probability of the token."""
  model, params = m2m_like
  search = decode.SearchConfig(method="greedy", beam_size=1, force_first=True, alpha=0.0)
  result = decode.decode_batch(model, params, _SOURCES, search, first_ids=_FIRST)
  targets = np.asarray(result.tokens)
  forced, n = scoring.token_log_probs(model, params, _SOURCES, targets, forced_first=True)
  free, _ = scoring.token_log_probs(model, params, _SOURCES, targets)
  np.testing.assert_allclose(np.asarray(forced), np.asarray(result.scores), atol=1e-4)
  assert (np.asarray(n) == np.asarray(result.lengths)).all()
  assert (np.asarray(free) < np.asarray(forced) - 1e-3).all()


def _many(src: str = "en", tgt: str = "de") -> ml_collections.ConfigDict:
  config = builders.base_config("tiny")
  config.data.lang_tokens, config.data.languages = "m2m100", "en,de,fr,pt,zh"
  config.data.src_lang, config.data.tgt_lang = src, tgt
  return config


def test_a_many_to_many_model_resolves_both_languages_with_its_defaults():
  data = _many().data
  assert directions.resolve_target(data, None) == "de"
  assert directions.resolve_source(data, "") == "en"
  assert directions.resolve_target(data, "zh") == "zh"
  assert directions.resolve_source(data, "fr") == "fr"
  with pytest.raises(errors.ConfigError, match=r"--target_lang=deu: .*closest: de"):
    directions.resolve_target(data, "deu")
  with pytest.raises(errors.ConfigError, match=r"--source_lang=pr: .*closest: pt"):
    directions.resolve_source(data, "pr")


@pytest.mark.parametrize(
  "given, closest",
  [
    ("es", "spa_Latn"),
    ("ja", "jpn_Jpan"),
    ("de", "deu_Latn"),
    ("eng", "eng_Latn"),
    ("zho", "zho_Hans"),
  ],
)
def test_an_nllb_model_names_its_flores_code_for_a_two_letter_language(given, closest):
  """NLLB-200's codes (FLORES-200's: ISO 639-3 and script): `es` is Spanish, spa_Latn, not
  est_Latn (Estonian), which merely starts the same."""
  data = _many().data
  data.lang_tag_format = "{}"
  data.languages = "est_Latn,spa_Latn,jav_Latn,jpn_Jpan,deu_Latn,eng_Latn,zho_Hans,zho_Hant"
  data.src_lang, data.tgt_lang = "eng_Latn", "deu_Latn"
  with pytest.raises(errors.ConfigError, match=rf"--target_lang={given}: .*\(closest: {closest}\)"):
    directions.resolve_target(data, given)


def test_other_models_take_source_lang_only_as_the_language_they_read():
  data = builders.base_config("tiny").data  # en-de
  assert directions.resolve_source(data, "en") is None
  with pytest.raises(errors.ConfigError, match="reads en only"):
    directions.resolve_source(data, "fr")


@pytest.mark.parametrize(
  "change,message",
  [
    ({"lang_tokens": "nllb"}, "lang_tokens must be one of"),
    ({"languages": ""}, "needs config.data.languages"),
    ({"src_lang": "it"}, "src_lang='it' is not one of"),
    ({"lang_tokens": ""}, "languages is set, but config.data.lang_tokens"),
    ({"directions": "en-de,de-en"}, "not in data.directions"),
  ],
)
def test_the_config_checks_a_many_to_many_model(change, message):
  config = _many()
  config.data.update(change)
  with pytest.raises(errors.ConfigError, match=message):
    checks.validate(config)


def test_the_server_takes_source_lang_for_a_many_to_many_model():
  limits = protocol.Limits(
    targets=("en", "de", "fr"), default_target="de", sources=("en", "de", "fr"), default_source="en"
  )
  asked = protocol.parse_request(b'{"text": "x", "source_lang": "fr", "target_lang": "en"}', limits)
  assert (asked.kind.source_lang, asked.kind.target_lang) == ("fr", "en")
  assert protocol.parse_request(b'{"text": "x"}', limits).kind.source_lang == "en"
  with pytest.raises(protocol.BadRequest, match='"source_lang"="xx" is unknown'):
    protocol.parse_request(b'{"text": "x", "source_lang": "xx"}', limits)
  # A model without source tokens: its own language is allowed and changes nothing.
  plain = protocol.Limits(default_target="de", sources=("en",))
  assert protocol.parse_request(b'{"text": "x", "source_lang": "en"}', plain).kind.source_lang == ""
  with pytest.raises(protocol.BadRequest, match="this model reads en"):
    protocol.parse_request(b'{"text": "x", "source_lang": "de"}', plain)
