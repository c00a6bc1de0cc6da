"""WMT14's prepare in process on a mock TFDS builder: array_record files and split checks, and its
refusals. tests/e2e/test_wmt14.py runs main.py on the mock WMT14."""

from __future__ import annotations

import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.data import demo, prepare, sources
from flaxformer_nmt.run.folder import Workdir

from helpers import demo_config  # isort: skip


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
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (not at collection)

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
