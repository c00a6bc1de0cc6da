"""Compiled decoding programs kept on disk: a second command skips tracing as well as compiling.

JAX's persistent compilation cache (compile_cache.py) saves the compile, but every command still
traces and lowers each program to find its cache key: on a CPU that is about a second per
decoding shape, more than the compile it saves for the demo's model, and a server traces 56
shapes. Here a decoder's compiled program is serialized with `jax.experimental.serialize_executable`
into `<compile cache>/executables/`, keyed by everything that decides it (below); a later command
with the same key loads it and runs it without tracing.

The key: the caller's name for the function and its static settings (the model config and the
search settings), each argument's shape, dtype and placement, this package's source (every .py
file), the versions of jax, jaxlib and flax, the devices, XLA_FLAGS and the JAX options that
change a program. Anything else a program depends on is an argument. A file that cannot be read
or loaded is ignored (compiled anew and rewritten): the store only ever saves time. Programs are
loaded as the user's own code, from the user's 0700 cache folder, as JAX's cache is. Single-
process runs only: a multi-process program's placement spans other hosts.

The folder is capped at MAX_BYTES, least recently used first out. Clearing the compile cache's
folder clears it too.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import pickle
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging

from flaxformer_nmt.runtime import files

SUBFOLDER = "executables"
MAX_BYTES = 1 << 30  # 1 GiB: a demo program is ~1 MB, a big model's decoder tens of MB
_SUFFIX = ".pickle"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_folder: str | None = None


def enable(cache_folder: str | None) -> None:
  """Keeps programs under `cache_folder` (the compilation cache's), or nowhere when None."""
  global _folder
  _folder = os.path.join(cache_folder, SUBFOLDER) if cache_folder else None


def folder() -> str | None:
  return _folder


@functools.lru_cache(maxsize=1)
def _environment() -> str:
  """What every key shares: source, versions, devices, flags."""
  import flax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top

  source = hashlib.sha256()
  for root, dirs, names in os.walk(_PACKAGE):
    dirs.sort()
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(root, name)
        source.update(os.path.relpath(path, _PACKAGE).encode())
        with open(path, "rb") as f:
          source.update(f.read())
  options = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_threefry_partitionable",
    "jax_default_prng_impl",
    "jax_optimization_level",
    "jax_exec_time_optimization_effort",
    "jax_memory_fitting_effort",
    "jax_use_shardy_partitioner",
  )
  devices = jax.devices()
  try:
    platform_version = devices[0].client.platform_version  # CUDA, driver, cuDNN; libtpu
  except AttributeError:
    platform_version = ""
  plugins = []
  for dist in ("jax-cuda12-plugin", "jax-cuda12-pjrt", "libtpu", "jax-rocm-plugin"):
    try:
      plugins.append((dist, importlib.metadata.version(dist)))
    except importlib.metadata.PackageNotFoundError:
      pass
  return repr(
    (
      source.hexdigest(),
      jax.__version__,
      getattr(jaxlib, "__version__", ""),
      flax.__version__,
      platform_version,
      plugins,
      [(d.platform, d.device_kind, d.id) for d in devices],
      os.environ.get("XLA_FLAGS", ""),
      os.environ.get("LIBTPU_INIT_ARGS", ""),
      [(name, getattr(jax.config, name, None)) for name in options],
    )
  )


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
  """The arguments' tree, and each leaf's shape, dtype, kind and placement."""
  leaves, tree = jax.tree.flatten(args)

  def leaf(x: Any) -> tuple[Any, ...]:
    sharding = getattr(x, "sharding", None)
    dtype = getattr(x, "dtype", None)
    dtype = str(dtype) if dtype is not None else str(np.result_type(x))
    return (np.shape(x), dtype, type(x).__name__, str(sharding))

  return (str(tree), tuple(leaf(x) for x in leaves))


class Program:
  """`fn` (a `jax.pmap`-ed or jitted function) run from compiled programs: in memory per argument
  signature, loaded from the store, or compiled (`lower(...).compile()`) and saved. Falls back to
  calling `fn` where compiling ahead fails, runs span several processes, or JAX is told not to
  compile (jax_disable_jit) or to check every value (jax_debug_nans, jax_debug_infs).

  A program saved must come from the compiler itself: XLA:CPU serializes a program that JAX's
  persistent cache handed back without its code, and it then fails to run ("Function ... not
  found"). So these programs are kept out of JAX's cache (never written there), and one that JAX's
  cache supplied anyway (written by an older version) is used but not saved. A loaded program is
  also checked by its first run; one that fails is deleted and compiled again."""

  def __init__(self, fn: Callable[..., Any], name: str) -> None:
    self._fn = fn
    self._name = name
    self._compiled: dict[tuple[Any, ...], Any] = {}
    self._unproven: set[tuple[Any, ...]] = set()  # loaded, not yet run
    # Called as it is at least once: its programs may then come from JAX's in-memory caches,
    # filled from the persistent one without a hit being counted later; none is saved.
    self._ran_directly = False
    self._lock = threading.Lock()

  def __call__(self, *args: Any) -> Any:
    if jax.process_count() > 1 or _jax_runs_op_by_op():
      self._ran_directly = True
      return self._fn(*args)
    signature = _signature(args)
    compiled = self._compiled.get(signature)
    if compiled is None or signature in self._unproven:
      with self._lock:
        compiled = self._compiled.get(signature) or self._load_or_compile(signature, args)
        self._compiled[signature] = compiled
        if signature in self._unproven:  # its first run, under the lock: checked once
          try:
            return self._first_run(signature, compiled, args)
          finally:
            self._unproven.discard(signature)
    return compiled(*args)

  def _first_run(self, signature: tuple[Any, ...], compiled: Any, args: tuple[Any, ...]) -> Any:
    try:
      return jax.block_until_ready(compiled(*args))
    except Exception as e:  # pylint: disable=broad-except
      logging.info("A saved program for %s failed to run (%s); compiling it again.", self._name, e)
      path = self._path(signature)
      if path is not None:
        with contextlib.suppress(FileNotFoundError):
          os.remove(path)
      compiled = self._compiled[signature] = self._compile(signature, args)
      return compiled(*args)

  def _path(self, signature: tuple[Any, ...]) -> str | None:
    if _folder is None:
      return None
    key = hashlib.sha256(repr((self._name, signature, _environment())).encode()).hexdigest()
    return os.path.join(_folder, key + _SUFFIX)

  def _load_or_compile(self, signature: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
    from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top

    path = self._path(signature)
    if path is not None and os.path.isfile(path) and _private(os.path.dirname(path)):
      try:
        with open(path, "rb") as f:
          payload, in_tree, out_tree = pickle.load(f)
        compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        os.utime(path)  # recently used
        self._unproven.add(signature)
        return compiled
      except Exception as e:  # pylint: disable=broad-except
        logging.info("Saved program %s unusable (%s); compiling it again.", path, e)
    return self._compile(signature, args)

  def _compile(self, signature: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
    """Compiled and saved, kept out of JAX's cache (see the class docstring)."""
    _listen_for_cache_hits()
    hits_before = getattr(_HITS, "count", 0)
    try:
      with _not_written_to_jax_cache():
        compiled = self._fn.lower(*args).compile()
    except Exception as e:  # pylint: disable=broad-except
      logging.info("Compiling %s ahead of time failed (%s); running it as it is.", self._name, e)
      self._ran_directly = True
      return self._fn
    path = self._path(signature)
    if getattr(_HITS, "count", 0) > hits_before or self._ran_directly:
      logging.info("%s came from JAX's compilation cache: used, not saved.", self._name)
    elif path is not None:
      _save(path, compiled)
    return compiled


# Hits of JAX's persistent cache, counted per thread (jax.monitoring calls the listener on the
# thread that compiles).
_HITS = threading.local()
_listening = False


def _listen_for_cache_hits() -> None:
  global _listening
  if _listening:
    return
  _listening = True

  def count(event: str, **kwargs: Any) -> None:
    del kwargs
    if event == "/jax/compilation_cache/cache_hits":
      _HITS.count = getattr(_HITS, "count", 0) + 1

  jax.monitoring.register_event_listener(count)


def _not_written_to_jax_cache() -> Any:
  """A context in which this thread's compiles are not written to JAX's persistent cache (its
  minimum compile time for an entry, read per compile and per thread, set out of reach)."""
  try:
    from jax._src import config as jax_config  # pylint: disable=g-import-not-at-top

    return jax_config.persistent_cache_min_compile_time_secs(1e12)
  except (ImportError, AttributeError, TypeError):  # another JAX: hits are still detected
    return contextlib.nullcontext()


def _jax_runs_op_by_op() -> bool:
  return any(
    bool(getattr(jax.config, name, False))
    for name in ("jax_disable_jit", "jax_debug_nans", "jax_debug_infs")
  )


def _private(directory: str) -> bool:
  """Whether programs may be loaded from `directory` as code: the compilation cache's own check
  (files.unsafe: this user's and writable by no one else; every folder above it this user's or
  root's, writable by others only if sticky). One info line if not."""
  reason = files.unsafe(directory)
  if reason is not None:
    logging.info("Not loading saved programs from %s: %s.", directory, reason)
    return False
  return os.path.isdir(directory)


def traced(name: str, fn: Callable[[], Any]) -> Any:
  """`fn()`, kept in the store: for what tracing alone computes from this package's code and the
  settings `name` spells out, such as the parameters' shapes (`jax.eval_shape` of `init`, ~0.4 s
  on a CPU). The result must pickle (trees of jax.ShapeDtypeStruct do)."""
  if _folder is None or jax.process_count() > 1:
    return fn()
  key = hashlib.sha256(repr(("traced", name, _environment())).encode()).hexdigest()
  path = os.path.join(_folder, key + _SUFFIX)
  if os.path.isfile(path) and _private(_folder):
    try:
      with open(path, "rb") as f:
        value = pickle.load(f)
      os.utime(path)
      return value
    except Exception as e:  # pylint: disable=broad-except
      logging.info("Saved result %s unusable (%s); tracing it again.", path, e)
  value = fn()
  _write(path, pickle.dumps(value))
  return value


def _save(path: str, compiled: Any) -> None:
  """Writes `compiled`'s serialized program to `path`."""
  from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top

  try:
    blob = pickle.dumps(serialize_executable.serialize(compiled))
  except Exception as e:  # pylint: disable=broad-except
    logging.info("Could not serialize the compiled program for %s (%s).", path, e)
    return
  _write(path, blob)


def _write(path: str, blob: bytes) -> None:
  """Writes `blob` to `path` atomically; a failure is one info line (the run goes on)."""
  try:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with files.atomic_path(path) as scratch, open(scratch, "wb") as f:
      f.write(blob)
    _evict(os.path.dirname(path))
  except OSError as e:
    logging.info("Could not save %s (%s).", path, e)


def _evict(directory: str) -> None:
  """Deletes the least recently used programs until the folder holds at most MAX_BYTES."""
  entries = []
  for name in os.listdir(directory):
    if name.endswith(_SUFFIX):
      try:
        st = os.stat(os.path.join(directory, name))
      except FileNotFoundError:
        continue
      entries.append((st.st_mtime, st.st_size, name))
  total = sum(size for _, size, _ in entries)
  for _, size, name in sorted(entries):
    if total <= MAX_BYTES:
      break
    try:
      os.remove(os.path.join(directory, name))
    except FileNotFoundError:
      pass
    total -= size
