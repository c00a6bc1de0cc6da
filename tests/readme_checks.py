"""What the README tests (tests/e2e/test_readme.py) check of one command's output: its last
JSON line, docs/decoding.md's research commands, an eval's figures recomputed by sacrebleu."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess

import readme
import readme_sandbox


def last_json(proc: subprocess.CompletedProcess) -> dict:
  return json.loads(proc.stdout.strip().splitlines()[-1])


def research_decoding(text: str, proc: subprocess.CompletedProcess, box) -> bool:
  """Checks one command of docs/decoding.md (n-best, sampling, ensembles, alignments, the
  back-translation recipe); False for any other command."""
  lines = lambda name: (box.repo / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
  if "--ensemble=" in text:
    result = last_json(proc)
    assert result["checkpoint"].startswith("ensemble of 2 models")
    assert "nc:6" in result["chrf_signature"]
    rescored(box, text, result, "beam4")
  elif "--output=nbest.tsv" in text or "--output=samples.tsv" in text:
    k = int(re.search(r"--nbest=(\d+)", text).group(1))
    rows = [r.split("\t") for r in lines(re.search(r"--output=(\S+)", text).group(1))]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(i, j) for i in range(2) for j in range(k)]
  elif "--output=aligned.txt" in text:
    rows = [row.split(" ||| ") for row in lines("aligned.txt")]
    sources = lines("numbers.txt")
    assert [len(r) for r in rows] == [2, 2]
    for (output, alignment), source in zip(rows, sources, strict=True):
      pairs = [tuple(map(int, p.split("-"))) for p in alignment.split()]
      assert all(i < len(source.split()) and j < len(output.split()) for i, j in pairs), pairs
  elif "--output=constrained.txt" in text:
    assert last_json(proc)["constraints"]["term_rate"] == 1.0
    first, second = lines("constrained.txt")
    assert "zweiundvierzig Tische" in first and "im Jahr" in second, (first, second)
  elif "--mode=score" in text:
    rows = [r.split("\t") for r in lines("scores.tsv")]
    assert len(rows) == 2 and all(float(r[1]) < 0 and int(r[2]) > 1 for r in rows)
    assert last_json(proc)["pairs"] == 2
  elif "--output=data/demo_text/mono.en" in text:
    assert len(lines("data/demo_text/mono.en")) == len(lines("data/demo_text/mono.de")) == 2000
  elif "flaxformer_nmt.data.demo_text" in text and "--variant=large" in text:
    written = last_json(proc)["lines"]  # docs/fine-tuning.md's shifted domain
    assert (written["train.en"], written["test.de"], "mono.de" in written) == (2000, 200, False)
  elif "flaxformer_nmt.data.demo_text" in text:
    assert last_json(proc)["lines"]["mono.de"] == 2000
  elif text.startswith("mkdir -p data/demo_bt"):
    assert len(lines("data/demo_bt/train.de")) == len(lines("data/demo_bt/train.en")) == 22_000
  else:
    return False
  return True


def rescored(box: readme_sandbox.Sandbox, text: str, result: dict, name: str) -> None:
  """An eval's test sacreBLEU and chrF are sacrebleu's own figures for the hypotheses it wrote
  (`<workdir>/eval/*_<name>.hyp.txt`, the newest) against the test set's references, exactly."""
  import sacrebleu  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt import api  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.data import sources  # pylint: disable=g-import-not-at-top

  from error_runner import _value  # pylint: disable=g-import-not-at-top

  words = shlex.split(text) + readme.DEMO
  overrides = dict(w[len("--config.") :].split("=", 1) for w in words if w.startswith("--config."))
  config = api.load_config("demo", {k: _value(v) for k, v in overrides.items()})
  workdir = box.repo / re.search(r"--workdir=(\S+)", text).group(1)
  search = name if name == "greedy" else f"{name}-*"  # beam4-shrinking-a0.6 (evaluation.search_tag)
  hyp_file = max(workdir.glob(f"eval/*_{search}.hyp.txt"), key=lambda p: p.stat().st_mtime)
  hyps = hyp_file.read_text(encoding="utf-8").splitlines()
  with contextlib.chdir(box.repo):  # a files source's data.dir is relative to it
    refs = [t for _, t in sources.make_source(config.data).iter_pairs("test")]
  assert result[f"test_sacrebleu_{name}"] == sacrebleu.corpus_bleu(hyps, [refs]).score
  assert result[f"test_chrf_{name}"] == sacrebleu.corpus_chrf(hyps, [refs]).score
