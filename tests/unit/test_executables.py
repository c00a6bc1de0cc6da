"""Compiled programs kept on disk (runtime/executables.py): a later Program with the same name and
arguments runs the saved program without tracing; another shape, another name, a damaged file and
a full folder are handled; without a folder nothing is written."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_nmt.runtime import executables


@pytest.fixture
def store(tmp_path, monkeypatch):
  monkeypatch.setattr(executables, "_folder", None)
  executables.enable(str(tmp_path))
  return tmp_path / executables.SUBFOLDER


def _inputs(rows: int = 2) -> tuple[np.ndarray, np.ndarray]:
  n = jax.local_device_count()
  return np.full((n, 3), 2.0, np.float32), np.arange(n * rows * 3, dtype=np.float32).reshape(
    n, rows, 3
  )


def _plus(w, x):
  return x + w[None, :]


def _times(w, x):
  return x * w[None, :]


def _files(folder) -> list[str]:
  return sorted(os.listdir(folder)) if folder.is_dir() else []


def test_a_later_program_runs_the_saved_one_without_tracing(store):
  w, x = _inputs()
  first = executables.Program(jax.pmap(_plus), "op")
  np.testing.assert_allclose(first(w, x), x + 2.0)
  assert len(_files(store)) == 1
  # Same name and arguments, another function: the saved program (x + w) runs, which shows that
  # nothing was traced; the name must therefore spell out everything the function closes over.
  later = executables.Program(jax.pmap(_times), "op")
  np.testing.assert_allclose(later(w, x), x + 2.0)
  assert len(_files(store)) == 1


def test_another_shape_or_name_is_another_program(store):
  w, x = _inputs()
  executables.Program(jax.pmap(_plus), "op")(w, x)
  _, x3 = _inputs(rows=3)
  np.testing.assert_allclose(executables.Program(jax.pmap(_plus), "op")(w, x3), x3 + 2.0)
  np.testing.assert_allclose(executables.Program(jax.pmap(_times), "times")(w, x), x * 2.0)
  assert len(_files(store)) == 3


def test_a_damaged_file_is_compiled_again_and_replaced(store):
  w, x = _inputs()
  executables.Program(jax.pmap(_plus), "op")(w, x)
  (name,) = _files(store)
  (store / name).write_bytes(b"not a program")
  np.testing.assert_allclose(executables.Program(jax.pmap(_plus), "op")(w, x), x + 2.0)
  assert (store / name).read_bytes() != b"not a program"


def test_the_folder_keeps_the_most_recently_used_within_its_cap(store, monkeypatch):
  w, x = _inputs()
  executables.Program(jax.pmap(_plus), "a")(w, x)
  (oldest,) = _files(store)
  os.utime(store / oldest, (1, 1))  # used long ago
  size = (store / oldest).stat().st_size
  monkeypatch.setattr(executables, "MAX_BYTES", int(size * 1.5))
  executables.Program(jax.pmap(_plus), "b")(w, x)
  assert len(_files(store)) == 1 and oldest not in _files(store)


def test_traced_results_are_kept_and_read_back(store):
  calls = []

  def shapes():
    calls.append(1)
    return jax.eval_shape(lambda: {"w": jnp.zeros((2, 3), jnp.bfloat16)})

  first = executables.traced("shapes", shapes)
  again = executables.traced("shapes", shapes)
  assert first == again == {"w": jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)}
  assert len(calls) == 1


def test_without_a_folder_nothing_is_written(tmp_path, monkeypatch):
  monkeypatch.setattr(executables, "_folder", None)
  w, x = _inputs()
  np.testing.assert_allclose(executables.Program(jax.pmap(_plus), "op")(w, x), x + 2.0)
  calls = []
  executables.traced("t", lambda: calls.append(1))
  executables.traced("t", lambda: calls.append(1))
  assert len(calls) == 2 and not any(tmp_path.iterdir())


def test_the_key_covers_the_environment(store, monkeypatch):
  """Another package source, JAX version or device set (all in `_environment`) is another file."""
  w, x = _inputs()
  executables.Program(jax.pmap(_plus), "op")(w, x)
  monkeypatch.setattr(executables, "_environment", lambda: "edited source")
  np.testing.assert_allclose(executables.Program(jax.pmap(_times), "op")(w, x), x * 2.0)
  assert len(_files(store)) == 2


def test_a_saved_program_that_fails_its_first_run_is_compiled_again(store, monkeypatch):
  """XLA:CPU can serialize a program it cannot run again (one JAX's own cache handed back: its
  code is missing, "Function ... not found"): the first run of a loaded program is checked."""
  from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top

  w, x = _inputs()
  executables.Program(jax.pmap(_plus), "op")(w, x)
  (name,) = _files(store)

  def broken(*args):
    raise RuntimeError("NOT_FOUND: Function add_fusion not found")

  monkeypatch.setattr(serialize_executable, "deserialize_and_load", lambda *a, **k: broken)
  saved = []
  real_save = executables._save
  monkeypatch.setattr(
    executables, "_save", lambda path, c: (saved.append(path), real_save(path, c))
  )
  program = executables.Program(jax.pmap(_plus), "op")
  np.testing.assert_allclose(program(w, x), x + 2.0)
  np.testing.assert_allclose(program(w, x), x + 2.0)
  assert saved == [str(store / name)] and _files(store) == [name]  # compiled again, rewritten


def test_a_program_from_jax_cache_is_used_but_not_saved(store, monkeypatch):
  """What JAX's persistent cache hands back cannot be serialized whole on XLA:CPU: not saved."""
  executables._listen_for_cache_hits()
  w, x = _inputs()
  fn = jax.pmap(_plus)
  real_lower = fn.lower

  def lower_with_a_hit(*args):
    executables._HITS.count = getattr(executables._HITS, "count", 0) + 1  # as JAX's listener
    return real_lower(*args)

  fn.lower = lower_with_a_hit
  np.testing.assert_allclose(executables.Program(fn, "op")(w, x), x + 2.0)
  assert _files(store) == []


def test_a_folder_others_can_write_is_not_loaded_from(store):
  w, x = _inputs()
  executables.Program(jax.pmap(_plus), "op")(w, x)
  store.chmod(0o777)
  np.testing.assert_allclose(executables.Program(jax.pmap(_times), "op")(w, x), x * 2.0)
