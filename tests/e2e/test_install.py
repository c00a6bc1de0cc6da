"""A plain (not editable) install: the console script, the installed configs, from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

from flaxformer_nmt.config import loading as config_files

import helpers

TINY_DEMO = [
  "--config.num_train_steps=6",
  "--config.checkpoint_every_steps=3",
  "--config.eval_every_steps=6",
  "--config.log_every_steps=3",
  "--config.data.demo_train_size=2000",
  "--config.data.demo_dev_size=8",
  "--config.data.demo_test_size=8",
  "--config.eval.dev_bleu_sentences=4",
  "--config.decode.beam_size=2",
]


def test_a_built_wheel_trains_the_demo_by_config_name_from_an_empty_folder(tmp_path):
  """The wheel `pip install <clone>` or `pip install git+URL` builds: it holds the configs and
  the console script, and its code (not the clone's) trains `--config=demo` in an empty folder."""
  subprocess.run(
    [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
     "-w", str(tmp_path / "dist"), str(helpers.REPO)],
    check=True, capture_output=True, timeout=300,
  )  # fmt: skip
  (wheel,) = (tmp_path / "dist").glob("flaxformer_nmt-*.whl")
  site = tmp_path / "site"
  with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "flaxformer-nmt = flaxformer_nmt.cli:run" in z.read(entry_points).decode()
    z.extractall(site)
  assert {f"flaxformer_nmt/configs/{n}.py" for n in config_files.names()} <= set(names)
  empty = tmp_path / "empty"
  empty.mkdir()
  # What the console script runs (pip writes a launcher that calls flaxformer_nmt.cli:run).
  script = (
    "import sys, flaxformer_nmt; "
    f"assert flaxformer_nmt.__file__.startswith({str(site)!r}), flaxformer_nmt.__file__; "
    "from flaxformer_nmt import api; assert api.load_config('demo').data.source == 'demo'; "
    "from flaxformer_nmt.cli import run; sys.argv[0] = 'flaxformer-nmt'; run()"
  )
  proc = subprocess.run(
    [sys.executable, "-c", script, "--config=demo", "--workdir=w", *TINY_DEMO],
    cwd=empty,
    env={**os.environ, "PYTHONPATH": str(site)},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["step"] == 6 and "test_sacrebleu_beam2" in result
  assert json.loads((empty / "w" / "train_result.json").read_text()) == result
