"""--constraints (translate, eval) and --mode=score through main.py on the session's trained demo:
what a user types, the files and JSON it writes, and the one-line errors. The search is checked
against brute force in tests/unit/test_constrained.py; 2 processes against 1 in
test_multiprocess.py."""

from __future__ import annotations

import json
import shutil

import pytest

import helpers

SOURCES = ["We need forty-two chairs.", "three hundred and five", "", "nine apples", "eleven"]
TERMS = ["Tische\tdreiundvierzig", "", "", "zehn", ""]


def _last_json(proc) -> dict:
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _one_line_error(proc, *words: str) -> None:
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert all(w in last for w in words), last


@pytest.fixture
def work(trained_demo, tmp_path):
  _, trained = trained_demo
  shutil.copytree(trained, tmp_path / "workdir")
  (tmp_path / "in.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
  (tmp_path / "terms.txt").write_text("\n".join(TERMS) + "\n", encoding="utf-8")
  return tmp_path


def test_translate_and_eval_with_constraints(work):
  common = [f"--workdir={work / 'workdir'}", "--checkpoint=latest"]
  translate = [*common, "--mode=translate", f"--input={work / 'in.txt'}"]
  plain = _last_json(helpers.run_main(*translate, f"--output={work / 'plain.txt'}"))
  result = _last_json(
    helpers.run_main(
      *translate, f"--output={work / 'out.txt'}", f"--constraints={work / 'terms.txt'}"
    )
  )
  out = (work / "out.txt").read_text(encoding="utf-8").splitlines()
  assert "Tische" in out[0] and "dreiundvierzig" in out[0] and "zehn" in out[3], out
  before = (work / "plain.txt").read_text(encoding="utf-8").splitlines()
  assert [out[i] for i in (1, 2, 4)] == [before[i] for i in (1, 2, 4)]
  figures = result["constraints"]
  assert figures["terms"] == figures["terms_met"] == 3 and figures["term_rate"] == 1.0
  assert figures["beam_size"] >= 2 and "constraints" not in plain

  nbest = _last_json(
    helpers.run_main(
      *translate,
      f"--output={work / 'nbest.tsv'}",
      f"--constraints={work / 'terms.txt'}",
      "--nbest=2",
      "--alignments",
    )
  )
  rows = [r.split("\t") for r in (work / "nbest.tsv").read_text(encoding="utf-8").splitlines()]
  assert len(rows) == 10 and nbest["nbest"] == 2
  assert all("Tische" in r[3] for r in rows[:2]) and all(len(r) == 5 for r in rows)

  # eval: the test set with one line of terms per sentence (here: none but the first).
  tests = json.loads((work / "workdir" / "config.json").read_text())["data"]["demo_test_size"]
  (work / "test_terms.txt").write_text("Haus\n" + "\n" * (tests - 1), encoding="utf-8")
  evaluated = _last_json(
    helpers.run_main(*common, "--mode=eval", f"--constraints={work / 'test_terms.txt'}")
  )
  assert evaluated["constraints"]["terms_met"] == evaluated["constraints"]["terms"] == 1
  assert evaluated["test_sentences"] == tests and "test_sacrebleu_beam2_constrained" in evaluated
  written = list((work / "workdir" / "eval").glob("*_constrained-test_terms.hyp.txt"))
  assert len(written) == 1 and "Haus" in written[0].read_text(encoding="utf-8").splitlines()[0]

  # One line, exit 2, before the model loads.
  (work / "short.txt").write_text("a\n", encoding="utf-8")
  _one_line_error(
    helpers.run_main(*translate, f"--constraints={work / 'short.txt'}"),
    "has 1 lines and --input 5",
  )
  _one_line_error(
    helpers.run_main(
      *translate, f"--constraints={work / 'terms.txt'}", "--config.decode.method=greedy"
    ),
    "--constraints",
    "only beam search",
  )
  _one_line_error(
    helpers.run_main(*common, "--mode=eval", f"--constraints={work / 'short.txt'}"),
    "has 1 lines and the test set",
  )
  _one_line_error(
    helpers.run_main(*common, "--mode=eval", f"--constraints={work / 'nowhere.txt'}"),
    "no such file",
  )


def test_score_matches_the_nbest_scores(work):
  """--mode=score of an n-best list's hypotheses gives back the scores it printed (within 1e-3)
  for every hypothesis spelled with the pieces SentencePiece gives its text."""
  common = [f"--workdir={work / 'workdir'}", "--checkpoint=latest"]
  lines = [s for s in SOURCES if s]
  (work / "src.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  _last_json(
    helpers.run_main(
      *common,
      "--mode=translate",
      f"--input={work / 'src.txt'}",
      f"--output={work / 'nbest.tsv'}",
      "--nbest=2",
    )
  )
  rows = [r.split("\t") for r in (work / "nbest.tsv").read_text(encoding="utf-8").splitlines()]
  (work / "s.txt").write_text("".join(lines[int(r[0])] + "\n" for r in rows), encoding="utf-8")
  (work / "h.txt").write_text("".join(r[3] + "\n" for r in rows), encoding="utf-8")
  pair = [f"--input={work / 's.txt'}", f"--reference={work / 'h.txt'}"]
  result = _last_json(
    helpers.run_main(*common, "--mode=score", *pair, f"--output={work / 'scores.tsv'}")
  )
  scored = [r.split("\t") for r in (work / "scores.tsv").read_text().splitlines()]
  assert result["pairs"] == len(rows) == len(scored) and result["perplexity"] > 1.0
  diffs = [abs(float(s[0]) - float(r[2])) for s, r in zip(scored, rows, strict=True)]
  assert sorted(diffs)[len(diffs) // 2] < 1e-3, diffs  # most hypotheses: their own pieces
  assert sum(int(s[2]) for s in scored) == result["tokens"]

  (work / "one.txt").write_text("x\n", encoding="utf-8")
  _one_line_error(
    helpers.run_main(
      *common, "--mode=score", f"--input={work / 's.txt'}", "--reference=" + str(work / "one.txt")
    ),
    "must pair line by line",
  )
  (work / "gap.txt").write_text("a\n\nb\n", encoding="utf-8")
  _one_line_error(
    helpers.run_main(
      *common, "--mode=score", f"--input={work / 'gap.txt'}", f"--reference={work / 'gap.txt'}"
    ),
    "line 2 is empty",
  )
  _one_line_error(
    helpers.run_main(*common, "--mode=score", f"--input={work / 's.txt'}"), "--reference"
  )
