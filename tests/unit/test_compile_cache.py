"""Where the persistent compilation cache lives (runtime/compile_cache.py): config.compile_cache's
values, the private default folder, and one line for a folder that is a file."""

from __future__ import annotations

import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.runtime import compile_cache


def test_auto_is_a_private_folder_under_the_users_cache(monkeypatch, tmp_path):
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compile_cache.folder("auto") == str(tmp_path / "xdg" / "flaxformer_nmt" / "jax")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert compile_cache.folder("auto") == str(
    tmp_path / "home" / ".cache" / "flaxformer_nmt" / "jax"
  )
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "mine"))
  assert compile_cache.folder("auto") == str(tmp_path / "mine")


def test_off_and_a_path(tmp_path):
  assert compile_cache.folder("off") is None
  assert compile_cache.folder(str(tmp_path / "c")) == str(tmp_path / "c")


def test_a_file_is_one_line(tmp_path):
  (tmp_path / "f").write_text("x")
  with pytest.raises(errors.ConfigError, match=r"config.compile_cache=.*/f: .* is a file"):
    compile_cache.check(str(tmp_path / "f"))
  compile_cache.check(str(tmp_path / "new"))  # a folder to be made: fine
  compile_cache.check("off")


def test_an_adopted_folder_keeps_jaxs_cap_and_ours_gets_ours(monkeypatch, tmp_path):
  """A cap makes JAX list the whole folder at every write: set on our own folder only, never on
  one adopted from JAX_COMPILATION_CACHE_DIR (the tests' kept caches are such a folder)."""
  import jax  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.runtime import executables  # pylint: disable=g-import-not-at-top

  calls: dict[str, object] = {}
  monkeypatch.setattr(jax.config, "update", lambda name, value: calls.__setitem__(name, value))
  monkeypatch.setattr(executables, "enable", lambda folder: None)
  monkeypatch.setattr(compile_cache, "_enabled", None)
  assert jax.config.jax_compilation_cache_dir  # tests/conftest.py set JAX's own
  assert compile_cache.enable("auto") == jax.config.jax_compilation_cache_dir
  assert "jax_compilation_cache_max_size" not in calls
  calls.clear()
  monkeypatch.setattr(compile_cache, "_enabled", None)
  assert compile_cache.enable(str(tmp_path / "ours")) == str(tmp_path / "ours")
  assert calls["jax_compilation_cache_max_size"] == compile_cache.MAX_BYTES
  assert calls["jax_compilation_cache_dir"] == str(tmp_path / "ours")
