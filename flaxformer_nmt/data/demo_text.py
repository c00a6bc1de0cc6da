r"""The demo corpus written out as text files, for recipes that work on files (back-translation).

  python -m flaxformer_nmt.data.demo_text --output_dir=data/demo_text

writes `train`, `val` and `test` `.en` / `.de` (what `config.data.source=files` reads with its
default prefixes) and `mono.de`: German sentences alone, the German side of training-split pairs
drawn with another seed, standing in for the monolingual target-side text that back-translation
turns into extra training pairs. The last line is JSON: the files and their line counts.

  python -m flaxformer_nmt.data.demo_text --output_dir=data/demo_large --variant=large \
    --train_size=2000 --eval_size=200 --mono_size=0

writes the shifted domain instead (5- and 6-digit numbers, which the standard corpus never holds),
a small set to fine-tune the demo model on (docs/fine-tuning.md).
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from flaxformer_nmt.data import demo
from flaxformer_nmt.runtime import files

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Folder for the files.", required=True)
_TRAIN_SIZE = flags.DEFINE_integer("train_size", 20_000, "Training pairs.")
_EVAL_SIZE = flags.DEFINE_integer("eval_size", 500, "Pairs in val and in test each.")
_MONO_SIZE = flags.DEFINE_integer("mono_size", 20_000, "German-only lines in mono.de (0: none).")
_SEED = flags.DEFINE_integer("seed", 0, "The corpus's seed (mono.de uses seed + 1).")
_VARIANT = flags.DEFINE_enum(
  "variant", "standard", list(demo.VARIANTS), "standard: the demo corpus; large: 5-6 digit numbers."
)


def write_demo_text(
  output_dir: str, sizes: dict[str, int], mono_size: int, seed: int, variant: str = "standard"
) -> dict:
  """The files, as the module docstring says; returns {file name: lines}."""
  os.makedirs(output_dir, exist_ok=True)
  written = {}
  for prefix, split in (("train", "train"), ("val", "dev"), ("test", "test")):
    pairs = demo.make_demo_split(split, sizes[split], seed, variant)
    for index, lang in ((0, "en"), (1, "de")):
      name = f"{prefix}.{lang}"
      files.write_lines(os.path.join(output_dir, name), [p[index] for p in pairs])
      written[name] = len(pairs)
  if mono_size:  # 0: no monolingual file (a set to fine-tune on needs none)
    mono = [de for _, de in demo.make_demo_split("train", mono_size, seed + 1, variant)]
    files.write_lines(os.path.join(output_dir, "mono.de"), mono)
    written["mono.de"] = mono_size
  return written


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}.")
  sizes = {"train": _TRAIN_SIZE.value, "dev": _EVAL_SIZE.value, "test": _EVAL_SIZE.value}
  if min(sizes.values()) < 1 or _MONO_SIZE.value < 0:
    raise app.UsageError("--train_size and --eval_size must be >= 1, --mono_size >= 0.")
  written = write_demo_text(_OUTPUT_DIR.value, sizes, _MONO_SIZE.value, _SEED.value, _VARIANT.value)
  print(json.dumps({"output_dir": _OUTPUT_DIR.value, "lines": written}))


if __name__ == "__main__":
  app.run(main)
