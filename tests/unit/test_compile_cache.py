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


def _enable_recording(monkeypatch, setting: str) -> tuple[str | None, dict[str, object]]:
  """compile_cache.enable(setting) with JAX's settings recorded instead of made."""
  import jax  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.runtime import executables  # pylint: disable=g-import-not-at-top

  calls: dict[str, object] = {}
  monkeypatch.setattr(jax.config, "update", lambda name, value: calls.__setitem__(name, value))
  monkeypatch.setattr(executables, "enable", lambda f: calls.__setitem__("executables", f))
  monkeypatch.setattr(compile_cache, "_enabled", None)
  return compile_cache.enable(setting), calls


@pytest.mark.parametrize("via", ["config", "env", "jax"])
def test_a_folder_others_can_write_is_not_used(monkeypatch, tmp_path, caplog, request, via):
  """Defect 5 of issue 52: a 0777 cache folder was used, and the programs written there loaded as
  code, whether named by --config.compile_cache, FLAXFORMER_NMT_COMPILE_CACHE or JAX's own
  JAX_COMPILATION_CACHE_DIR (adopted by "auto")."""
  import jax  # pylint: disable=g-import-not-at-top

  shared = tmp_path / "shared"
  shared.mkdir()
  shared.chmod(0o777)
  setting = str(shared) if via == "config" else "auto"
  kept = jax.config.jax_compilation_cache_dir  # tests/conftest.py's, restored after
  update = jax.config.update  # the real one: `_enable_recording` replaces it until teardown
  request.addfinalizer(lambda: update("jax_compilation_cache_dir", kept))
  request.addfinalizer(lambda: update("jax_enable_compilation_cache", True))
  if via == "env":
    monkeypatch.setenv(compile_cache.ENV, str(shared))
  jax.config.update("jax_compilation_cache_dir", str(shared) if via == "jax" else None)
  folder, calls = _enable_recording(monkeypatch, setting)
  assert folder is None
  assert calls["jax_enable_compilation_cache"] is False
  assert calls["jax_compilation_cache_dir"] is None
  assert calls["executables"] is None
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert len(warnings) == 1 and f"{shared} is writable by others (mode 777)" in warnings[0]


def test_a_folder_below_a_writable_parent_is_not_used_unless_sticky(monkeypatch, tmp_path):
  parent = tmp_path / "open"
  parent.mkdir()
  parent.chmod(0o777)
  assert "above it, is writable by others" in compile_cache.unsafe(str(parent / "cache"))
  parent.chmod(0o777 | 0o1000)  # sticky, as /tmp: others cannot rename our folder
  assert compile_cache.unsafe(str(parent / "cache")) is None
  folder, calls = _enable_recording(monkeypatch, str(parent / "cache"))
  assert folder == str(parent / "cache") and calls["jax_compilation_cache_dir"] == folder
  assert (parent / "cache").stat().st_mode & 0o777 == 0o700


def test_a_folder_of_another_user_is_not_used(tmp_path):
  import os  # pylint: disable=g-import-not-at-top

  theirs = tmp_path / "theirs"
  theirs.mkdir(mode=0o700)
  if os.getuid() != 0:
    pytest.skip("chown to another user needs root")
  os.chown(theirs, 4242, 4242)
  assert "belongs to uid 4242" in compile_cache.unsafe(str(theirs))
  os.chown(theirs, 0, 0)
  assert compile_cache.unsafe(str(theirs)) is None


def test_saved_programs_are_not_loaded_from_an_open_folder(tmp_path):
  from flaxformer_nmt.runtime import executables  # pylint: disable=g-import-not-at-top

  store = tmp_path / "executables"
  store.mkdir(mode=0o700)
  assert executables._private(str(store))  # pylint: disable=protected-access
  store.chmod(0o770)
  assert not executables._private(str(store))  # pylint: disable=protected-access


@pytest.mark.parametrize("via", ["config", "env"])
def test_a_link_to_a_folder_below_an_open_parent_is_not_used(
  monkeypatch, tmp_path, caplog, request, via
):
  """Issue 60, defect 3: the check followed the path as typed, so a symbolic link (in a safe
  folder) to a cache below a folder anyone can write passed, and JAX wrote its programs there.
  The folder the link resolves to is checked, and so are the link's own parents."""
  import jax  # pylint: disable=g-import-not-at-top

  open_parent = tmp_path / "x"
  open_parent.mkdir()
  (open_parent / "cache").mkdir(mode=0o700)
  open_parent.chmod(0o777)
  link = tmp_path / "cachelink"
  link.symlink_to(open_parent / "cache")
  assert "above it, is writable by others" in compile_cache.unsafe(str(open_parent / "cache"))
  reason = compile_cache.unsafe(str(link))
  assert reason is not None and f"{open_parent}, above it, is writable by others" in reason
  assert f"({link} leads there)" in reason
  # A link to a safe folder, but sitting in a folder anyone can write (it can be replaced).
  safe = tmp_path / "safe"
  safe.mkdir(mode=0o700)
  (open_parent / "link").symlink_to(safe)
  assert compile_cache.unsafe(str(safe)) is None
  assert "above it, is writable by others" in compile_cache.unsafe(str(open_parent / "link"))
  kept = jax.config.jax_compilation_cache_dir
  update = jax.config.update
  request.addfinalizer(lambda: update("jax_compilation_cache_dir", kept))
  request.addfinalizer(lambda: update("jax_enable_compilation_cache", True))
  jax.config.update("jax_compilation_cache_dir", None)
  if via == "env":
    monkeypatch.setenv(compile_cache.ENV, str(link))
  folder, calls = _enable_recording(monkeypatch, str(link) if via == "config" else "auto")
  assert folder is None and calls["jax_compilation_cache_dir"] is None
  assert not any((open_parent / "cache").iterdir())


def test_a_file_named_by_the_environment_warns_naming_the_variable(
  monkeypatch, tmp_path, caplog, request
):
  """Issue 60, defect 4: FLAXFORMER_NMT_COMPILE_CACHE=<a file> refused every command with an
  error about `config.compile_cache=auto`, a field the user never set; it warns (naming the
  variable) and compiles without a cache, as JAX_COMPILATION_CACHE_DIR=<a file> does."""
  import jax  # pylint: disable=g-import-not-at-top

  a_file = tmp_path / "f"
  a_file.write_text("x")
  monkeypatch.setenv(compile_cache.ENV, str(a_file))
  compile_cache.check("auto")  # no error: "auto" never fails a command
  kept = jax.config.jax_compilation_cache_dir
  update = jax.config.update
  request.addfinalizer(lambda: update("jax_compilation_cache_dir", kept))
  request.addfinalizer(lambda: update("jax_enable_compilation_cache", True))
  jax.config.update("jax_compilation_cache_dir", None)
  folder, calls = _enable_recording(monkeypatch, "auto")
  assert folder is None and calls["jax_compilation_cache_dir"] is None
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert len(warnings) == 1
  assert f"${compile_cache.ENV}={a_file}" in warnings[0] and "is a file" in warnings[0]
  assert "config.compile_cache" not in warnings[0]
