r"""Estimated training time of the paper's WMT14 recipes (Table 2), from FLOPs and device peaks.

  python benchmarks/recipe_cost.py                 # at 40% MFU
  python benchmarks/recipe_cost.py --mfu=0.3

An estimate, not a measurement: steps x the analytic FLOPs of one step (flaxformer_nmt/flops.py, the
count train_step.py checks against XLA's cost analysis) / (devices x dense bf16 peak x MFU). The
MFU is an assumption (the flag); measure yours with `python benchmarks/train_step.py --size=base`
on the device and pass it. Evaluation and checkpointing time are not included, nor what keeps a
fast machine from its compute: 25,000 tokens split 8 ways is ~3,100 tokens per device, a step of
a few milliseconds on an H100, which needs the input pipeline to feed ~10M tokens/s and leaves
launch overheads exposed. Last line: JSON.
"""

from __future__ import annotations

import json

from absl import app, flags

from flaxformer_nmt import config_lib, flops

FLAGS = flags.FLAGS
flags.DEFINE_float("mfu", 0.40, "Assumed model FLOPs utilisation of the train step.")

# (config file, size, steps, vocabulary): the paper's Table 2 runs as configs/ sets them.
RECIPES = {
  "wmt14_ende_base": ("base", 100_000, 37_000),
  "wmt14_ende_big": ("big", 300_000, 37_000),
  "wmt14_enfr_big": ("big", 300_000, 32_000),
}
# Dense bf16 TFLOP/s per chip (vendor figures) and chips per machine.
MACHINES = {
  "1x H100 SXM": (989.0, 1),
  "8x H100 SXM": (989.0, 8),
  "TPU v4-8 (4 chips)": (275.0, 4),
  "Colab TPU v5e-1": (197.0, 1),
}
TOKENS_PER_STEP = 25_000  # source and target tokens per update, as the paper
ROW_LEN = 256  # data.max_len of the WMT14 configs: attention spans whole packed rows


def step_flops(size: str, vocab: int) -> float:
  s = config_lib.SIZES[size]
  return flops.train_step_flops(
    num_layers=s.num_layers,
    d_model=s.d_model,
    d_ff=s.d_ff,
    vocab_size=vocab,
    src_tokens=TOKENS_PER_STEP,
    tgt_tokens=TOKENS_PER_STEP,
    row_len=ROW_LEN,
  )


def main(argv: list[str]) -> None:
  del argv
  if not 0.0 < FLAGS.mfu <= 1.0:
    raise app.UsageError(f"--mfu must be in (0, 1], got {FLAGS.mfu}.")
  rows = []
  print(f"Estimated training hours at {FLAGS.mfu:.0%} MFU (compute only):")
  print(f"{'recipe':<18} {'TFLOP/step':>10} {'total EFLOP':>11}  " + "  ".join(MACHINES))
  for name, (size, steps, vocab) in RECIPES.items():
    per_step = step_flops(size, vocab)
    hours = {
      machine: steps * per_step / (chips * peak * 1e12 * FLAGS.mfu) / 3600
      for machine, (peak, chips) in MACHINES.items()
    }
    print(
      f"{name:<18} {per_step / 1e12:>10.2f} {steps * per_step / 1e18:>11.2f}  "
      + "  ".join(f"{hours[m]:>{len(m)}.2f}" for m in MACHINES)
    )
    rows.append(
      {
        "recipe": name,
        "steps": steps,
        "tokens_per_step": TOKENS_PER_STEP,
        "tflop_per_step": round(per_step / 1e12, 3),
        "hours": {m: round(h, 2) for m, h in hours.items()},
      }
    )
  result = {"benchmark": "recipe_cost", "estimate": True, "mfu": FLAGS.mfu, "recipes": rows}
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
