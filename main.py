r"""flaxformer_nmt command line: train, eval, translate, average.

  python main.py --config=configs/demo.py --workdir=runs/demo
  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base
  python main.py --config=... --workdir=... --mode=eval
  python main.py --config=... --workdir=... --mode=translate --input=in.txt --output=out.txt
  python main.py --config=... --workdir=... --mode=average --num_checkpoints=5

Any config field can be overridden, e.g. `--config.data.tokens_per_batch=12500`. Rerunning a
training command with the same workdir resumes. Modes that report figures end with one JSON line.
"""

from __future__ import annotations

import logging as pylogging
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, vocabulary, logs and outputs.")
flags.DEFINE_enum("mode", "train", ["train", "eval", "translate", "average"], "What to do.")
flags.DEFINE_string("input", "-", "translate: source file, one sentence per line ('-' = stdin).")
flags.DEFINE_string("output", "-", "translate: output file ('-' = stdout).")
flags.DEFINE_integer("num_checkpoints", 5, "average: how many of the latest checkpoints.")
flags.DEFINE_enum("checkpoint", "auto", ["auto", "latest", "averaged"],
                  "eval/translate: which parameters (auto = averaged if present, else latest).")
flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                  "Multi-process runs (jax.distributed): 'auto' joins one where JAX detects a "
                  "cluster of several processes (TPU pod slice, SLURM, Open MPI, Kubernetes) or "
                  "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID are set; 'on' "
                  "always calls jax.distributed.initialize(); 'off' never.")
flags.mark_flags_as_required(["config", "workdir"])


class _QuietLibraries(pylogging.Filter):
  """Drops INFO chatter of orbax (about 20 lines per checkpoint) so progress lines stay readable."""

  def filter(self, record: pylogging.LogRecord) -> bool:
    return record.levelno >= pylogging.WARNING or "/orbax/" not in record.pathname


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  # Imported here so `--help` and flag errors are instant (jax start-up takes seconds).
  from flaxformer_nmt import modes, parallel

  logging.get_absl_handler().addFilter(_QuietLibraries())

  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  try:
    parallel.maybe_initialize_distributed(flags.FLAGS.distributed)
    if flags.FLAGS.mode == "train":
      modes.train(config, workdir)
    elif flags.FLAGS.mode == "eval":
      modes.evaluate(config, workdir, flags.FLAGS.checkpoint)
    elif flags.FLAGS.mode == "translate":
      modes.translate(config, workdir, flags.FLAGS.checkpoint, flags.FLAGS.input,
                      flags.FLAGS.output)
    elif flags.FLAGS.mode == "average":
      modes.average(config, workdir, flags.FLAGS.num_checkpoints)
  except modes.USER_ERRORS as e:
    # A mistake the user can fix: one clear line, no traceback, nothing saved is touched.
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  app.run(main)
