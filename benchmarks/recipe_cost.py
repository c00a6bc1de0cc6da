r"""Estimated training time of the paper's WMT14 recipes (Table 2), from FLOPs and device peaks.

  python benchmarks/recipe_cost.py                 # at 40% MFU
  python benchmarks/recipe_cost.py --mfu=0.3
  python benchmarks/recipe_cost.py --tpu_estimate  # TPUs: the TPU compiler's own step estimate

An estimate, not a measurement: steps x the analytic FLOPs of one step
(flaxformer_nmt/benchmarking/flops.py, the count train_step.py checks against XLA's cost analysis) /
(devices x dense bf16 peak x MFU). The MFU is an assumption (the flag); measure yours with `python
benchmarks/train_step.py --size=base` on the device and pass it. Evaluation and checkpointing time
are not included, nor what keeps a fast machine from its compute: 25,000 tokens split 8 ways is
~3,100 tokens per device, a step of a few milliseconds on an H100, which needs the input pipeline to
feed ~10M tokens/s and leaves launch overheads exposed.

With --tpu_estimate (libtpu needed, no TPU), the TPU machines' hours come instead from the TPU
compiler's estimate of the real step (benchmarks/step_estimate.py,
flaxformer_nmt/benchmarking/tpu_estimate.py) for one chip holding its share of the batch (25,000 /
chips tokens, rows of 256): steps x that estimate. Still an estimate: the gradient all-reduce
between chips, evaluation and checkpoints are not in it. GPUs keep the assumed MFU (no GPU compiler
runs without a GPU). Last line: JSON.
"""

from __future__ import annotations

from absl import app, flags

from flaxformer_nmt.benchmarking import flops, record
from flaxformer_nmt.config import builders as config_lib

FLAGS = flags.FLAGS
flags.DEFINE_float("mfu", 0.40, "Assumed model FLOPs utilisation of the train step.")
flags.DEFINE_bool("tpu_estimate", False, "TPU hours from the TPU compiler's step estimate.")
flags.DEFINE_list("recipes", ["wmt14_ende_base"], "With --tpu_estimate: the recipes to compile.")

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
  "TPU v5p-8 (4 chips)": (459.0, 4),
}
TPU_CHIPS = {"TPU v4-8 (4 chips)": "v4", "Colab TPU v5e-1": "v5e", "TPU v5p-8 (4 chips)": "v5p"}
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


def estimated_step_ms(size: str, vocab: int, chip_name: str, chips: int) -> float | None:
  """The TPU compiler's estimate of one chip's step on its share of the batch (milliseconds)."""
  import step_estimate  # pylint: disable=g-import-not-at-top  (beside this script)

  from flaxformer_nmt.benchmarking import tpu_estimate
  from flaxformer_nmt.model import transformer as model  # pylint: disable=g-import-not-at-top

  c = config_lib.base_config(size)
  c.model.dtype = "bfloat16"  # what "auto" is on a TPU
  cfg = model.TransformerConfig.from_config(c.model, vocab)
  rows = max(TOKENS_PER_STEP // chips // ROW_LEN, 1)
  chip = tpu_estimate.CHIPS[chip_name]
  return step_estimate.estimate_step(c, cfg, rows, ROW_LEN, chip, pieces=False)["step"]["est_ms"]


def main(argv: list[str]) -> None:
  del argv
  if not 0.0 < FLAGS.mfu <= 1.0:
    raise app.UsageError(f"--mfu must be in (0, 1], got {FLAGS.mfu}.")
  rows = []
  note = ""
  if FLAGS.tpu_estimate:
    note = f"; TPU columns of {', '.join(FLAGS.recipes)}: steps x the TPU compiler's step estimate"
  print(f"Estimated training hours at {FLAGS.mfu:.0%} MFU (compute only{note}):")
  print(f"{'recipe':<18} {'TFLOP/step':>10} {'total EFLOP':>11}  " + "  ".join(MACHINES))
  for name, (size, steps, vocab) in RECIPES.items():
    per_step = step_flops(size, vocab)
    hours = {
      machine: steps * per_step / (chips * peak * 1e12 * FLAGS.mfu) / 3600
      for machine, (peak, chips) in MACHINES.items()
    }
    estimated = {}
    if FLAGS.tpu_estimate and name in FLAGS.recipes:
      for machine, chip_name in TPU_CHIPS.items():
        ms = estimated_step_ms(size, vocab, chip_name, MACHINES[machine][1])
        estimated[machine] = ms
        hours[machine] = steps * ms / 1e3 / 3600 if ms else float("nan")
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
        # Machines whose hours are steps x the TPU compiler's step estimate (ms), not the MFU.
        "tpu_estimated_step_ms": estimated,
      }
    )
  result = {
    "benchmark": "recipe_cost",
    "estimate": True,
    "mfu": FLAGS.mfu,
    "tpu_estimate": FLAGS.tpu_estimate,
    "recipes": rows,
  }
  record.report(result)


if __name__ == "__main__":
  app.run(main)
