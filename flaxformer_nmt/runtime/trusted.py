"""Whether a folder may hold code this user runs: the compilation cache and its saved programs.

JAX loads its cache entries, and runtime/executables.py its saved programs, as code. Such a
folder is checked as a search path for code would be: anyone who can write it, or rename a folder
above it, could make this user run their code.
"""

from __future__ import annotations

import os
import stat


def unsafe(path: str) -> str | None:
  """Why the folder `path` may not hold code this user runs, or None if it may: it (when it
  exists) must be owned by this user and not writable by group or others; each existing folder
  above it must be owned by this user or root, and not writable by others unless sticky. A
  folder that does not exist yet is made 0700 by compile_cache.enable."""
  uid = os.getuid() if hasattr(os, "getuid") else None
  if uid is None:  # no POSIX owners (Windows): nothing to check against
    return None
  current = os.path.abspath(path)
  first = True
  while True:
    try:
      st = os.stat(current)
    except FileNotFoundError:
      st = None
    except OSError as e:
      return f"{current} cannot be checked ({e.strerror or e})"
    if st is not None:
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
