"""What each `--mode` of main.py does, in terms of the library's pieces."""

from __future__ import annotations

import ml_collections
from absl import logging

from flaxformer_nmt import averaging, checkpoint, parallel, reporting
from flaxformer_nmt import train as train_lib

# Exceptions a user can cause and fix (bad file, bad config value, wrong checkpoint): main.py
# prints these as one line instead of a traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileNotFoundError, train_lib.NonFiniteLossError, checkpoint.CheckpointError,
)


def train(config: ml_collections.ConfigDict, workdir: str) -> None:
  result = train_lib.train_and_evaluate(config, workdir)
  reporting.write_result(workdir, result)


def _inference_run(config, workdir: str, which: str) -> tuple[train_lib.Run, object, str]:
  which = averaging.resolve_inference_source(workdir, which)  # none: fail before any work
  run = train_lib.Run(config, workdir, need_train=False)
  params, description = averaging.load_inference_params(workdir, run.abstract_params(), which)
  logging.info("Using %s.", description)
  return run, params, description


def evaluate(config: ml_collections.ConfigDict, workdir: str, which: str) -> None:
  """BLEU of the test set (greedy and the configured beam), both flavours; last line JSON."""
  run, params, description = _inference_run(config, workdir, which)
  tag = description.split()[0]  # e.g. "averaged" or "step1000"
  result = {"mode": "eval", "checkpoint": description}
  result.update(train_lib.test_scores(run, params, tag=tag))
  reporting.write_result(workdir, result)


def translate(config, workdir: str, which: str, input_path: str, output_path: str) -> None:
  """One translation per input line, in order; progress on stderr.

  Every process reads the input and decodes its share; process 0 writes the output. The figures
  go to `<workdir>/translate_result.json`, and to stdout as a JSON line unless the translations
  themselves go there (`--output=-`).
  """
  from flaxformer_nmt import translate as translate_lib

  lines = translate_lib.read_lines(input_path)  # fails on a bad file before the model loads
  run, params, description = _inference_run(config, workdir, which)
  translator = translate_lib.make_translator(
      run.tokenizer, run.model, params, config.decode, max_src_len=config.data.max_len
  )
  hyps = translator.translate(lines)
  if parallel.is_main_process():
    translate_lib.write_lines(output_path, hyps)
  logging.info("Translated %d lines in %.1fs.", len(lines), translator.stats.seconds)
  result = {"mode": "translate", "input": input_path, "output": output_path,
            "checkpoint": description, **translator.stats.as_dict()}
  reporting.write_result(workdir, result, echo=output_path != "-")


def average(config: ml_collections.ConfigDict, workdir: str, num_checkpoints: int) -> None:
  """Averages the parameters of the last K checkpoints into <workdir>/averaged."""
  available = averaging.training_steps(workdir)
  if num_checkpoints < 1 or num_checkpoints > len(available):
    raise ValueError(
        f"--num_checkpoints={num_checkpoints}, but {checkpoint.checkpoint_dir(workdir)} holds "
        f"{len(available)} checkpoints (steps {available}); raise keep_checkpoints to keep more."
    )
  run = train_lib.Run(config, workdir, need_train=False)
  params, steps = averaging.average_checkpoints(workdir, num_checkpoints, run.abstract_params())
  path = averaging.save_averaged(workdir, params, steps)
  reporting.write_result(workdir, {"mode": "average", "steps": steps, "path": path,
                                   "num_checkpoints": len(steps)})
