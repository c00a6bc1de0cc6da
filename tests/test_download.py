"""`--mode=prepare` downloads Multi30k into data.dir, verified, from an HTTP server on 127.0.0.1.

The server serves the real corpus beside the checkout (../shared/data/multi30k: byte for byte the
official files, whose checksums data/download.py records), or a copy of it with one file cut short.
"""

from __future__ import annotations

import functools
import http.server
import json
import pathlib
import shutil
import socket
import threading
from collections.abc import Iterator

import pytest

from flaxformer_nmt import api, errors
from flaxformer_nmt.data import download

import helpers

SPLIT_FILES = sorted(
  f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("en", "de")
)
# A small vocabulary: the download, not SentencePiece, is under test.
SMALL_VOCAB = {"data.vocab_size": 300, "data.vocab_sample_size": 2000}


class Server:
  """A threaded HTTP server on 127.0.0.1 over `directory`, counting the files it was asked for."""

  def __init__(self, directory: pathlib.Path) -> None:
    self.requests: list[str] = []
    server = self

    class Handler(http.server.SimpleHTTPRequestHandler):
      def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server.requests.append(self.path.lstrip("/"))
        super().do_GET()

      def log_message(self, *args: object) -> None:
        pass

    handler = functools.partial(Handler, directory=str(directory))
    self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/"
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
    self._thread.start()

  def close(self) -> None:
    self._httpd.shutdown()
    self._httpd.server_close()


@pytest.fixture
def multi30k_server() -> Iterator[Server]:
  assert (helpers.MULTI30K / "train.en.gz").is_file(), f"no Multi30k at {helpers.MULTI30K}"
  server = Server(helpers.MULTI30K)
  yield server
  server.close()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


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


@pytest.mark.slow
def test_a_truncated_file_is_one_line_exit_2_and_nothing_partial(tmp_path):
  served = tmp_path / "served"
  shutil.copytree(helpers.MULTI30K, served)
  (served / "train.de.gz").chmod(0o644)
  with open(served / "train.de.gz", "r+b") as f:
    f.truncate(100_000)
  server = Server(served)
  data_dir = tmp_path / "data"
  try:
    proc = helpers.run_main(
      "--config=configs/multi30k.py",
      f"--workdir={tmp_path / 'w'}",
      "--mode=prepare",
      f"--config.data.url={server.url}",
      f"--config.data.dir={data_dir}",
    )
  finally:
    server.close()
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert (
    lines[-1].startswith("error: train.de.gz from ") and f"{server.url}train.de.gz" in lines[-1]
  )
  assert "does not verify (100000 bytes, expected 637044" in lines[-1]
  assert not any(line.startswith("Traceback") for line in lines)
  # train.en.gz (fetched before) verified and kept; no trace of train.de.gz, no temporary file.
  assert sorted(p.name for p in data_dir.iterdir()) == ["train.en.gz"]
  assert not (tmp_path / "w" / "spm.model").exists()


@pytest.mark.slow
def test_a_server_that_is_down_is_one_line_exit_2(tmp_path):
  url = f"http://127.0.0.1:{_free_port()}/"
  proc = helpers.run_main(
    "--config=configs/multi30k.py",
    f"--workdir={tmp_path / 'w'}",
    "--mode=prepare",
    f"--config.data.url={url}",
    f"--config.data.dir={tmp_path / 'data'}",
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: Downloading train.en.gz from {url}train.en.gz failed: ")
  assert "refused" in last.lower()
  assert list((tmp_path / "data").iterdir()) == []
