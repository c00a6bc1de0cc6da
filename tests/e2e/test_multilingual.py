"""One model for several directions, end to end: main.py trains it as 2 processes x 4 devices
exactly as 1 x 8 (tagged sources, temperature-sampled corpora of unequal size); the run reports
every direction, zero-shot included, with off-target rates; `--target_lang` picks the output
language on the command line, in the API and in the server, and an unknown one is one line.

Why not the shared trained demo: it is bilingual; this module trains its own tiny multilingual
run (a few hundred synthetic pairs, 12 steps: tests/multilingual_data.py) once, and its 2-process
twin.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from flaxformer_nmt import api

import cluster  # tests/cluster.py
import helpers
from multilingual_data import make_data, tiny

pytestmark = pytest.mark.xdist_group("several_processes")

TIMEOUT_S = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_compilation_cache) -> dict[str, pathlib.Path]:
  """The same tiny multilingual run as 1 process x 8 devices and as 2 x 4."""
  root = tmp_path_factory.mktemp("multilingual")
  data = make_data(root / "data")
  out = {}
  for name, processes, devices in (("one", 1, 8), ("two", 2, 4)):
    workdir = root / name
    job = cluster.launch(
      [f"--workdir={workdir}", *tiny(data)],
      processes=processes,
      devices=devices,
      log_prefix=root / name,
      cache_dir=shared_compilation_cache,
    )
    assert job.wait(TIMEOUT_S) == [0] * processes, job.log()[-4000:]
    out[name] = workdir
  out["data"] = data
  return out


def test_two_processes_train_a_multilingual_model_like_one(runs):
  one = helpers.read_metrics(runs["one"], "train")
  two = helpers.read_metrics(runs["two"], "train")
  assert [r["step"] for r in one] == list(range(1, 13))
  np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-5)
  dev_one, dev_two = (helpers.read_metrics(runs[k], "dev")[-1] for k in ("one", "two"))
  for direction in ("en-de", "de-en", "en-fr", "fr-en"):
    assert dev_one[f"dev_loss.{direction}"] == pytest.approx(dev_two[f"dev_loss.{direction}"])
  mean = np.mean([dev_one[f"dev_loss.{d}"] for d in ("en-de", "de-en", "en-fr", "fr-en")])
  assert dev_one["dev_loss"] == pytest.approx(mean)
  result = json.loads((runs["one"] / "train_result.json").read_text())
  assert sorted(result["directions"]) == ["de-en", "en-de", "en-fr", "fr-en"]
  assert list(result["zero_shot"]) == ["de-fr"]
  for figures in [*result["directions"].values(), *result["zero_shot"].values()]:
    assert figures["test_sentences"] == 12
    assert 0.0 <= figures["off_target_rate_beam2"] <= 1.0
    assert figures["reference_off_target_rate"] <= 0.25  # 12 synthetic lines: mostly right
  assert set(result["mean"]) >= {"test_sacrebleu_beam2", "off_target_rate_beam2"}
  # Each direction's hypotheses are written under their own name.
  hyps = sorted(p.name for p in (runs["one"] / "eval").glob("*beam2*.hyp.txt"))
  assert len(hyps) == 5 and any(".de-fr." in name for name in hyps)


def _main(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "main.py", *args], cwd=helpers.REPO, capture_output=True, text=True
  )


def test_target_lang_on_the_command_line_and_in_the_api(runs, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(runs["one"], workdir)
  source = tmp_path / "in.txt"
  source.write_text("a dog runs\ntwo men talk\n", encoding="utf-8")
  for args, message in (
    ([], "give --target_lang"),
    (["--target_lang=xx"], "--target_lang=xx: unknown language"),
  ):
    done = _main(f"--workdir={workdir}", "--mode=translate", f"--input={source}", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1
  out = tmp_path / "out.tsv"
  done = _main(
    f"--workdir={workdir}",
    "--mode=translate",
    f"--input={source}",
    f"--output={out}",
    "--target_lang=fr",
    "--nbest=2",
    "--alignments",
  )
  assert done.returncode == 0, done.stderr[-2000:]
  rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
  assert len(rows) == 4 and all(len(r) == 5 for r in rows)
  # The API gives the command line's best hypotheses; the tag changes the source it decodes.
  fr = api.translate(None, str(workdir), ["a dog runs", "two men talk"], target_lang="fr")
  assert fr == [rows[0][3], rows[2][3]]
  de = api.translate(None, str(workdir), ["a dog runs", "two men talk"], target_lang="de")
  hyps = api.translate_nbest(None, str(workdir), ["a dog runs"], 1, target_lang="de")
  assert hyps[0][0].text == de[0]
  # Sampling, an ensemble (the 2-process twin: the same vocabulary) and attention pictures.
  sampled = api.translate(
    api.load_run_config(str(workdir), {"decode.method": "sample"}),
    str(workdir),
    ["a dog runs"],
    target_lang="fr",
  )
  assert len(sampled) == 1
  both = api.translate(
    None, str(workdir), ["a dog runs"], ensemble=[str(runs["two"])], target_lang="fr"
  )
  assert len(both) == 1
  pictures = api.attention(
    None, str(workdir), "a dog runs", str(tmp_path / "att"), target_lang="fr"
  )
  assert (tmp_path / "att" / "cross_attention.png").is_file(), pictures
  # Eval may narrow the run's directions.
  done = _main(
    f"--workdir={workdir}",
    "--mode=eval",
    "--config.data.directions=en-fr",
    "--config.data.zero_shot=",
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert list(json.loads(done.stdout.strip().splitlines()[-1])["directions"]) == ["en-fr"]


def test_the_server_takes_target_lang(runs, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(runs["one"], workdir)
  port = cluster.free_port()
  log = tmp_path / "serve.log"
  proc = subprocess.Popen(
    [
      sys.executable,
      "main.py",
      "--mode=serve",
      f"--workdir={workdir}",
      f"--port={port}",
      "--target_lang=de",
    ],
    cwd=helpers.REPO,
    stdout=open(log, "w"),  # noqa: SIM115 (closed with the process)
    stderr=subprocess.STDOUT,
  )
  url = f"http://127.0.0.1:{port}"

  def call(body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + ("/translate" if body else "/health"), data=data)
    request.add_header("Content-Type", "application/json")
    try:
      with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
      return e.code, json.loads(e.read() or b"{}")

  try:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
      try:
        if call()[1].get("status") == "ok":
          break
      except (urllib.error.URLError, ConnectionError):
        pass
      assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
      time.sleep(0.5)
    status, body = call({"text": ["a dog runs"], "target_lang": "fr"})
    fr = api.translate(None, str(workdir), ["a dog runs"], target_lang="fr")
    assert status == 200 and body["translations"] == fr
    status, body = call({"text": ["a dog runs"]})  # --target_lang=de: the default
    assert status == 200 and body["translations"] == api.translate(
      None, str(workdir), ["a dog runs"], target_lang="de"
    )
    status, body = call({"text": "a dog runs", "target_lang": "xx"})
    assert status == 400 and "is unknown" in body["error"]
  finally:
    proc.terminate()
    proc.wait(timeout=60)


def test_the_ctranslate2_export_takes_the_tag_as_its_first_piece(runs, tmp_path):
  import ctranslate2  # pylint: disable=g-import-not-at-top  # the [export] extra, in [test]
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  workdir, out = tmp_path / "run", tmp_path / "ct2"
  shutil.copytree(runs["one"], workdir)
  done = _main(f"--workdir={workdir}", "--mode=export", f"--output={out}")
  assert done.returncode == 0, done.stderr[-2000:]
  lines = ["a dog runs", "two men talk", "the red car is fast"]
  greedy = api.load_run_config(str(workdir), {"decode.beam_size": 1})
  sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
  translator = ctranslate2.Translator(str(out), device="cpu")
  offset = greedy.decode.max_len_offset
  for target in ("de", "fr"):
    ours = api.translate(greedy, str(workdir), lines, target_lang=target)
    theirs = []
    for line in lines:
      pieces = [f"<2{target}>", *sp.encode(line, out_type=str)]  # docs/translating.md's recipe
      (result,) = translator.translate_batch(
        [pieces], beam_size=1, max_decoding_length=len(pieces) + 1 + offset
      )
      theirs.append(sp.decode(result.hypotheses[0]).strip())  # ours strips (data/tokenizer.py)
    assert theirs == ours
