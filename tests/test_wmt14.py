"""WMT14 beyond the README's EN-DE base recipe (which `tests/test_readme.py` runs on the mock
WMT14): EN-FR's BLEU, prepare without TensorFlow, prepare's build request and its refusals.

TFDS's WMT14 cannot be downloaded here, so `tests/mock_wmt14_main.py` runs main.py inside
`tfds.testing.mock_data` with a small corpus served under the real builder and split names. The
configs are the real ones, made tiny by command-line overrides of the model size, vocabulary and
step counts only.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import tensorflow_datasets as tfds

from flaxformer_nmt import errors
from flaxformer_nmt.data import demo, prepare, sources
from flaxformer_nmt.workdir import Workdir

from helpers import REPO, SMALL_MODEL_FLAGS, demo_config  # isort: skip


def _mock_main(config: str, workdir: pathlib.Path, *args: str):
  import subprocess  # pylint: disable=g-import-not-at-top

  return subprocess.run(
    [sys.executable, "tests/mock_wmt14_main.py", f"--config={config}", f"--workdir={workdir}"]
    + SMALL_MODEL_FLAGS
    + list(args),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )


def _last_json(proc) -> dict:
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_wmt14_enfr_big_tokenized_bleu_has_no_compound_split(tmp_path):
  work = tmp_path / "enfr"
  config = "configs/wmt14_enfr_big.py"
  assert _last_json(_mock_main(config, work, "--mode=prepare"))["dataset"] == (
    "wmt14_translate/fr-en"
  )
  trained = _last_json(_mock_main(config, work, "--config.num_train_steps=10"))
  assert trained["test_set"] == "newstest2014"
  assert trained["tokenized_bleu_method"] == "moses-fr"  # no ##AT##: that is t2t's EN-DE step


@pytest.mark.slow
def test_prepare_without_tensorflow_is_one_line_naming_the_extra(tmp_path):
  """TensorFlow made unimportable (as in a fresh install without the extra): exit 2, one line,
  nothing written."""
  import subprocess  # pylint: disable=g-import-not-at-top

  work = tmp_path / "run"
  proc = subprocess.run(
    [
      sys.executable,
      "tests/without_tensorflow_main.py",
      "--config=configs/wmt14_ende_base.py",
      f"--workdir={work}",
      "--mode=prepare",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors_ = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors_) == 1, proc.stderr[-2000:]
  assert 'pip install -e ".[prepare]"' in errors_[0]
  assert "wmt14_translate/de-en" in errors_[0] and "TensorFlow" in errors_[0]
  assert "Traceback" not in proc.stderr
  assert not work.exists()


def test_prepare_builds_array_record_then_checks_the_splits(tmp_path, monkeypatch):
  """The build is asked for array_record (read later without TensorFlow), then dev and test are
  read and the vocabulary trained."""
  calls = []

  def download_and_prepare(builder, **kwargs):
    calls.append((builder.name, str(builder.data_dir), kwargs))

  def as_data_source(builder, split, **kwargs):
    del builder, kwargs
    pairs = demo.make_demo_split(str(split).replace("validation", "dev"), 20, 0)
    return [{"de": t.encode(), "en": s.encode()} for s, t in pairs]

  c = demo_config()
  c.data.source = "tfds"
  c.data.tfds_name = "wmt14_translate/de-en"
  c.data.tfds_data_dir = str(tmp_path / "tfds")
  c.data.vocab_size = 100
  monkeypatch.setattr(prepare, "require_tensorflow", lambda dataset: None)
  with tfds.testing.mock_data(as_data_source_fn=as_data_source):
    builder_cls = sources.import_tfds().builder_cls("wmt14_translate")
    monkeypatch.setattr(builder_cls, "is_prepared", lambda self: False)
    monkeypatch.setattr(builder_cls, "download_and_prepare", download_and_prepare)
    result = prepare.prepare(c, Workdir(str(tmp_path / "run")), process_count=1)
  assert len(calls) == 1
  name, data_dir, kwargs = calls[0]
  assert name == "wmt14_translate" and kwargs == {"file_format": "array_record"}
  del data_dir  # TFDS's mock points every builder at its own metadata directory
  assert (result["dev_set"], result["test_set"]) == ("newstest2013", "newstest2014")
  assert result["test_sentences"] == 20 and (tmp_path / "run" / "spm.model").is_file()


def test_prepare_refuses_several_processes_and_bad_names(tmp_path):
  c = demo_config()
  c.data.source = "tfds"
  with pytest.raises(errors.ConfigError, match="run it once, on one host"):
    prepare.prepare(c, Workdir(str(tmp_path)), process_count=2)
  c.data.tfds_name = "wmt14_translate/xx-en"
  with pytest.raises(errors.DataError, match="unknown config 'xx-en'"):
    prepare.prepare(
      c, Workdir(str(tmp_path)), process_count=1
    )  # before TensorFlow is even looked for
