"""`--mode=prepare` downloads Multi30k into data.dir, verified, from an HTTP server on 127.0.0.1.

The server serves the real corpus beside the checkout (../shared/data/multi30k: byte for byte the
official files, whose checksums data/download.py records), or a copy of it with one file cut short.
"""

from __future__ import annotations

import shutil
import socket

import helpers
import http_server


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_a_truncated_file_is_one_line_exit_2_and_nothing_partial(tmp_path):
  served = tmp_path / "served"
  shutil.copytree(helpers.MULTI30K, served)
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
