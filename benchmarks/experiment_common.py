"""What benchmarks/experiments.py's experiments share: the flags that shape every run, and the
user's command (`python main.py ...`) run from the checkout with the figures read off its last
line. The experiments themselves are in experiments_finetune.py (the demo and its fine-tuning)
and experiments_multi30k.py (Multi30k's runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from absl import flags, logging

WORKDIR = flags.DEFINE_string("workdir", "", "The (first) run's workdir ('' = runs/<experiment>).")
SET = flags.DEFINE_multi_string("set", [], "A config override for every command: path=value.")
DATA_DIR = flags.DEFINE_string("data_dir", "data/multi30k", "Multi30k's files (multi30k*).")
MINUTES = flags.DEFINE_float("minutes", 60.0, "Training budget per run (multi30k*).")
AVERAGE = flags.DEFINE_integer("average", 5, "Checkpoints averaged (multi30k*).")
SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "One run per seed (multi30k_seeds).")
EMA = flags.DEFINE_float("ema_decay", 0.995, "config.optim.ema_decay (multi30k_seeds).")
SOURCE = flags.DEFINE_string("source", "runs/demo", "The demo run to fine-tune (fine_tune_demo).")
TERMS_SEED = flags.DEFINE_integer("terms_seed", 0, "Which words are picked (multi30k_constraints).")
FT_STEPS = flags.DEFINE_integer("fine_tune_steps", 200, "Fine-tuning steps (fine_tune_demo).")

# The figures kept from an evaluation's result: every test_* score and nothing about the run.
_SCORE_PREFIX = "test_"


def checkout() -> str:
  """Where `main.py` is: the current folder if it has one, else this script's checkout."""
  return os.getcwd() if os.path.isfile("main.py") else os.path.dirname(os.path.dirname(__file__))


def main_py(*args: str) -> dict[str, Any]:
  """`python main.py ARGS` (the user's command); its last line's JSON. Fails loudly, with the end
  of the command's log, if the command does."""
  command = [sys.executable, "main.py", *args, *(f"--config.{s}" for s in SET.value)]
  logging.info("Running: %s", " ".join(command[1:]))
  start = time.perf_counter()
  proc = subprocess.run(command, cwd=checkout(), capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(command[1:])} failed:\n{proc.stderr[-4000:]}")
  logging.info("... %.0f s.", time.perf_counter() - start)
  return json.loads(proc.stdout.strip().splitlines()[-1])


def scores(result: dict[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in result.items() if k.startswith(_SCORE_PREFIX)}


def signatures(result: dict[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in result.items() if k.endswith("_signature")}


def run_figures(result: dict[str, Any]) -> dict[str, Any]:
  """What a training run's result says of the run itself."""
  keep = ("step", "train_minutes", "dev_bleu", "dev_multi30k_bleu", "dev_loss", "preempted")
  keep += ("stopped_early",)
  return {k: result[k] for k in keep if k in result}


def read_lines(path: str) -> list[str]:
  """A text file's lines (or its .gz's), relative to the checkout."""
  import gzip  # pylint: disable=g-import-not-at-top

  full = os.path.join(checkout(), path)
  if not os.path.exists(full) and os.path.exists(full + ".gz"):
    with gzip.open(full + ".gz", "rt", encoding="utf-8") as f:
      return f.read().splitlines()
  with open(full, encoding="utf-8") as f:
    return f.read().splitlines()


def read_file(root: str, folder: str, name: str) -> str:
  with open(os.path.join(root, folder, name), encoding="utf-8") as f:
    return f.read()


def write_file(root: str, folder: str, name: str, text: str) -> None:
  with open(os.path.join(root, folder, name), "w", encoding="utf-8") as f:
    f.write(text)
