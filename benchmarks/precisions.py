"""`--experiment=demo_precisions` of benchmarks/experiments.py: the demo in each precision.

The quick start's demo trained three times, as a user would with `--config.model.dtype=...`:
float32, bfloat16 and float16 (with its dynamic loss scale, training/loss_scale.py). For each:
its test BLEU (greedy and beam 4), training steps per second (steps over the run's own training
time, which leaves evaluations out and includes the first step's compilation), and for float16
where its loss scale went and how many updates it skipped.

On a CPU both half types are emulated (XLA:CPU widens them around each product), so the speed
column says what emulation costs there, not what a GPU gains; BLEU is what the experiment is for:
a float16 run must train the demo as well as float32 does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")

RunMain = Callable[..., dict[str, Any]]


def _loss_scale_history(workdir: str) -> dict[str, Any]:
  """What train_metrics.jsonl says of a float16 run's loss scale."""
  with open(os.path.join(workdir, "train_metrics.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  scales = [r["loss_scale"] for r in records]
  return {
    "loss_scale_first": scales[0],
    "loss_scale_last": scales[-1],
    "loss_scale_min": min(scales),
    "loss_scale_max": max(scales),
    "skipped_steps": int(records[-1]["skipped_steps_total"]),
  }


def demo_precisions(run_main: RunMain, root: str, kept: Callable[[dict], dict]) -> dict[str, Any]:
  """Trains the demo in each of DTYPES into `<root>_<dtype>` (resumed, or its saved figures
  returned, if it exists); `kept(result)` picks the figures of a training result to record."""
  runs: dict[str, Any] = {}
  for dtype in DTYPES:
    workdir = f"{root}_{dtype}"
    trained = run_main(
      "--config=configs/demo.py", f"--workdir={workdir}", f"--config.model.dtype={dtype}"
    )
    run = {"workdir": workdir, **kept(trained)}
    run["steps_per_s"] = trained["step"] / max(trained["train_minutes"] * 60.0, 1e-9)
    if dtype == "float16":
      run.update(_loss_scale_history(workdir))
    runs[dtype] = run
  base = runs["float32"]
  for dtype in DTYPES[1:]:
    runs[dtype]["beam4_minus_float32"] = (
      runs[dtype]["test_sacrebleu_beam4"] - base["test_sacrebleu_beam4"]
    )
    runs[dtype]["speed_vs_float32"] = runs[dtype]["steps_per_s"] / base["steps_per_s"]
  return {"runs": runs}
