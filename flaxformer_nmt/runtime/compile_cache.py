"""JAX's persistent compilation cache: a second command on the same model starts warm.

Every command compiles its programs (the train step, each decoding shape); on two CPU cores that
is most of a short command's time (translating two lines: ~15 s, almost all compiling), and a
server compiles 56 batch shapes. With the cache on, a compiled program is written to disk and the
next command that needs the same program on the same JAX and hardware reads it back.

`config.compile_cache`:
  "auto"  (default) JAX's own setting if one is made (JAX_COMPILATION_CACHE_DIR), else a private
          folder of this user's: $FLAXFORMER_NMT_COMPILE_CACHE if set, else
          $XDG_CACHE_HOME/flaxformer_nmt/jax (default ~/.cache/flaxformer_nmt/jax), made 0700;
  "off"   no cache;
  a path  that folder (made 0700 if it does not exist).
The cache holds executable code that JAX loads and runs as it is (JAX documents it as trusted
input), hence a folder only this user can write, checked like code on a search path (`unsafe`):
the folder must be this user's and writable by no one else, and every folder above it this
user's or root's and not writable by others unless sticky (as /tmp is). A folder that fails is
not used, whoever named it (config.compile_cache, $FLAXFORMER_NMT_COMPILE_CACHE or JAX's own
JAX_COMPILATION_CACHE_DIR): one warning line names the folder and why, and the command compiles
without a cache (docs/runs.md). A folder of ours is capped at MAX_BYTES (JAX evicts
the least recently used entries); an adopted one keeps JAX's own cap setting.
Clearing it is deleting the folder: `rm -rf ~/.cache/flaxformer_nmt/jax`.
"""

from __future__ import annotations

import os

from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.runtime import executables
from flaxformer_nmt.runtime.files import unsafe

ENV = "FLAXFORMER_NMT_COMPILE_CACHE"
MAX_BYTES = 4 << 30  # 4 GiB: thousands of a CPU run's programs, dozens of a big model's

_enabled: str | None = None
_refused: set[str] = set()  # folders refused by this process (warned about once)


def default_dir() -> str:
  """The cache folder "auto" means (module docstring)."""
  if os.environ.get(ENV):
    return os.environ[ENV]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "flaxformer_nmt", "jax")


def folder(setting: str) -> str | None:
  """The folder `config.compile_cache=setting` names; None for "off"."""
  if setting == "off":
    return None
  return default_dir() if setting in ("", "auto") else setting


def named_by(setting: str, path: str, adopted: bool = False) -> str:
  """Who named the cache folder `path`, as the user set it: the config field, our environment
  variable, or JAX's own (a warning names what the user can change)."""
  if adopted:
    return f"JAX_COMPILATION_CACHE_DIR={path}"
  if setting in ("", "auto") and os.environ.get(ENV):
    return f"${ENV}={path}"
  return f"config.compile_cache={setting}"


def _off(jax_module) -> None:
  jax_module.config.update("jax_enable_compilation_cache", False)
  jax_module.config.update("jax_compilation_cache_dir", None)


def enable(setting: str) -> str | None:
  """Turns the cache on in `folder(setting)` (once per process; later calls with another folder
  are ignored, as JAX reads the setting once). Returns the folder, or None when it is off or
  cannot be made (then one warning line: a cache is never worth failing a command for)."""
  global _enabled
  import jax  # pylint: disable=g-import-not-at-top

  path = folder(setting)
  if path is None:
    _off(jax)
    executables.enable(None)
    return None
  if _enabled is not None:
    return _enabled
  adopted = bool(jax.config.jax_compilation_cache_dir and setting in ("", "auto"))
  if adopted:
    # Set already, by JAX_COMPILATION_CACHE_DIR or the program embedding us: theirs is kept, with
    # its size cap (JAX_COMPILATION_CACHE_MAX_SIZE; JAX's default is none). A cap makes JAX list
    # the whole folder at every write, which whoever owns the folder may have chosen against.
    path = jax.config.jax_compilation_cache_dir
  reason = unsafe(path)
  if reason is None and os.path.exists(path) and not os.path.isdir(path):
    reason = f"{path} is a file, not a folder"
  if reason is None:
    try:
      os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
      reason = f"cannot make {path} ({e.strerror or e})"
    else:
      reason = unsafe(path)  # made now, or made by someone else meanwhile
  if reason is not None:
    if path not in _refused:  # once per folder: every Components asks again
      _refused.add(path)
      logging.warning(
        "Compilation cache not used (%s): %s; compiling without it.",
        named_by(setting, path, adopted),
        reason,
      )
    _off(jax)
    executables.enable(None)
    return None
  if not os.access(path, os.W_OK):
    logging.warning(
      "%s: %s is not writable; compiling without a cache.", named_by(setting, path, adopted), path
    )
    return None
  if not adopted:
    # The folder the checks passed, not a link to it that could be pointed elsewhere after them.
    path = os.path.realpath(path)
  jax.config.update("jax_enable_compilation_cache", True)  # a refused folder earlier turned it off
  jax.config.update("jax_compilation_cache_dir", path)
  # Every program, however quick to compile: a CPU run's are small, and many.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  options = [("jax_persistent_cache_min_entry_size_bytes", 0)]
  if not adopted:
    options.append(("jax_compilation_cache_max_size", MAX_BYTES))
  for name, value in options:
    try:
      jax.config.update(name, value)
    except AttributeError:  # an older JAX without the option: its default stands
      logging.info("This JAX has no %s; its default stands.", name)
  _enabled = path
  executables.enable(path)
  logging.info("Compilation cache: %s (config.compile_cache=%s).", path, setting)
  return path


def check(setting: str) -> None:
  """ConfigError for a config.compile_cache value that names a file, not a folder. Only a path
  the field itself names: "auto"'s folder (from $FLAXFORMER_NMT_COMPILE_CACHE or the default)
  that is unusable only warns when the cache is enabled, as JAX_COMPILATION_CACHE_DIR's does, so
  no command fails over a cache and no error names a field the user never set."""
  if setting in ("", "auto", "off"):
    return
  path = folder(setting)
  if path is not None and os.path.exists(path) and not os.path.isdir(path):
    raise errors.ConfigError(f"config.compile_cache={setting}: {path} is a file, not a folder.")
