"""The one reader and writer of users' text: lines survive exactly, bad bytes name path:line."""

from __future__ import annotations

import gzip
import io
import os
import pathlib
import sys

import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.runtime import files


def test_lines_round_trip_with_bom_crlf_and_unicode_separators(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(
    "\ufeffErste Zeile\r\n\nGrüße\u2028noch dieselbe Zeile\n東京\n  \nletzte".encode("utf-8")
  )
  lines = files.read_lines(str(path))
  assert lines == ["Erste Zeile", "", "Grüße\u2028noch dieselbe Zeile", "東京", "  ", "letzte"]
  files.write_lines(str(tmp_path / "sub" / "out.txt"), lines)
  assert files.read_lines(str(tmp_path / "sub" / "out.txt")) == lines
  assert (tmp_path / "sub" / "out.txt").read_bytes().endswith(b"letzte\n")
  # A line break inside a sentence must not shift the lines after it.
  files.write_lines(str(tmp_path / "out2.txt"), ["a\nb", "c\r\nd", "e"])
  assert files.read_lines(str(tmp_path / "out2.txt")) == ["a b", "c  d", "e"]


def test_gzip_is_read_like_plain_text(tmp_path):
  with gzip.open(tmp_path / "x.en.gz", "wt", encoding="utf-8") as f:
    f.write("eins\nzwei\n")
  assert files.read_lines(str(tmp_path / "x.en.gz")) == ["eins", "zwei"]
  whole = gzip.compress("".join(f"Zeile {i}\n" for i in range(5000)).encode())
  (tmp_path / "broken.gz").write_bytes(whole[: len(whole) // 2])  # a download cut short
  with pytest.raises(errors.DataError, match=r"broken\.gz: unreadable after line"):
    files.read_lines(str(tmp_path / "broken.gz"))


@pytest.mark.parametrize(
  "content,match",
  [
    (b"ok\n\xff\xfe broken\n", r"bad\.txt:2: invalid UTF-8 \(byte 0xff at column 1\)"),
    (b"ok\nfine\nab\xc3(\n", r"bad\.txt:3: invalid UTF-8 \(byte 0xc3 at column 3\)"),
  ],
)
def test_bad_utf8_names_file_line_and_column(tmp_path, content, match):
  path = tmp_path / "bad.txt"
  path.write_bytes(content)
  with pytest.raises(errors.DataError, match=match) as info:
    files.read_lines(str(path))
  assert "\n" not in str(info.value)


def test_an_over_long_line_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
  monkeypatch.setattr(files, "MAX_LINE_BYTES", 64)
  path = tmp_path / "doc.txt"
  path.write_bytes(b"short\n" + b"x" * 64 + b"\r\n" + b"y" * 65 + b"\nshort\n")
  lines = files.iter_lines(str(path))
  assert next(lines) == "short" and next(lines) == "x" * 64  # exactly the limit is fine
  with pytest.raises(errors.DataError, match=r"doc\.txt:3: line longer than 64 bytes"):
    next(lines)


def test_missing_file_and_directory(tmp_path):
  with pytest.raises(errors.DataError, match=r"nothere\.txt: no such file"):
    files.read_lines(str(tmp_path / "nothere.txt"))
  with pytest.raises(errors.DataError, match="is a directory"):
    files.read_lines(str(tmp_path))


def test_stdin_and_stdout(monkeypatch):
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("ä\n\nb\n".encode())))
  assert files.read_lines("-") == ["ä", "", "b"]
  out = io.BytesIO()
  monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out))
  files.write_lines("-", ["ö", "", "東京"])
  assert out.getvalue().decode("utf-8") == "ö\n\n東京\n"


def test_a_failed_write_leaves_the_old_file_whole(tmp_path):
  path = tmp_path / "result.json"
  files.write_text(str(path), "old")
  with pytest.raises(RuntimeError):
    with files.atomic_path(str(path)) as tmp:
      with open(tmp, "w") as f:
        f.write("half of the new")
      raise RuntimeError("killed while writing")
  assert path.read_text() == "old"
  assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary left behind


def test_a_torn_last_record_is_dropped_before_the_next_is_appended(tmp_path, caplog):
  """A kill mid-write leaves a record file ending in half a line. The next append drops it first
  (at 97ad9e1 it was glued to the new record, and both were lost to every reader, the best
  checkpoint's replay of dev_metrics.jsonl included); readers skip a torn line meanwhile."""
  path = tmp_path / "dev_metrics.jsonl"
  path.write_text('{"step": 100, "dev_bleu": 20.0}\n{"step": 200, "dev_b')
  assert files.read_jsonl(str(path)) == [{"step": 100, "dev_bleu": 20.0}]
  with caplog.at_level("WARNING"):
    files.append_jsonl(str(path), {"step": 200, "dev_bleu": 25.0})
  assert "torn line" in caplog.text
  assert files.read_jsonl(str(path)) == [
    {"step": 100, "dev_bleu": 20.0},
    {"step": 200, "dev_bleu": 25.0},
  ]
  assert path.read_text().endswith("}\n")
  # A file whose only line is torn, and a whole file, are appended to as they should be.
  path.write_text('{"step": 1')
  files.append_jsonl(str(path), {"step": 2})
  assert path.read_text() == '{"step": 2}\n'
  files.append_jsonl(str(path), {"step": 3})
  assert [r["step"] for r in files.read_jsonl(str(path))] == [2, 3]
  assert files.last_record_of_step(str(path), 3) == {}
  assert files.last_record_of_step(str(path), 4) is None


def test_an_output_file_is_checked_before_any_work(tmp_path):
  files.check_output_file("-", "--output")
  files.check_output_file(str(tmp_path / "new" / "dir" / "out.txt"), "--output")  # made later
  with pytest.raises(errors.ConfigError, match="is a folder; name a file"):
    files.check_output_file(str(tmp_path), "--output")
  (tmp_path / "notes").write_text("x")
  with pytest.raises(errors.ConfigError, match="notes is a file, not a folder"):
    files.check_output_file(str(tmp_path / "notes" / "out.txt"), "--output")


@pytest.mark.parametrize("where", ["missing", "empty", "link_to_empty", "dot"])
def test_a_staged_folder_lands_at_a_link_or_the_current_folder(tmp_path, monkeypatch, where):
  """Issue 60, defects 5 and 6: --mode=export --output=<a link to an empty folder> and
  --output=. in an empty folder ended in tracebacks after converting (the link or the current
  folder could not be removed to rename the model into place), and model.safetensors was written
  0600 where the other files are 0644. The files land in the folder the link or `.` names."""
  real = tmp_path / "real"
  output = str(real)
  if where != "missing":
    real.mkdir()
  if where == "link_to_empty":
    (tmp_path / "link").symlink_to(real)
    output = str(tmp_path / "link")
  elif where == "dot":
    monkeypatch.chdir(real)
    output = "."
  os.umask(0o022)
  with files.staged_folder(output) as staging:
    with open(os.path.join(staging, "model.safetensors"), "w") as f:
      f.write("weights")
    os.chmod(os.path.join(staging, "model.safetensors"), 0o600)  # as safetensors leaves it
    (pathlib.Path(staging) / "config.json").write_text("{}")
  assert sorted(os.listdir(real)) == ["config.json", "model.safetensors"]
  assert (real / "model.safetensors").stat().st_mode & 0o777 == 0o644
  assert real.stat().st_mode & 0o777 == 0o755
  if where == "link_to_empty":
    assert (tmp_path / "link").is_symlink()
  assert [n for n in os.listdir(tmp_path) if n.startswith(".export-")] == []


def test_a_staged_folder_that_fails_leaves_nothing(tmp_path):
  (tmp_path / "out").mkdir()
  with pytest.raises(RuntimeError), files.staged_folder(str(tmp_path / "out")) as staging:
    (pathlib.Path(staging) / "half").write_text("x")
    raise RuntimeError("interrupted")
  assert os.listdir(tmp_path / "out") == [] and os.listdir(tmp_path) == ["out"]
