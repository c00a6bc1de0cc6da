"""Reading and writing the user's text, and writing any file so that it is never half there.

One copy of each: corpora, translation inputs and outputs, hypotheses, results and caches all go
through these functions, so a bad byte is always reported as `path:line`, a line break inside a
sentence never shifts the lines after it, and a killed job never leaves a truncated file.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import BinaryIO

from flaxformer_nmt import errors

STDIO = "-"
# The longest line read (1 MiB): the longest sentences of real corpora are a few kilobytes.
MAX_LINE_BYTES = 1 << 20


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
  """Yields a temporary name beside `path`; renames it to `path` only if the block succeeds."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  root, ext = os.path.splitext(path)
  tmp = f"{root}.tmp-{os.getpid()}{ext}"  # the extension kept: some writers (np.savez) add theirs
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def same_bytes(a: str, b: str) -> bool:
  """Whether two files hold the same bytes (vocabularies of two runs)."""

  def digest(path: str) -> str:
    with open(path, "rb") as f:
      return hashlib.sha256(f.read()).hexdigest()

  return digest(a) == digest(b)


def check_output_file(path: str, flag: str) -> None:
  """ConfigError, before any work, if `path` cannot become a file (`flag` names where it came
  from): a folder is there, or a file stands where its folder should be. "-" (stdout) is fine."""
  if path == STDIO:
    return
  if os.path.isdir(path):
    raise errors.ConfigError(f"{flag}={path} is a folder; name a file (or - for stdout).")
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise errors.ConfigError(f"{flag}={path}: {parent} is a file, not a folder.")


def write_text(path: str, text: str) -> None:
  """Writes `text` as UTF-8, atomically (see `atomic_path`)."""
  with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    f.write(text)


def one_line(text: str) -> str:
  """`text` with line breaks replaced by spaces: one sentence must stay one line of a file."""
  return text.replace("\r", " ").replace("\n", " ")


def write_lines(path: str, lines: Sequence[str]) -> None:
  """One UTF-8 line per item, to a file (atomically) or to stdout for "-"."""
  data = "".join(one_line(line) + "\n" for line in lines)
  if path == STDIO:
    sys.stdout.flush()
    sys.stdout.buffer.write(data.encode("utf-8"))
    sys.stdout.buffer.flush()
    return
  write_text(path, data)


def _open(path: str) -> BinaryIO:
  if path == STDIO:
    return sys.stdin.buffer
  if path.endswith(".gz"):
    return gzip.open(path, "rb")  # type: ignore[return-value]
  return open(path, "rb")


def iter_lines(path: str) -> Iterator[str]:
  """Lines of a UTF-8 text file (.gz accepted; "-" is stdin), without their line ends.

  Splits on "\\n" only: str.splitlines would also split on U+2028, U+0085 and others that occur
  inside real sentences, changing the number of lines. A byte-order mark is dropped. Errors are
  DataError naming `path:line`; so is a line longer than MAX_LINE_BYTES, which is no sentence (a
  binary file, a document without line breaks) and would otherwise be read whole into memory.
  """
  name = "<stdin>" if path == STDIO else path
  try:
    f = _open(path)
  except FileNotFoundError:
    raise errors.DataError(f"{name}: no such file.") from None
  except IsADirectoryError:
    raise errors.DataError(f"{name}: is a directory, not a text file.") from None
  with contextlib.nullcontext(f) if path == STDIO else f:
    lineno = 0
    try:
      while raw := f.readline(MAX_LINE_BYTES + 2):  # the longest line and "\r\n"
        lineno += 1
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        if len(raw) > MAX_LINE_BYTES:
          raise errors.DataError(
            f"{name}:{lineno}: line longer than {MAX_LINE_BYTES:,} bytes; expected one "
            "sentence per line (is this a text file?)."
          )
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise errors.DataError(
            f"{name}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})."
          ) from None
        yield line.removeprefix("\ufeff") if lineno == 1 else line
    except (OSError, EOFError) as e:  # a corrupt or truncated .gz, an I/O error
      raise errors.DataError(f"{name}: unreadable after line {lineno}: {e}.") from None


def read_lines(path: str) -> list[str]:
  """All lines of `path` (see `iter_lines`)."""
  return list(iter_lines(path))
