"""Which Multi30k files `--mode=prepare` fetches. The download itself, from the real corpus served
on 127.0.0.1, is tested in tests/e2e/test_download.py: the unit tier needs nothing outside the
checkout."""

from __future__ import annotations

import pytest

from flaxformer_nmt import api, errors
from flaxformer_nmt.data import download

SPLIT_FILES = sorted(
  f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("en", "de")
)


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


def test_a_multilingual_config_fetches_every_language():
  config = api.load_config("multi30k_multilingual")
  want = {
    f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in "en de fr cs".split()
  }
  assert set(download.wanted_files(config.data)) == want
