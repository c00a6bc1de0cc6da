"""`--help` and `--version`: one short text for both entry points, naming every mode and flag."""

from __future__ import annotations

import logging
import re
import sys
import tomllib

import pytest
from absl import flags

from flaxformer_nmt import cli, help_text
from flaxformer_nmt.runtime import console as quiet_lib

import helpers


def _run(monkeypatch, capsys, program: str, *args: str) -> str:
  """`cli.run()` as `program ARGS` runs it: its stdout, after checking it exits 0."""
  monkeypatch.setattr(sys, "argv", [program, *args])
  with pytest.raises(SystemExit) as exit_info:
    cli.run()
  assert exit_info.value.code == 0
  return capsys.readouterr().out


def test_help_is_one_short_text_for_both_entry_points(monkeypatch, capsys):
  console = _run(monkeypatch, capsys, "/venv/bin/flaxformer-nmt", "--help")
  clone = _run(monkeypatch, capsys, "main.py", "-h")
  assert console.replace("flaxformer-nmt", "python main.py") == clone
  lines = console.splitlines()
  assert 20 < len(lines) < 80 and max(len(line) for line in lines) <= 100
  modes = flags.FLAGS["mode"].parser.enum_values
  for mode in modes:
    assert re.search(rf"^  {mode} +\S", console, re.M), mode
  assert sorted(help_text.MODES) == sorted(modes)  # a new mode is described, or this fails
  own = {f.name for f in flags.FLAGS.get_flags_for_module(cli)}
  assert own == set(help_text.FLAG_LINES)  # a new flag gets its line, or this fails
  for name in own:
    assert re.search(rf"^  --{name} +\S", console, re.M), name
  assert "--helpfull" in console and "--version" in console
  # The examples: training names its config; a trained workdir needs none.
  assert " --config=demo --workdir=runs/demo" in console
  assert " --workdir=runs/demo --mode=translate" in console


def test_helpfull_shows_our_flags_first_then_absls(monkeypatch, capsys):
  text = _run(monkeypatch, capsys, "main.py", "--helpfull")
  assert text.index("--checkpoint: <auto|") < text.index("absl.app:") < text.index("--verbosity")


def test_version_is_the_package_version_and_the_citations(monkeypatch, capsys):
  with open(helpers.REPO / "pyproject.toml", "rb") as f:
    version = tomllib.load(f)["project"]["version"]
  assert _run(monkeypatch, capsys, "main.py", "--version").strip() == f"flaxformer_nmt {version}"
  citation = (helpers.REPO / "CITATION.cff").read_text()
  assert re.search(rf"^version: {re.escape(version)}$", citation, re.M)
  assert "Attention Is All You Need" in citation and "license: Apache-2.0" in citation
  assert (helpers.REPO / "LICENSE").read_text().lstrip().startswith("Apache License")


def _record(name: str, path: str, level: int, message: str) -> logging.LogRecord:
  return logging.LogRecord(name, level, path, 1, message, (), None)


def test_library_chatter_is_dropped_and_everything_else_kept():
  quiet = quiet_lib.QuietLibraries()
  orbax = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  bridge = "/site-packages/jax/_src/xla_bridge.py"
  dropped = [
    _record("absl", orbax, logging.WARNING, "Given directory is read only=/w/checkpoints"),
    _record("absl", orbax, logging.INFO, "Saving checkpoint at step 3"),
    _record("jax._src.xla_bridge", bridge, logging.INFO, "Unable to initialize backend 'tpu': x"),
  ]
  kept = [
    _record("absl", orbax, logging.ERROR, "could not write step 3"),
    _record("jax._src.xla_bridge", bridge, logging.WARNING, "An NVIDIA GPU may be present"),
    _record("absl", "/flaxformer_nmt/training/loop.py", logging.INFO, "step 3/60"),
  ]
  assert [quiet.filter(r) for r in dropped] == [False] * 3
  assert [quiet.filter(r) for r in kept] == [True] * 3
