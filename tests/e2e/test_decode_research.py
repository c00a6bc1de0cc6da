"""n-best lists, sampling, ensembles and alignments through the model, the translator and main.py.

test_search_research.py checks the searches against exact answers on hand-made distributions;
here the same features run on the Transformer (an untrained tiny one, or the session's trained
demo) end to end.
"""

from __future__ import annotations

import dataclasses
import shutil

from flaxformer_nmt import api

import helpers


def test_main_py_nbest_alignments_sampling_and_an_ensemble(
  trained_demo, trained_demo_seed1, tmp_path
):
  """The flags end to end on the trained demo: n-best TSV with alignments, sampled output that
  the same search in this process reproduces, and an ensemble with the second seed's model
  (the ensemble of a model with itself scoring as the model: tests/unit/test_decode_research.py)."""
  _, trained = trained_demo
  _, seed1 = trained_demo_seed1
  work = tmp_path / "workdir"
  shutil.copytree(trained, work)
  source = tmp_path / "in.txt"
  lines = ["three hundred and five", "", "forty-two chairs"]
  source.write_text("\n".join(lines) + "\n", encoding="utf-8")
  common = [f"--workdir={work}", "--mode=translate"]
  common += [f"--input={source}", "--config.decode.beam_size=2"]
  out = tmp_path / "nbest.tsv"
  helpers.run_main(*common, f"--output={out}", "--nbest=2", "--alignments")
  rows = [r.split("\t") for r in out.read_text(encoding="utf-8").splitlines()]
  assert [(int(r[0]), int(r[1])) for r in rows] == [(i, k) for i in range(3) for k in range(2)]
  assert rows[2][3] == rows[3][3] == "" and all(len(r) == 5 for r in rows)
  assert all(p.count("-") == 1 for r in rows for p in r[4].split())

  sampled = tmp_path / "sampled.txt"
  helpers.run_main(*common, f"--output={sampled}", "--config.decode.method=sample", "--nbest=1")
  sample_config = api.load_run_config(str(work), {"decode.method": "sample"})
  again = api.translate(sample_config, str(work), lines)  # the same seed: the same samples
  assert sampled.read_text(encoding="utf-8").splitlines() == again and again[0] and again[2]

  config = helpers.demo_config(model__dtype="float32")
  alone = api.evaluate(config, str(work), checkpoint="latest")
  pair = api.evaluate(config, str(work), checkpoint="latest", ensemble=[str(seed1)])
  assert pair["checkpoint"].startswith("ensemble of 2 models") and str(seed1) in pair["checkpoint"]
  assert pair["test_sentences"] == alone["test_sentences"]
  written = sorted(
    p.name for p in (work / "eval").glob("test_demo.test40.*_ensemble2_latest_*_beam2-*.hyp.txt")
  )
  assert len(written) == 1, written  # named by what was loaded, beside step60's own files
  both = api.translate_nbest(config, str(work), ["three hundred"], 2, "latest", [str(seed1)], True)
  assert len(both[0]) == 2 and dataclasses.is_dataclass(both[0][0])
