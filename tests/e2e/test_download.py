"""The real Multi30k corpus (helpers.multi30k: beside the checkout, or downloaded): `--mode=prepare`
downloads it into data.dir, verified, from an HTTP server on 127.0.0.1, and packing keeps its
padding low.

The server serves the real corpus beside the checkout (../shared/data/multi30k: byte for byte the
official files, whose checksums data/download.py records), or a copy of it with one file cut short.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from flaxformer_nmt import api
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.data import download, pipeline
from flaxformer_nmt.run.folder import Workdir

import helpers
import http_server


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_a_truncated_file_is_one_line_exit_2_and_nothing_partial(tmp_path):
  served = tmp_path / "served"
  shutil.copytree(helpers.multi30k(), served)
  (served / "train.de.gz").chmod(0o644)
  with open(served / "train.de.gz", "r+b") as f:
    f.truncate(100_000)
  server = http_server.Server(served)
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


SPLIT_FILES = sorted(
  f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in ("en", "de")
)
SMALL_VOCAB = {"data.vocab_size": 300, "data.vocab_sample_size": 2000}


@pytest.fixture
def multi30k_server() -> Iterator[http_server.Server]:
  server = http_server.Server(helpers.multi30k())
  yield server
  server.close()


def test_recorded_checksums_match_the_corpus_beside_the_checkout():
  for name in SPLIT_FILES:
    size, sha256 = download.MULTI30K_FILES[name]
    assert download.verified(str(helpers.multi30k() / name), size, sha256), name
    assert not download.verified(str(helpers.multi30k() / name), size, "0" * 64)


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
    assert (data_dir / name).read_bytes() == (helpers.multi30k() / name).read_bytes()
  assert (result["dev_sentences"], result["test_sentences"]) == (1014, 1000)
  assert result["vocab_size"] == 300 and pathlib.Path(result["vocab_path"]).is_file()
  assert json.loads((tmp_path / "w" / "prepare_result.json").read_text()) == result

  again = api.prepare(config, str(tmp_path / "w"))
  assert (again["downloaded"], again["verified_present"]) == (0, 6)
  assert len(multi30k_server.requests) == 6  # verified files were not fetched again


@pytest.mark.parametrize("devices,least", [(1, 0.9), (8, 0.87)])
def test_multi30k_non_padding_share(tmp_path, devices, least) -> None:
  """Packing keeps padding low; each device packs its own rows (64 rows on 1 device, 8 on each of
  8), and fewer rows leave more gaps: measured 91.2% / 88.3% of source slots real."""
  c = config_lib.base_config("tiny")
  c.data.update(
    dict(
      source="files",
      dir=str(helpers.multi30k()),
      test_prefix="test_2016_flickr",
      vocab_size=8000,
      vocab_sample_size=10_000,
      tokens_per_batch=4096,
      max_len=64,
    )
  )
  data = pipeline.make_data(c, Workdir(str(tmp_path)), devices, 0, 1)
  assert data.train.examples_per_epoch > 28_900
  batches = [next(data.train) for _ in range(30)]
  for side in ("inputs", "targets"):
    share = np.mean([np.mean(b[side] > 0) for b in batches])
    assert share >= least, (side, share)
  assert len(data.pairs("test")) == 1000 and len(data.pairs("dev")) == 1014
