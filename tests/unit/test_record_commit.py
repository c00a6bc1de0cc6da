"""A benchmark record names the commit it was measured at (benchmarking/record.commit) and the
XLA options it ran under (record.environment)."""

from __future__ import annotations

import subprocess
import types

from flaxformer_nmt.benchmarking import record


def _git(answers: dict[str, str]):
  """A stand-in for subprocess.run of git: the unit tier starts no process."""

  def run(args, **kwargs):
    return types.SimpleNamespace(stdout=answers[args[1]])

  return run


def test_the_commit_is_gits_unless_record_commit_declares_the_tree(monkeypatch):
  monkeypatch.delenv("RECORD_COMMIT", raising=False)
  monkeypatch.setattr(record.subprocess, "run", _git({"rev-parse": "66f8fd32291c\n", "status": ""}))
  assert record.commit() == "66f8fd32291c"
  monkeypatch.setattr(
    record.subprocess, "run", _git({"rev-parse": "66f8fd32291c", "status": "M x"})
  )
  assert record.commit() == "66f8fd32291c + uncommitted changes"
  # A tree sent to a GPU machine with an older .git: the declared commit first, git's beside it.
  monkeypatch.setenv("RECORD_COMMIT", "30cdd86")
  assert record.commit() == (
    "30cdd86 (RECORD_COMMIT; this checkout's git: 66f8fd32291c + uncommitted changes)"
  )


def test_no_git_is_said_so(monkeypatch):
  def fail(*args, **kwargs):
    raise subprocess.CalledProcessError(128, "git")

  monkeypatch.delenv("RECORD_COMMIT", raising=False)
  monkeypatch.setattr(record.subprocess, "run", fail)
  assert record.commit() == "unknown (not a git checkout)"


def test_the_record_names_the_xla_options_it_ran_under(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")
  monkeypatch.setenv("FLAXFORMER_NMT_XLA_DEFAULTS", "0")
  monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
  monkeypatch.setattr(record, "commit", lambda: "66f8fd32291c")
  made = record.make_record("decode_x", {"sentences_per_s": 1.0}, "python benchmarks/decode.py")
  assert made["environment"] == {
    "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false",
    "FLAXFORMER_NMT_XLA_DEFAULTS": "0",
  }
  monkeypatch.delenv("XLA_FLAGS")
  monkeypatch.delenv("FLAXFORMER_NMT_XLA_DEFAULTS")
  assert record.environment() == {}
