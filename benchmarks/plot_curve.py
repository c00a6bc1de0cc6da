r"""Plots dev BLEU against minutes of training for a workdir; last line JSON with the points.

python benchmarks/plot_curve.py --workdir=runs/m30k [--out=runs/m30k/learning_curve.png]
python benchmarks/plot_curve.py --workdir=runs/m30k_tiny --metric=dev_multi30k_bleu
"""

import json
import sys

from absl import app, flags

from flaxformer_nmt import errors
from flaxformer_nmt.benchmarking import curves as visualize

flags.DEFINE_string("workdir", None, "Training workdir (reads dev_metrics.jsonl).", required=True)
flags.DEFINE_string("out", "", "PNG path (default <workdir>/learning_curve.png).")
flags.DEFINE_string("title", "", "Plot title.")
flags.DEFINE_string("metric", "dev_bleu", "Dev BLEU plotted (dev_multi30k_bleu: the protocol's).")


def main(argv):
  del argv
  out = flags.FLAGS.out or f"{flags.FLAGS.workdir}/learning_curve.png"
  try:
    points = visualize.plot_learning_curve(
      flags.FLAGS.workdir, out, flags.FLAGS.title, flags.FLAGS.metric
    )
  except errors.UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(json.dumps({"plot": out, "curve": points}))


if __name__ == "__main__":
  app.run(main)
