"""The unit tier's own rule (tests/unit/conftest.py): a test that starts a process fails, saying
where it belongs, except for matplotlib's `fc-list`, run once a machine to build its font cache."""

from __future__ import annotations

import subprocess
import sys

import pytest

from unit import conftest


def test_a_started_process_fails_the_test_and_names_the_tier():
  with pytest.raises(conftest.TierError, match="move it to tests/e2e"):
    subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_matplotlibs_font_listing_is_let_through(monkeypatch):
  started = []
  monkeypatch.setattr(conftest, "_POPEN_INIT", lambda self, args, *a, **k: started.append(args))
  subprocess.Popen(["fc-list", "--help"], stdout=subprocess.PIPE)
  subprocess.Popen(args=["fc-list", "--format=%{file}\\n"])
  assert started == [["fc-list", "--help"], ["fc-list", "--format=%{file}\\n"]]
  for refused in (["fc-list-but-not-quite"], "fc-list", ["sh", "-c", "fc-list"]):
    with pytest.raises(conftest.TierError):
      subprocess.Popen(refused)
