"""A run describes itself, as `python main.py` runs it: a workdir trained on the user's own files
is used with `--workdir` alone, a config that disagrees with it is one line that changes nothing,
a second command reuses the first's compiled programs, and the checks before work come first.

One small run on a 170-pair corpus of the user's files (the demo's sentences written as text), 40
steps with checkpoints at 20 and 40, trained once for the module (~30 s on 2 cores): no shared
fixture trains on files.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys

import pytest

from flaxformer_nmt.data import demo

import helpers

TEST_KEYS = (
  "test_sacrebleu_greedy",
  "test_sacrebleu_beam2",
  "test_tokenized_bleu_greedy",
  "test_tokenized_bleu_beam2",
  "test_chrf_greedy",
  "test_chrf_beam2",
  "test_set",
  "test_sentences",
)


def _write_corpus(folder: pathlib.Path) -> None:
  """train (170 pairs), val and test (16 each) as <prefix>.en / <prefix>.de, from the demo's
  templates."""
  rng = random.Random(7)
  folder.mkdir(parents=True)
  for prefix, size in (("train", 170), ("val", 16), ("test", 16)):
    pairs = [rng.choice(demo.TEMPLATES)(rng) for _ in range(size)]
    for side, lang in ((0, "en"), (1, "de")):
      text = "".join(p[side] + "\n" for p in pairs)
      (folder / f"{prefix}.{lang}").write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def files_run(tmp_path_factory) -> tuple[pathlib.Path, dict, str]:
  """(workdir, train_result.json, training's stderr): the demo's model on the user's files."""
  root = tmp_path_factory.mktemp("files_run")
  _write_corpus(root / "corpus")
  work = root / "run"
  proc = helpers.run_main(
    "--config=configs/demo.py",
    f"--workdir={work}",
    "--config.data.source=files",
    f"--config.data.dir={root / 'corpus'}",
    "--config.data.dev_prefix=val",
    *helpers.SMALL_MODEL_FLAGS,
    "--config.num_train_steps=40",
    "--config.checkpoint_every_steps=20",
    "--config.eval_every_steps=40",
    "--config.decode.beam_size=2",
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return work, json.loads((work / "train_result.json").read_text()), proc.stderr


def _copy(files_run, tmp_path: pathlib.Path) -> pathlib.Path:
  work = tmp_path / "run"
  shutil.copytree(files_run[0], work)
  return work


def test_eval_with_the_workdir_alone_gives_trainings_test_figures(files_run, tmp_path):
  work = _copy(files_run, tmp_path)
  trained = files_run[1]
  proc = helpers.run_main(f"--workdir={work}", "--mode=eval", "--checkpoint=latest")
  assert proc.returncode == 0, proc.stderr[-3000:]
  scored = json.loads(proc.stdout.strip().splitlines()[-1])
  assert {k: scored[k] for k in TEST_KEYS} == {k: trained[k] for k in TEST_KEYS}
  assert scored["test_set"] == "test"  # the files source names it by its prefix
  # Training wrote these files for the same test set and parameters; eval wrote them again, the
  # same bytes, and nothing else.
  names = sorted(p.name for p in (work / "eval").iterdir())
  assert names == sorted(p.name for p in (files_run[0] / "eval").iterdir())
  assert all(re.match(r"test_files\.test\.[0-9a-f]{8}_step40_", n) for n in names), names
  # Another test set and a search with another beam: new files beside the old, none touched.
  before = helpers.snapshot(work / "eval")
  proc = helpers.run_main(
    f"--workdir={work}", "--mode=eval", "--config.data.test_prefix=val", "--config.decode.alpha=1"
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  after = helpers.snapshot(work / "eval")
  assert {k: after[k] for k in before} == before and len(after) == len(before) + 4
  evals = [json.loads(line) for line in (work / "results.jsonl").read_text().splitlines()]
  assert [r["mode"] for r in evals][-2:] == ["eval", "eval"]


@pytest.mark.parametrize(
  "args,culprit",
  [
    (["--config=configs/demo.py", "--mode=eval"], "disagrees with the run: "),  # vocab_sample_size
    (["--mode=eval", "--config.model.num_heads=2"], "config.model.num_heads=2 disagrees"),
    (["--mode=translate", "--config.model.num_heads=2"], "config.model.num_heads=2 disagrees"),
    (["--config.model.num_heads=2"], "config.model.num_heads=2 disagrees"),  # a resume
    (["--config.model.dtype=bfloat16"], "a resumed run keeps how it computes"),
  ],
)
def test_a_config_that_disagrees_is_one_line_and_changes_nothing(
  files_run, tmp_path, args, culprit
):
  work = _copy(files_run, tmp_path)
  before = helpers.snapshot(work)
  proc = helpers.run_main(f"--workdir={work}", *args, stdin="three hundred\n")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith("error: ") and culprit in lines[0], lines[0]
  assert "/config.json has" in lines[0]
  assert helpers.snapshot(work) == before  # config.json and eval/ byte for byte, and the rest


def test_a_resume_on_a_corpus_changed_in_place_is_one_line_and_a_moved_one_resumes(
  files_run, tmp_path
):
  """Issue 52: the run recorded its training data (run.json); the same folder holding another
  corpus of as many lines is refused, the same corpus moved elsewhere is taken (and recorded)."""
  work = _copy(files_run, tmp_path)
  corpus = work.parent / "corpus"
  shutil.copytree(files_run[0].parent / "corpus", corpus)
  lines = (corpus / "train.de").read_text(encoding="utf-8").splitlines()
  (corpus / "train.de").write_text("\n".join(lines[1:] + lines[:1]) + "\n", encoding="utf-8")
  before = helpers.snapshot(work)
  args = (f"--workdir={work}", f"--config.data.dir={corpus}", "--config.num_train_steps=41")
  proc = helpers.run_main(*args)
  stderr = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(stderr) == 1, proc.stderr[-3000:]
  assert f"{work} (trained with `configs/demo.py`) was trained on other data: " in stderr[0]
  assert "train.de" in stderr[0]
  assert helpers.snapshot(work) == before
  shutil.rmtree(corpus)
  shutil.copytree(files_run[0].parent / "corpus", corpus)  # the run's own corpus, moved
  proc = helpers.run_main(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  saved = json.loads((work / "config.json").read_text())
  assert saved["data"]["dir"] == str(corpus)
  assert json.loads((work / "run.json").read_text())["config"] == "configs/demo.py"


def test_training_recorded_its_dtype_and_logs_epochs_in_its_line(files_run):
  work, _, stderr = files_run
  assert json.loads((work / "config.json").read_text())["model"]["dtype"] == "float32"
  assert "Training epoch" not in stderr
  assert stderr.count("Training data of stream") <= 8  # once per data stream, not per pass
  steps = [line for line in stderr.splitlines() if "step 40/40" in line]
  assert steps and "  epoch " in steps[-1], steps


def test_a_second_translate_reads_the_first_ones_programs(files_run, tmp_path):
  """With a cache of its own: the first translate fills it and saves its decoding program and
  the parameters' shapes (executables/), the second adds nothing (every program found, nothing
  traced again), and both write the same lines."""
  work = _copy(files_run, tmp_path)
  cache = tmp_path / "cache"
  env = {"FLAXFORMER_NMT_COMPILE_CACHE": str(cache), "JAX_COMPILATION_CACHE_DIR": ""}
  outputs = []
  for i in (1, 2):
    out = tmp_path / f"out{i}.txt"
    proc = helpers.run_main(
      f"--workdir={work}", "--mode=translate", f"--output={out}", stdin="three hundred\n", env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs.append(out.read_text())
    saved = sorted(os.listdir(cache / "executables"))
    if i == 1:
      first, first_saved = sorted(os.listdir(cache)), saved
      assert first and oct(cache.stat().st_mode & 0o777) == "0o700"
      assert len(first_saved) == 2, first_saved  # the decoder, and the parameters' shapes
  assert sorted(os.listdir(cache)) == first
  assert saved == first_saved
  assert outputs[0] == outputs[1]


def test_a_missing_input_is_reported_before_jax_is_imported(tmp_path):
  script = (
    "import runpy, sys\n"
    f"sys.argv = ['main.py', '--workdir={tmp_path}', '--mode=translate', "
    f"'--input={tmp_path}/nothere.txt']\n"
    "try:\n"
    "  runpy.run_path('main.py', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "  print(e.code, 'jax' in sys.modules)\n"
  )
  proc = subprocess.run(
    [sys.executable, "-c", script], cwd=helpers.REPO, capture_output=True, text=True, timeout=120
  )
  assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr)
  assert proc.stderr.strip() == f"error: {tmp_path}/nothere.txt: no such file."


def test_a_damaged_newest_checkpoint_falls_back_in_one_warning(files_run, tmp_path):
  work = _copy(files_run, tmp_path)
  (work / "checkpoints" / "40" / "state" / "_METADATA").write_text("{not json")
  proc = helpers.run_main(f"--workdir={work}", "--mode=translate", stdin="three hundred\n")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip(), proc.stdout
  # absl's warning and error lines (JAX's own Python warnings about a cache entry another test
  # process is writing may come too: the cache is shared by the test session).
  not_info = [line for line in proc.stderr.splitlines() if re.match(r"[WEF]\d{4} ", line)]
  assert len(not_info) == 1 and "checkpoints/40 is corrupt" in not_info[0], not_info
  assert "falling back to the previous one" in not_info[0]
  assert "Traceback" not in proc.stderr and "trained again" not in proc.stderr
  assert (work / "checkpoints" / "40").is_dir()  # outside training nothing is moved


@pytest.mark.parametrize("where", ["file/sub", "/proc/flaxformer_nmt/run"])
def test_a_workdir_that_cannot_be_made_is_one_line(tmp_path, where):
  (tmp_path / "file").write_text("not a folder\n")
  workdir = where if where.startswith("/") else str(tmp_path / where)
  proc = helpers.run_main("--config=configs/demo.py", f"--workdir={workdir}")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --workdir="), (
    lines
  )
