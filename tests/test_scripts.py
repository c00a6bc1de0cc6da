"""Scripts under benchmarks/ run from a fresh checkout: no runs/ directory, no caches."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # the scripts, as subprocesses

REPO = pathlib.Path(__file__).resolve().parents[1]
_ANIMALS = ["dog", "cat", "horse", "bird", "cow", "fox", "duck", "goat"]
_TIERE = ["Hund", "Katze", "Pferd", "Vogel", "Kuh", "Fuchs", "Ente", "Ziege"]


def _write_corpus(d: pathlib.Path) -> None:
  for prefix, n, offset in (("train", 400, 0), ("val", 12, 1000), ("test_2016_flickr", 12, 2000)):
    en = [
      f"the {_ANIMALS[i % 8]} and the {_ANIMALS[(i // 8) % 8]}." for i in range(offset, offset + n)
    ]
    de = [f"der {_TIERE[i % 8]} und der {_TIERE[(i // 8) % 8]}." for i in range(offset, offset + n)]
    (d / f"{prefix}.en").write_text("\n".join(en) + "\n")
    (d / f"{prefix}.de").write_text("\n".join(de) + "\n")


def test_multi30k_script_keeps_its_result_in_a_workdir_whose_parent_does_not_exist(tmp_path):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  _write_corpus(corpus)
  workdir = tmp_path / "runs" / "m30k"  # runs/ does not exist yet, as in a fresh clone
  tiny = [
    "--config.data.vocab_size=60",
    "--config.data.vocab_sample_size=800",
    "--config.data.tokens_per_batch=256",
    "--config.data.max_len=32",
    "--config.model.num_layers=1",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_heads=2",
    "--config.log_every_steps=1",
    "--config.checkpoint_every_steps=1",
    "--config.keep_checkpoints=3",
    "--config.eval_every_steps=3",
    "--config.eval.dev_bleu_sentences=4",
    "--config.decode.max_len_offset=4",
  ]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  proc = subprocess.run(
    ["bash", "benchmarks/multi30k.sh", str(corpus), "0.3", str(workdir), "2", *tiny],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  last = json.loads(proc.stdout.strip().splitlines()[-1])
  assert last == json.loads((workdir / "multi30k_result.json").read_text())
  assert last["steps"] >= 2 and len(last["averaged_steps"]) == 2
  assert 0.0 <= last["test_sacrebleu_beam4_averaged"] <= 100.0
  for mode in ("train", "average", "eval"):
    assert json.loads((workdir / f"{mode}_result.json").read_text())["mode"] == mode
  assert (workdir / "learning_curve.png").stat().st_size > 0


def test_recipe_cost_estimate_follows_the_flop_count():
  """The README's Table 2 costs: hours = steps x step FLOPs / (chips x peak x MFU)."""
  proc = subprocess.run(
    [sys.executable, "benchmarks/recipe_cost.py", "--mfu=0.5"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  last = json.loads(proc.stdout.strip().splitlines()[-1])
  assert last["estimate"] is True and last["mfu"] == 0.5
  recipes = {r["recipe"]: r for r in last["recipes"]}
  assert set(recipes) == {"wmt14_ende_base", "wmt14_ende_big", "wmt14_enfr_big"}
  base = recipes["wmt14_ende_base"]
  assert base["steps"] == 100_000 and base["tokens_per_step"] == 25_000
  # ~128 MFLOP per target token forward at rows of 64 (tests/test_flops.py); rows of 256 add
  # attention: 3x forward x 25k tokens lands near 10 TFLOP per step.
  assert 9.0 < base["tflop_per_step"] < 11.5
  hours = base["steps"] * base["tflop_per_step"] * 1e12 / (989e12 * 0.5) / 3600
  assert base["hours"]["1x H100 SXM"] == pytest.approx(hours, abs=0.01)
  assert base["hours"]["8x H100 SXM"] == pytest.approx(hours / 8, abs=0.01)
  assert recipes["wmt14_ende_big"]["hours"]["Colab TPU v5e-1"] > 20 * base["hours"]["8x H100 SXM"]
