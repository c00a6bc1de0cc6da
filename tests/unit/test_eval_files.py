"""An evaluation's files are named by everything that changes its scores (issue 52): no later
evaluation overwrites them. The model is stood in for by a function (the names, not the
translations, are under test); `score_test_set` is the code every test evaluation runs."""

from __future__ import annotations

import pathlib
import types

import pytest

from flaxformer_nmt.config import builders
from flaxformer_nmt.decoding import evaluation


def _pairs(n: int, word: str) -> list[tuple[str, str]]:
  return [(f"the {word} line number {i} ends here",) * 2 for i in range(n)]


def _data(pairs: list[tuple[str, str]]):
  return types.SimpleNamespace(
    directions=(), pairs=lambda split, direction=None: pairs, split_name=lambda s, d=None: "test"
  )


def _config(folder: str, **overrides):
  c = builders.base_config("tiny")
  c.data.source, c.data.dir, c.data.test_prefix = "files", folder, "test"
  c.data.tgt_lang = "en"
  c.decode.beam_size = 1  # greedy only: one pair of files per evaluation
  for path, value in overrides.items():
    group, name = path.split(".")
    c[group][name] = value
  return c


class _EchoSession:
  """A decoding session whose "model" copies its source: the run's own test set scores 100."""

  def __init__(self, config) -> None:
    self.config, self.tag = config, "step300"

  def translate_with(self, sources, beam_size, target_lang=None):
    return list(sources)


def _score(config, pairs, out: pathlib.Path) -> dict:
  return evaluation.score_test_set(_EchoSession(config), _data(pairs), str(out))


def _files(out: pathlib.Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize(
  "other",
  [
    pytest.param({"folder": "/elsewhere/data", "n": 200}, id="another data.dir, same prefix"),
    pytest.param({"max_len": 6}, id="another data.max_len"),
    pytest.param({"n": 200}, id="fewer sentences of the same set"),
  ],
)
def test_another_evaluation_never_overwrites_the_runs_files(tmp_path, other):
  """Defect 1 of issue 52: scoring a test set with the same prefix in another data.dir rewrote
  eval/test_files.test_step300_* (the run's 500 sentences at 99.99 replaced by 200 others), and
  so did --config.data.max_len=6, without a warning."""
  out = tmp_path / "eval"
  own = _score(_config("/run/data"), _pairs(500, "own"), out)
  before = _files(out)
  assert len(before) == 2 and own["test_sacrebleu_greedy"] == pytest.approx(100.0)
  overrides = {"data.max_len": other["max_len"]} if "max_len" in other else {}
  word = "other" if "folder" in other else "own"
  _score(
    _config(other.get("folder", "/run/data"), **overrides), _pairs(other.get("n", 500), word), out
  )
  after = _files(out)
  assert len(after) == 4  # two more files beside the run's own, which are as they were
  assert {name: after[name] for name in before} == before


def test_the_same_evaluation_gets_the_same_names(tmp_path):
  out = tmp_path / "eval"
  _score(_config("/run/data"), _pairs(50, "own"), out)
  first = _files(out)
  _score(_config("/moved/data"), _pairs(50, "own"), out)  # the same set, moved: the same files
  assert _files(out) == first
  (name,) = [n for n in first if n.endswith(".hyp.txt")]
  assert name.startswith("test_files.test.") and name.endswith("_step300_greedy.hyp.txt")


def test_max_test_sentences_scores_the_first_n(tmp_path):
  out = tmp_path / "eval"
  result = _score(_config("/run/data", **{"eval.max_test_sentences": 7}), _pairs(50, "own"), out)
  assert result["test_sentences"] == 7
  (hyps,) = out.glob("*.hyp.txt")
  assert hyps.read_text(encoding="utf-8").splitlines() == [
    f"the own line number {i} ends here" for i in range(7)
  ]


def test_a_runs_bleu_protocol_is_reported_beside_the_other_figures(tmp_path):
  """eval.bleu_protocol="multi30k": each search also gets the Multi30k papers' BLEU4, with its
  signature; the echoing model's output is its reference, so 100."""
  out = tmp_path / "eval"
  result = _score(_config("/run/data", **{"eval.bleu_protocol": "multi30k"}), _pairs(9, "own"), out)
  assert result["test_multi30k_bleu_greedy"] == pytest.approx(100.0)
  assert result["multi30k_bleu_signature"].endswith("|pre:lc+norm-punct+moses-en")
  plain = _score(_config("/run/data"), _pairs(9, "own"), tmp_path / "plain")
  assert not [k for k in plain if "multi30k" in k]
