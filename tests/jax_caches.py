"""The tests' JAX compilation caches: one per package stack, kept between test runs.

Compiling is most of a test's time (the tiny model's programs take longer to compile than to run),
and the same programs are compiled by every run of the tests. So the cache is not the session's:
it lives outside the checkout, in a folder named by everything that decides whether an entry is
reusable by this stack: Python's version, jax's and jaxlib's, and XLA_FLAGS (the unit tier alone
compiles at -O0; the processes tests start have 2, 4 or 8 devices). JAX's own cache key covers the
program, the devices and the options as well, so a stale entry is never loaded: it only takes room.
`prune` caps each folder at MAX_BYTES, least recently used out, once per test run (JAX's own cap,
JAX_COMPILATION_CACHE_MAX_SIZE, lists the whole folder at every write: slower with every run).

Where (first that applies):
  FLAXFORMER_NMT_TEST_CACHE=cold   an empty folder inside the session's temporary folder: a cold
                                   run, as a new machine gets;
  FLAXFORMER_NMT_TEST_CACHE=DIR    under DIR (benchmarks/test_times.py: a new, empty DIR);
  otherwise                        under $XDG_CACHE_HOME/flaxformer_nmt/tests (~/.cache/...).
Deleting the folder gives a cold run too. Nothing here imports jax: conftest.py calls it before
JAX is imported.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pathlib
import re
import sys
import time

ENV = "FLAXFORMER_NMT_TEST_CACHE"
COLD = "cold"
MAX_BYTES = 3 << 30  # 3 GiB: a test run writes a few hundred MB of tiny-model programs
_STACK = re.compile(r"py\d+\.\d+-jax.+-jaxlib.+-xla[0-9a-f]{8}")  # stack_key's names
_ENTRY_SUFFIXES = ("-cache", "-atime")  # JAX's entry files (jax/_src/lru_cache.py)


def _version(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return "none"


def session_of(tmp_path_factory) -> pathlib.Path:
  """The test session's temporary folder, shared by its xdist workers (a cold run's caches go
  there)."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def stack_key(xla_flags: str) -> str:
  """The folder name of the stack that runs with `xla_flags`: python, jax, jaxlib and a digest of
  the flags, e.g. `py3.11-jax0.10.2-jaxlib0.10.2-xla1c9e0a2b`."""
  flags = " ".join(sorted(xla_flags.split()))
  digest = hashlib.sha256(flags.encode()).hexdigest()[:8]
  python = f"{sys.version_info.major}.{sys.version_info.minor}"
  return f"py{python}-jax{_version('jax')}-jaxlib{_version('jaxlib')}-xla{digest}"


def root(session_tmp: pathlib.Path | None = None) -> pathlib.Path:
  """The folder every stack's cache sits in (module docstring); `session_tmp` is where a cold
  run's empty folder goes (made there by the session, removed with it)."""
  setting = os.environ.get(ENV, "")
  if setting == COLD:
    if session_tmp is None:
      raise ValueError(f"{ENV}=cold needs the session's temporary folder")
    return session_tmp / "cold_jax_caches"
  if setting:
    return pathlib.Path(setting).expanduser().absolute()
  base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
  return pathlib.Path(base, "flaxformer_nmt", "tests")


def folder(xla_flags: str, session_tmp: pathlib.Path | None = None) -> pathlib.Path:
  """The cache of the stack running with `xla_flags`, made private (0700) if new. Only this user
  writes it: JAX loads what it holds as code."""
  path = root(session_tmp) / stack_key(xla_flags)
  path.mkdir(mode=0o700, parents=True, exist_ok=True)
  return path


def environment(xla_flags: str, session_tmp: pathlib.Path | None = None) -> dict[str, str]:
  """The variables that point a JAX process running with `xla_flags` at its stack's cache: every
  program cached, however quick to compile (the tiny model's compile in well under a second)."""
  return {
    "JAX_COMPILATION_CACHE_DIR": str(folder(xla_flags, session_tmp)),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
  }


def prune(max_bytes: int = MAX_BYTES, max_idle_days: float = 30.0) -> int:
  """Caps every stack's cache: deletes the least recently used entries until each holds at most
  `max_bytes` (3/4 of it once it has to prune), empty entries (a process killed as it began to
  write one: JAX would read it, warn and never replace it), and whole stacks unused for
  `max_idle_days` (an old jax's). Touches only stack folders and JAX's entry files in them.
  Returns the number of files deleted. An entry in use by another run is at worst compiled again."""
  deleted = 0
  top = root()
  if not top.is_dir():
    return 0
  for stack in top.iterdir():
    if not (stack.is_dir() and _STACK.fullmatch(stack.name)):
      continue
    entries = []
    for path in stack.iterdir():
      if not path.name.endswith(_ENTRY_SUFFIXES) or not path.is_file():
        continue
      try:
        st = path.stat()
      except OSError:
        continue
      entries.append((max(st.st_atime, st.st_mtime), st.st_size, path))
    newest = max((used for used, _, _ in entries), default=0.0)
    idle = entries and time.time() - newest > max_idle_days * 86400
    total = sum(size for _, size, _ in entries)
    over = total > max_bytes
    for _, size, path in sorted(entries):  # least recently used first
      if not (idle or size == 0 or (over and total > max_bytes * 3 // 4)):
        continue
      path.unlink(missing_ok=True)
      total -= size
      deleted += 1
  return deleted
