"""`--mode=prepare` downloads Multi30k into data.dir, verified, from an HTTP server on 127.0.0.1.

The server serves the real corpus beside the checkout (../shared/data/multi30k: byte for byte the
official files, whose checksums data/download.py records), or a copy of it with one file cut short.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest

from flaxformer_nmt import api, errors
from flaxformer_nmt.data import download

import helpers
import http_server

SPLIT_FILES = sorted(
  f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("en", "de")
)


SMALL_VOCAB = {"data.vocab_size": 300, "data.vocab_sample_size": 2000}


@pytest.fixture
def multi30k_server() -> Iterator[http_server.Server]:
  assert (helpers.MULTI30K / "train.en.gz").is_file(), f"no Multi30k at {helpers.MULTI30K}"
  server = http_server.Server(helpers.MULTI30K)
  yield server
  server.close()


def test_recorded_checksums_match_the_corpus_beside_the_checkout():
  for name in SPLIT_FILES:
    size, sha256 = download.MULTI30K_FILES[name]
    assert download.verified(str(helpers.MULTI30K / name), size, sha256), name
    assert not download.verified(str(helpers.MULTI30K / name), size, "0" * 64)


def test_wanted_files_follow_the_languages_and_the_extra_test_sets():
  config = api.load_config("multi30k")
  assert sorted(download.wanted_files(config.data)) == SPLIT_FILES
  config.data.extra_test_sets = "all"
  extra = set(download.wanted_files(config.data)) - set(SPLIT_FILES)
  assert extra == {
    f"{s}.{lang}.gz" for s in download.MULTI30K_EXTRA_TEST_SETS for lang in "en de".split()
  }
  config.data.extra_test_sets = "test_2019"
  with pytest.raises(errors.ConfigError, match="extra_test_sets names 'test_2019'"):
    download.wanted_files(config.data)
  config = api.load_config("multi30k", {"data.tgt_lang": "cs", "data.extra_test_sets": "all"})
  with pytest.raises(errors.ConfigError, match="no file test_2017_flickr.cs.gz"):
    download.wanted_files(config.data)


def test_prepare_downloads_verifies_trains_the_vocabulary_and_does_not_fetch_again(
  tmp_path, multi30k_server
):
  data_dir = tmp_path / "data" / "multi30k"
  config = api.load_config(
    "multi30k", {"data.url": multi30k_server.url, "data.dir": str(data_dir), **SMALL_VOCAB}
  )
  result = api.prepare(config, str(tmp_path / "w"))
  assert (result["downloaded"], result["verified_present"]) == (6, 0)
  assert sorted(multi30k_server.requests) == SPLIT_FILES
  assert sorted(p.name for p in data_dir.iterdir()) == SPLIT_FILES  # nothing partial beside them
  for name in SPLIT_FILES:
    assert (data_dir / name).read_bytes() == (helpers.MULTI30K / name).read_bytes()
  assert (result["dev_sentences"], result["test_sentences"]) == (1014, 1000)
  assert result["vocab_size"] == 300 and pathlib.Path(result["vocab_path"]).is_file()
  assert json.loads((tmp_path / "w" / "prepare_result.json").read_text()) == result

  again = api.prepare(config, str(tmp_path / "w"))
  assert (again["downloaded"], again["verified_present"]) == (0, 6)
  assert len(multi30k_server.requests) == 6  # verified files were not fetched again
