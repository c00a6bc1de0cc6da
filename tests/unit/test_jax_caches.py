"""The tests' kept compilation caches (tests/jax_caches.py): where they are, and their cap."""

from __future__ import annotations

import os
import sys
import time

import jax_caches


def test_one_folder_per_stack_and_a_cold_run_gets_its_own(tmp_path, monkeypatch):
  monkeypatch.setenv(jax_caches.ENV, str(tmp_path / "kept"))
  a = jax_caches.folder("--xla_force_host_platform_device_count=8")
  b = jax_caches.folder("--xla_force_host_platform_device_count=2")
  assert a.parent == b.parent == tmp_path / "kept" and a != b
  assert a.name.startswith(f"py{sys.version_info.major}.") and "-jax" in a.name
  assert oct(a.stat().st_mode & 0o777) == "0o700"
  # The order of the flags does not make another stack.
  assert jax_caches.stack_key("--a --b") == jax_caches.stack_key("--b --a")
  monkeypatch.setenv(jax_caches.ENV, jax_caches.COLD)
  cold = jax_caches.environment("", session_tmp=tmp_path / "session")
  assert cold["JAX_COMPILATION_CACHE_DIR"].startswith(str(tmp_path / "session"))


def test_prune_drops_the_least_recently_used_down_to_three_quarters(tmp_path, monkeypatch):
  monkeypatch.setenv(jax_caches.ENV, str(tmp_path))
  stack = jax_caches.folder("")
  now = time.time()
  for i in range(8):  # entries 0..7, 100 bytes each, 0 the least recently used
    path = stack / f"jit_f-{i}-cache"
    path.write_bytes(b"x" * 100)
    os.utime(path, (now - 100 + i, now - 100 + i))
  (stack / "executables").mkdir()  # the compile cache's own store: not JAX's entries
  (stack / "executables" / "program.pickle").write_bytes(b"x" * 1000)
  (tmp_path / "not-a-stack").mkdir()  # whatever else lives under the root is never touched
  (tmp_path / "not-a-stack" / "a-cache").write_bytes(b"x" * 1000)
  assert jax_caches.prune(max_bytes=1000) == 0  # 800 bytes: under the cap, nothing goes
  assert jax_caches.prune(max_bytes=600) == 4  # over it: down to 450, the 4 oldest out
  assert sorted(p.name for p in stack.iterdir()) == ["executables"] + [
    f"jit_f-{i}-cache" for i in range(4, 8)
  ]
  assert (tmp_path / "not-a-stack" / "a-cache").exists()
  # An empty entry (a process killed as it began to write) goes at once; so does a stack that
  # no run has used for 30 days.
  (stack / "jit_g-0-cache").write_bytes(b"")
  assert jax_caches.prune() == 1 and not (stack / "jit_g-0-cache").exists()
  old = time.time() - 31 * 86400
  for path in stack.glob("*-cache"):
    os.utime(path, (old, old))
  assert jax_caches.prune() == 4 and not list(stack.glob("*-cache"))
