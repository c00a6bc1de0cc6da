"""Reading and writing the user's text, and writing any file so that it is never half there.

One copy of each: corpora, translation inputs and outputs, hypotheses, results and caches all go
through these functions, so a bad byte is always reported as `path:line`, a line break inside a
sentence never shifts the lines after it, and a killed job never leaves a truncated file.

Records: a mode's figures go to `<mode>_result.json` and a line of `results.jsonl` (`write_result`),
training's to `*_metrics.jsonl`; a torn last line (a job killed while appending) is dropped before
the next append. And one check of a folder that holds code (`unsafe`: the compilation cache and
its saved programs): it must be this user's and writable by no one else, and every folder above
it this user's or root's and not writable by others unless sticky, as a search path for code
would be checked.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.runtime import summary

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


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


@contextlib.contextmanager
def staged_folder(output: str) -> Iterator[str]:
  """A scratch folder for a folder written whole at `output` (a model export): made beside it,
  put in place only when the block completes (an interrupted export leaves no half-written
  model), its files readable as the umask allows (some writers make theirs 0600). `output` is
  missing or an empty folder; an existing one (itself, a symbolic link to one, or `.`) receives
  the files in place: a link is never replaced by a folder, nor a folder a shell stands in."""
  target = os.path.realpath(output)
  # Beside a new folder; inside an existing empty one (a mount point, or `.` under a folder this
  # user cannot write), so the files move within one file system.
  parent = target if os.path.isdir(target) else os.path.dirname(target)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
  moved: list[str] = []
  try:
    mask = _umask()
    os.chmod(staging, 0o777 & ~mask)  # mkdtemp makes it private; a model folder is not
    yield staging
    for name in os.listdir(staging):
      if os.path.isfile(os.path.join(staging, name)):
        os.chmod(os.path.join(staging, name), 0o666 & ~mask)
    if not os.path.isdir(target):
      os.replace(staging, target)
      return
    for name in sorted(os.listdir(staging)):
      os.replace(os.path.join(staging, name), os.path.join(target, name))
      moved.append(os.path.join(target, name))
    os.rmdir(staging)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    for path in moved:
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    raise


def sha256(path: str) -> str:
  """A file's SHA-256 (hex), read in 1 MiB chunks: the one digest of a file the stages use
  (vocabularies, training data, an imported model's files)."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(1 << 20):
      digest.update(chunk)
  return digest.hexdigest()


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


def _drop_torn_tail(path: str) -> None:
  """Cuts a last line without its newline (a write killed halfway) off `path`, with a warning.

  Reads backwards from the end in blocks, so a long record file costs one seek, not a read.
  """
  with open(path, "rb+") as f:
    end = f.seek(0, os.SEEK_END)
    if end == 0:
      return
    f.seek(end - 1)
    if f.read(1) == b"\n":
      return
    position = end
    while position > 0:
      start = max(position - 65536, 0)
      f.seek(start)
      block = f.read(position - start)
      newline = block.rfind(b"\n")
      if newline >= 0:
        keep = start + newline + 1
        break
      position = start
    else:
      keep = 0
    f.truncate(keep)
  logging.warning(
    "%s ended in a torn line (%d bytes, a write cut short): dropped it before appending.",
    path,
    end - keep,
  )


def append_jsonl(path: str, record: dict[str, Any]) -> None:
  """One JSON line appended to `path` (process 0 only); a torn last line is dropped first."""
  if _process_index() != 0:
    return
  if os.path.exists(path):
    _drop_torn_tail(path)
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps(record, sort_keys=True) + "\n")


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The records of a JSON-lines file ([] if absent); a line that is not JSON (torn) is skipped."""
  if not os.path.exists(path):
    return []
  records = []
  for line in iter_lines(path):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict):
      records.append(record)
  return records


def last_record_of_step(path: str, step: int) -> dict[str, Any] | None:
  """The last record of `path` logged at `step` (a step logged twice, before and after a resume,
  counts as its later line), without its "step" field; None if there is none."""
  found = None
  for record in read_jsonl(path):
    if record.get("step") == step:
      found = {k: v for k, v in record.items() if k != "step"}
  return found


def write_result(
  result_path: str, log_path: str, result: dict[str, Any], *, echo: bool = True
) -> None:
  """Saves a mode's final figures to `result_path`, appends them with the time to `log_path`,
  then (if `echo`) prints them as one JSON line. Process 0 only.

  The file comes first: a job whose stdout is gone (a closed pipe, a dropped session) still leaves
  its result behind.
  """
  if _process_index() != 0:
    return
  line = json.dumps(result, sort_keys=True)
  write_text(result_path, line + "\n")
  append_jsonl(log_path, {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **result})
  if echo:
    print_result(result)


def read_result(result_path: str) -> dict[str, Any] | None:
  """A result file's figures, or None if it is missing or not a JSON object (torn)."""
  try:
    with open(result_path, encoding="utf-8") as f:
      found = json.load(f)
  except (OSError, ValueError):
    return None
  return found if isinstance(found, dict) else None


def print_result(result: dict[str, Any]) -> None:
  """A mode's figures as the one JSON line that ends its output (process 0 only), then their
  summary for a person on stderr (summary.py)."""
  if _process_index() == 0:
    print(json.dumps(result, sort_keys=True), flush=True)
    for line in summary.lines(result):  # for a person: stderr, so stdout still ends in the JSON
      print(line, file=sys.stderr, flush=True)


def unsafe(path: str) -> str | None:
  """Why the folder `path` may not hold code this user runs, or None if it may: it (when it
  exists) must be owned by this user and not writable by group or others; each existing folder
  above it must be owned by this user or root, and not writable by others unless sticky. A
  folder that does not exist yet is made 0700 by compile_cache.enable.

  Both the path as typed and the folder it resolves to are checked: a symbolic link's target may
  sit below a folder anyone can write (then whoever can write there chooses what is loaded), and
  the link itself below such a folder can be replaced by anyone who can write there."""
  uid = os.getuid() if hasattr(os, "getuid") else None
  if uid is None:  # no POSIX owners (Windows): nothing to check against
    return None
  typed = os.path.abspath(path)
  resolved = os.path.realpath(path)
  reason = _unsafe_chain(resolved, uid)
  if reason is not None and resolved != typed:
    return f"{reason} ({typed} leads there)"
  if reason is None and resolved != typed:
    reason = _unsafe_chain(typed, uid, parents_only=True)
  return reason


def _unsafe_chain(current: str, uid: int, *, parents_only: bool = False) -> str | None:
  """`unsafe`'s rule for one absolute path and every folder above it."""
  first = True
  while True:
    try:
      st = os.stat(current)
    except FileNotFoundError:
      st = None
    except OSError as e:
      return f"{current} cannot be checked ({e.strerror or e})"
    if st is not None and not (first and parents_only):
      if first:
        if st.st_uid != uid:
          return f"{current} belongs to uid {st.st_uid}, not to this user ({uid})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
          return f"{current} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
      else:
        if st.st_uid not in (uid, 0):
          return f"{current}, above it, belongs to uid {st.st_uid}, neither this user nor root"
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
          return (
            f"{current}, above it, is writable by others without the sticky bit "
            f"(mode {stat.S_IMODE(st.st_mode):o})"
          )
    first = False
    parent = os.path.dirname(current)
    if parent == current:
      return None
    current = parent


def _process_index() -> int:
  """This process's index in its job (JAX imported here: the data side reads files without it)."""
  import jax  # pylint: disable=g-import-not-at-top

  return jax.process_index()


def read_json_object(path: str, what: str = "an object") -> dict[str, Any]:
  """The JSON object in the file at `path` ({} if there is none); DataError naming the file if it
  is not JSON or holds something other than an object (`what` says what was expected)."""
  try:
    with open(path, encoding="utf-8") as f:
      doc = json.load(f)
  except FileNotFoundError:
    return {}
  except (OSError, ValueError) as e:
    raise errors.DataError(f"{path}: not JSON ({e}).") from None
  if not isinstance(doc, dict):
    raise errors.DataError(f"{path}: holds a JSON {type(doc).__name__}, not {what}.")
  return doc
