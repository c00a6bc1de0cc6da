"""Terminology constraints and scoring on the real Transformer: the committed small trained run
(translate's path, the server's, the API's), and a tiny untrained model for the scores against the
search (test_constrained.py checks the search itself against brute force)."""

from __future__ import annotations

import functools

import jax
import model_params
import numpy as np
import pytest

from flaxformer_nmt import api, errors, modes
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.decoding import constraints, decode, scoring, search
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.model.ensemble import Ensemble
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.serving import batcher as batcher_lib
from flaxformer_nmt.serving import protocol, service

LINES = ["We need forty-two chairs.", "three hundred and five", "", "nine", "one thousand"]
TERMS = [["Tische"], [], ["neun"], ["neun", "zehn"], []]


def _outputs(**kwargs) -> modes.Outputs:
  return modes.Outputs(constraints="terms.txt", **kwargs)


@pytest.mark.parametrize(
  "style",
  ["shrinking", pytest.param("t2t", marks=pytest.mark.slow)],  # over 10 s cold
)
def test_every_term_appears_and_lines_without_terms_are_unchanged(saved_run, style):
  config, workdir = saved_run
  config.decode.beam_style = style
  plain, _, _ = modes.translate_hypotheses(config, str(workdir), "latest", LINES)
  hyps, stats, _ = modes.translate_hypotheses(
    config, str(workdir), "latest", LINES, _outputs(), TERMS
  )
  figures = stats["constraints"]
  # Line 2 is blank: its term is reported, not decoded; every other term is in its line.
  assert figures["terms_blank_line"] == [{"line": 3, "term": "neun"}]
  assert figures["terms"] == 4 and figures["terms_met"] == 3
  assert figures["num_lines_missing_terms"] == 1 and figures["lines_missing_terms"] == [3]
  for h, terms in zip(hyps, TERMS, strict=True):
    if terms and h[0].text:
      assert all(t in h[0].text for t in terms), (h[0].text, terms)
  # The beam widened to the most pieces a line must meet + 1.
  assert figures["beam_size"] > config.decode.beam_size
  for i in (1, 4):  # no terms: the plain search (batched apart, which may move the last bits)
    assert hyps[i][0].text == plain[i][0].text
    assert hyps[i][0].score == pytest.approx(plain[i][0].score, rel=1e-5, abs=1e-6)
  assert hyps[0][0].text != plain[0][0].text


def test_nbest_and_alignments_with_terms(saved_run):
  config, workdir = saved_run
  outputs = _outputs(nbest=2, alignments=True)
  hyps, stats, _ = modes.translate_hypotheses(
    config, str(workdir), "latest", LINES[:2], outputs, TERMS[:2]
  )
  assert stats["constraints"]["term_rate"] == 1.0
  assert all("Tische" in h.text for h in hyps[0]) and len(hyps[0]) == 2
  assert hyps[0][0].score >= hyps[0][1].score
  assert all(h.alignment for hyps_ in hyps for h in hyps_)


def test_constraints_refuse_what_cannot_be_searched(saved_run):
  config, workdir = saved_run
  config.decode.method = "greedy"
  with pytest.raises(errors.ConfigError, match="only beam search"):
    modes.translate_hypotheses(config, str(workdir), "latest", LINES, _outputs(), TERMS)
  config.decode.method = "beam"
  config.decode.max_len_offset = 2  # "one thousand" (3 pieces) has room for 4 terms' pieces
  long_terms = [["Stühle Stühle Stühle Stühle Stühle"], [], [], [], ["\u2603"]]
  hyps, stats, _ = modes.translate_hypotheses(
    config, str(workdir), "latest", LINES, _outputs(), long_terms
  )
  figures = stats["constraints"]
  assert figures["terms_too_long"] == [{"line": 1, "term": long_terms[0][0]}]
  assert figures["terms_not_encodable"] == [{"line": 5, "term": "\u2603"}]
  plain, _, _ = modes.translate_hypotheses(config, str(workdir), "latest", LINES)
  assert hyps[0][0] == plain[0][0]  # decoded without the term that does not fit
  with pytest.raises(errors.ConfigError, match="one list of terms per line"):
    api.translate(config, str(workdir), LINES, constraints=[["a"]])


def test_read_terms_and_pairs_refuse_in_one_line(tmp_path):
  path = tmp_path / "terms.txt"
  path.write_text("Haus\tgrüne Tür\n\n  \t \n", encoding="utf-8")
  assert constraints.read_terms(str(path)) == [["Haus", "grüne Tür"], [], []]
  with pytest.raises(errors.ConfigError, match="has 3 lines and --input 2"):
    constraints.read_terms(str(path), 2, "--input")
  with pytest.raises(errors.ConfigError, match="--input=a has 2 lines and --reference=b 1"):
    scoring.check_pairs(["x", "y"], ["z"], "--input=a", "--reference=b")
  with pytest.raises(errors.ConfigError, match="--reference=b: line 2 is empty"):
    scoring.check_pairs(["x", "y"], ["z", " "], "--input=a", "--reference=b")


def test_the_server_decodes_constrained_requests_as_translate(saved_run):
  config, workdir = saved_run
  want, _, _ = modes.translate_hypotheses(
    config, str(workdir), "latest", LINES[:2], _outputs(), TERMS[:2]
  )
  served = service.ServedSession(Session.load(config, Workdir(str(workdir)), "latest"))
  kind = batcher_lib.Kind(constrained=True)
  got, _ = served.translate(kind, list(zip(LINES[:2], TERMS[:2], strict=True)), [0, 1])
  assert [h[0].text for h in got] == [h[0].text for h in want]
  limits = protocol.Limits(max_nbest=4, nbest_rule="beam", constraints=True)
  asked = protocol.parse_request(b'{"text": ["a", "b"], "constraints": [["x"], []]}', limits)
  assert asked.lines == [("a", ["x"]), ("b", [])] and asked.kind.constrained
  for body, message in [
    (b'{"text": "a", "constraints": [["x"]]}', "must be a list of strings"),
    (b'{"text": ["a"], "constraints": [["x"], []]}', "a list of strings per"),
    (b'{"text": "a", "constraints": ["x\\ty"]}', "holds a line break or tab"),
    (b'{"text": "a", "constraints": ["' + b"x" * 101 + b'"]}', "more than 100 characters"),
  ]:
    with pytest.raises(protocol.BadRequest, match=message):
      protocol.parse_request(body, limits)
  with pytest.raises(protocol.BadRequest, match="needs beam search"):
    protocol.parse_request(b'{"text": "a", "constraints": []}', protocol.Limits())


# ------------------------------------------------------------------------------------------------
# Scoring given translations.


def _tiny(seed: int):
  c = config_lib.base_config("tiny")
  model = Transformer(TransformerConfig.from_config(c.model, vocab_size=24))
  return model, model_params.random_params(model.cfg, seed)


@pytest.mark.parametrize("ensemble", [False, True])
def test_teacher_forced_scores_equal_the_nbest_scores(ensemble):
  """Each n-best hypothesis, scored teacher-forced, gets the score the beam gave it (within
  1e-3: the cached decoder rounds differently), alone and as a two-model ensemble."""
  model, params = _tiny(0)
  if ensemble:
    params = Ensemble((params, _tiny(1)[1]))
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, 24, size=(4, 7)).astype(np.int32)
  inputs[:, -1] = EOS_ID
  inputs[2, 4:] = PAD_ID
  inputs[2, 3] = EOS_ID
  cfg = decode.SearchConfig(beam_size=4, nbest=4, alpha=0.6, max_len_offset=5)
  result = decode.decode_batch(model, params, inputs, cfg)  # fields [4, n, ...]
  rows = np.asarray(result.tokens).reshape(16, -1)  # EOS then PAD (or cut at the cap)
  sources = np.repeat(inputs, 4, axis=0)
  # Jitted as --mode=score runs it (eagerly, every operation of the model is a program).
  score = jax.jit(functools.partial(scoring.token_log_probs, model))
  log_prob, tokens = jax.device_get(score(params, sources, rows))
  np.testing.assert_array_equal(tokens, np.asarray(result.lengths).reshape(-1))
  scores = log_prob / np.asarray(search.length_penalty(tokens, 0.6))
  diff = np.abs(scores - np.asarray(result.normalized_scores).reshape(-1))
  assert diff.max() < 1e-3, diff.max()
