"""benchmarks/experiments.py's demo experiments: the demo itself, its precisions, and the
demo model fine-tuned (every parameter, LoRA, and through a transformers export and import)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import precisions
from experiment_common import (
  FT_STEPS,
  SOURCE,
  WORKDIR,
  checkout,
  main_py,
  read_file,
  run_figures,
  scores,
  signatures,
  write_file,
)


def demo() -> dict[str, Any]:
  workdir = WORKDIR.value or "runs/demo"
  trained = main_py("--config=configs/demo.py", f"--workdir={workdir}")
  return {"workdir": workdir, **run_figures(trained), **scores(trained), **signatures(trained)}


def demo_precisions() -> dict[str, Any]:
  root = WORKDIR.value or "runs/demo"  # runs/demo_float32, runs/demo_bfloat16, ...
  return precisions.demo_precisions(
    main_py, root, lambda trained: {**run_figures(trained), **scores(trained)}
  )


def _demo_domains(source: str) -> tuple[list[str], list[str]]:
  """The quick start's model trained (or found) in `source`, the shifted domain's text written;
  the config arguments of the shifted and the original domain."""
  demo_args = ["--config=configs/demo.py"]
  main_py(*demo_args, f"--workdir={source}")  # trains the quick start's model, or returns it
  _demo_text("data/demo_large", "--variant=large")
  shifted = [*demo_args, "--config.data.source=files", "--config.data.dir=data/demo_large"]
  return shifted, [*demo_args, "--config.data.source=demo"]


def fine_tune_demo() -> dict[str, Any]:
  source, workdir = SOURCE.value, WORKDIR.value or "runs/demo_ft"
  shifted, original = _demo_domains(source)
  _demo_text("data/demo_std")
  _concatenate("data/demo_mixed", ("data/demo_large", "data/demo_std"), "data/demo_large")
  tune = [
    f"--config.init_from={source}",
    "--config.optim.schedule=constant",
    "--config.optim.lr_scale=0.1",
    f"--config.num_train_steps={FT_STEPS.value}",
    "--config.eval_every_steps=50",
    "--config.checkpoint_every_steps=50",
  ]
  mixed_dir = f"{workdir}_mixed"
  mixed = [
    "--config=configs/demo.py",
    "--config.data.source=files",
    "--config.data.dir=data/demo_mixed",
  ]
  trained = main_py(
    *shifted,
    f"--workdir={workdir}",
    *tune,
    "--config.best_metric=dev_bleu",
    "--config.optim.ema_decay=0.99",
  )
  trained_mixed = main_py(*mixed, f"--workdir={mixed_dir}", *tune)

  def score(args: list[str], run: str, which: str) -> dict[str, Any]:
    return scores(main_py(*args, f"--workdir={run}", "--mode=eval", f"--checkpoint={which}"))

  return {
    "source": source,
    "fine_tuned": run_figures(trained),
    "mixed": run_figures(trained_mixed),
    "before": {
      "shifted": score(shifted, source, "auto"),
      "original": score(original, source, "auto"),
    },
    "best": {
      "shifted": score(shifted, workdir, "best"),
      "original": score(original, workdir, "best"),
    },
    "ema": {"shifted": score(shifted, workdir, "ema"), "original": score(original, workdir, "ema")},
    "mixed_last": {
      "shifted": score(shifted, mixed_dir, "latest"),
      "original": score(original, mixed_dir, "latest"),
    },
  }


def fine_tune_lora() -> dict[str, Any]:
  source, root = SOURCE.value, WORKDIR.value or "runs/demo_lora"
  shifted, original = _demo_domains(source)
  tune = [
    f"--config.init_from={source}",
    "--config.optim.schedule=constant",
    f"--config.num_train_steps={FT_STEPS.value}",
    "--config.eval_every_steps=50",
    "--config.checkpoint_every_steps=50",
    "--config.best_metric=dev_bleu",
  ]
  lora = [
    "--config.optim.lora_rank=8",
    "--config.optim.lora_alpha=16",
    "--config.optim.lora_targets=q,k,v,o",
  ]
  variants = {
    "full": ["--config.optim.lr_scale=0.1"],
    "lora": [*lora, "--config.optim.lr_scale=0.1"],
    "lora_lr10x": [*lora, "--config.optim.lr_scale=1.0"],
  }

  def score(args: list[str], run: str, which: str) -> dict[str, Any]:
    return scores(main_py(*args, f"--workdir={run}", "--mode=eval", f"--checkpoint={which}"))

  out: dict[str, Any] = {
    "source": source,
    "before": {
      "shifted": score(shifted, source, "auto"),
      "original": score(original, source, "auto"),
    },
  }
  for name, extra in variants.items():
    workdir = f"{root}_{name}"
    trained = main_py(*shifted, f"--workdir={workdir}", *tune, *extra)
    out[name] = {
      "workdir": workdir,
      "settings": extra,
      **run_figures(trained),
      "parameters": trained["parameters"],
      "trained_parameters": trained["trained_parameters"],
      "steps_per_s": trained["step"] / max(trained["train_minutes"] * 60.0, 1e-9),
      "best": {
        "shifted": score(shifted, workdir, "best"),
        "original": score(original, workdir, "best"),
      },
    }
  return out


def finetune_imported() -> dict[str, Any]:
  source, workdir = SOURCE.value, WORKDIR.value or "runs/finetune_imported"
  exported, imported = f"{workdir}_hf", f"{workdir}_imported"
  demo_args = ["--config=configs/demo.py"]
  shifted = ["--config.data.source=files", "--config.data.dir=data/demo_large"]
  original = ["--config.data.source=demo"]  # the run's own config (its model is the import's)
  main_py(*demo_args, f"--workdir={source}")  # trains the quick start's model, or returns it
  _demo_text("data/demo_large", "--variant=large")
  if not os.path.isdir(os.path.join(checkout(), exported)):
    main_py(f"--workdir={source}", "--mode=export", "--format=huggingface", f"--output={exported}")
  if not os.path.isdir(os.path.join(checkout(), imported)):
    main_py("--mode=import", f"--input={exported}", f"--workdir={imported}")
  trained = main_py(
    *demo_args,
    *shifted,
    f"--workdir={workdir}",
    f"--config.init_from={imported}",
    "--config.optim.schedule=constant",
    "--config.optim.lr_scale=0.1",
    f"--config.num_train_steps={FT_STEPS.value}",
    "--config.eval_every_steps=50",
    "--config.checkpoint_every_steps=50",
    "--config.best_metric=dev_bleu",
    "--config.optim.ema_decay=0.99",
  )

  def score(args: list[str], run: str, which: str) -> dict[str, Any]:
    return scores(main_py(*args, f"--workdir={run}", "--mode=eval", f"--checkpoint={which}"))

  return {
    "source": source,
    "imported": imported,
    "fine_tuned": run_figures(trained),
    "best": {
      "shifted": score(shifted, workdir, "best"),
      "original": score(original, workdir, "best"),
    },
    "ema": {"shifted": score(shifted, workdir, "ema"), "original": score(original, workdir, "ema")},
  }


def _demo_text(folder: str, *args: str) -> None:
  """`python -m flaxformer_nmt.data.demo_text` (docs/fine-tuning.md's data), unless written."""
  if os.path.isfile(os.path.join(checkout(), folder, "test.de")):
    return
  command = [sys.executable, "-m", "flaxformer_nmt.data.demo_text", f"--output_dir={folder}"]
  command += ["--train_size=2000", "--eval_size=200", "--mono_size=0", *args]
  subprocess.run(command, cwd=checkout(), check=True, capture_output=True)


def _concatenate(folder: str, train_from: tuple[str, ...], eval_from: str) -> None:
  """A files corpus of the train files of `train_from` one after another, and `eval_from`'s val
  and test files (docs/fine-tuning.md's mixed fine-tuning set)."""
  root = checkout()
  os.makedirs(os.path.join(root, folder), exist_ok=True)
  for lang in ("en", "de"):
    text = "".join(read_file(root, source, f"train.{lang}") for source in train_from)
    write_file(root, folder, f"train.{lang}", text)
    for split in ("val", "test"):
      write_file(root, folder, f"{split}.{lang}", read_file(root, eval_from, f"{split}.{lang}"))
