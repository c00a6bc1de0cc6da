"""What each `--mode` of main.py does, in terms of the library's pieces.

Each mode validates the config and checks its inputs before any expensive work, reads only the
data it needs (`Run(data=...)`), ends by writing its figures (`reporting.write_result`), and
returns them (for `api.py`).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
from absl import logging

from flaxformer_nmt import accelerators, averaging, config_lib, files, parallel, reporting
from flaxformer_nmt.run import Run, check_checkpoint_fits, check_workdir


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (or resumes, or returns a finished run's saved figures); see train.py."""
  from flaxformer_nmt import train as train_lib  # the training loop: this mode only

  config_lib.validate(config)
  check_workdir(workdir)
  saved = train_lib.finished_result(config, workdir)
  if saved is not None:
    # A rerun of a finished command (a notebook cell after a runtime reset, a repeated job): its
    # saved figures, with nothing trained, decoded or written again, and no lock to wait for.
    logging.info(
      "%s is already trained to step %d with this config: returning the figures saved in "
      "train_result.json, without decoding again (--mode=eval scores it anew).",
      workdir,
      saved["step"],
    )
    reporting.print_result(saved)
    return saved
  accelerators.warn_if_unused()
  result = train_lib.train_and_evaluate(config, workdir)
  reporting.write_result(workdir, result)
  return result


def _inference_run(
  config: ml_collections.ConfigDict, workdir: str, which: str, data: str
) -> tuple[Run, object, str]:
  config_lib.validate(config)
  check_workdir(workdir)
  accelerators.warn_if_unused()
  which = averaging.resolve_inference_source(workdir, which)  # none: fail before any work
  check_checkpoint_fits(config, workdir, averaging.inference_dir(workdir, which))
  run = Run(config, workdir, data=data)
  params, description = averaging.load_inference_params(workdir, run.abstract_params(), which)
  logging.info("Using %s.", description)
  return run, params, description


def evaluate(config: ml_collections.ConfigDict, workdir: str, which: str) -> dict[str, Any]:
  """BLEU of the test set (greedy and the configured beam), both flavours; last line JSON."""
  run, params, description = _inference_run(config, workdir, which, data="test")
  tag = description.split()[0]  # e.g. "averaged" or "step1000"
  result = {"mode": "eval", "checkpoint": description}
  result.update(run.test_scores(params, tag))
  reporting.write_result(workdir, result)
  return result


def translate_lines(
  config: ml_collections.ConfigDict, workdir: str, which: str, lines: list[str]
) -> tuple[list[str], dict[str, Any], str]:
  """(translations, speed figures, which parameters) of `lines`, with config.decode's search."""
  from flaxformer_nmt import translate as translate_lib

  run, params, description = _inference_run(config, workdir, which, data="none")
  translator = translate_lib.make_translator(
    run.tokenizer, run.model, params, config.decode, max_src_len=config.data.max_len
  )
  hyps = translator.translate(lines)
  logging.info("Translated %d lines in %.1fs.", len(lines), translator.stats.seconds)
  return hyps, translator.stats.as_dict(), description


def translate(
  config: ml_collections.ConfigDict, workdir: str, which: str, input_path: str, output_path: str
) -> dict[str, Any]:
  """One translation per input line, in order; progress on stderr.

  Every process reads the input and decodes its share; process 0 writes the output. The figures
  go to `<workdir>/translate_result.json`, and to stdout as a JSON line unless the translations
  themselves go there (`--output=-`).
  """
  lines = files.read_lines(input_path)  # a bad file fails before the model loads
  hyps, stats, description = translate_lines(config, workdir, which, lines)
  if parallel.is_main_process():
    files.write_lines(output_path, hyps)
  result = {
    "mode": "translate",
    "input": input_path,
    "output": output_path,
    "checkpoint": description,
    **stats,
  }
  reporting.write_result(workdir, result, echo=output_path != files.STDIO)
  return result


def export(
  config: ml_collections.ConfigDict,
  workdir: str,
  which: str,
  fmt: str,
  output: str,
  quantization: str,
) -> dict[str, Any]:
  """Converts the inference parameters (averaged when present) and the vocabulary for another
  engine (`export.FORMATS`: CTranslate2) into the directory `output`."""
  from flaxformer_nmt import export as export_lib

  if fmt not in export_lib.FORMATS:
    raise ValueError(f"Unknown export format {fmt!r}.")  # main.py's flag allows no other
  export_lib.check_request(output, quantization)  # before any work
  run, params, description = _inference_run(config, workdir, which, data="none")
  params = jax.device_get(params)
  result = export_lib.export_ctranslate2(run.model_cfg, params, run.tokenizer, output, quantization)
  logging.info("Exported %s to %s (%s).", description, output, quantization)
  result = {"mode": "export", "checkpoint": description, **result}
  reporting.write_result(workdir, result)
  return result


def prepare(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Builds the dataset (TFDS: needs the `[prepare]` extra), checks dev and test, and trains the
  vocabulary into the workdir; see prepare.py."""
  from flaxformer_nmt import prepare as prepare_lib

  config_lib.validate(config)
  check_workdir(workdir)
  accelerators.warn_if_unused()
  result = prepare_lib.prepare(config, workdir, jax.process_count())
  reporting.write_result(workdir, result)
  return result


def attention(
  config: ml_collections.ConfigDict, workdir: str, which: str, text: str, output: str
) -> dict[str, Any]:
  """PNG heatmaps of every attention (layers x heads) for `text` and its translation, and the
  positional encoding, in `output` (default <workdir>/attention); see attention.py."""
  import os

  from flaxformer_nmt import attention as attention_lib
  from flaxformer_nmt import decode, errors
  from flaxformer_nmt.tokenizer import EOS_ID

  if not text.strip():
    raise errors.ConfigError("--text is empty; give the sentence to translate and picture.")
  out_dir = output if output and output != files.STDIO else os.path.join(workdir, "attention")
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise errors.ConfigError(f"--output={out_dir} exists and is not a directory.")
  run, params, description = _inference_run(config, workdir, which, data="none")
  params = jax.device_get(params)
  source = run.tokenizer.encode(text)[: config.data.max_len - 1] + [EOS_ID]
  search = decode.SearchConfig.from_config(config.decode)
  target = attention_lib.translate_ids(run.model, params, source, search)
  pictures = attention_lib.write_pictures(
    run.model, params, run.tokenizer.id_to_piece, source, target, out_dir
  )
  result = {
    "mode": "attention",
    "checkpoint": description,
    "text": text,
    "translation": run.tokenizer.decode(target),
    **pictures,
  }
  reporting.write_result(workdir, result)
  return result


def average(
  config: ml_collections.ConfigDict, workdir: str, num_checkpoints: int
) -> dict[str, Any]:
  """Averages the parameters of the last K checkpoints into <workdir>/averaged."""
  config_lib.validate(config)
  check_workdir(workdir)
  averaging.check_num_checkpoints(workdir, num_checkpoints)  # before any work
  accelerators.warn_if_unused()
  run = Run(config, workdir, data="none")
  params, steps = averaging.average_checkpoints(workdir, num_checkpoints, run.abstract_params())
  path = averaging.save_averaged(workdir, params, steps)
  result = {"mode": "average", "steps": steps, "path": path, "num_checkpoints": len(steps)}
  reporting.write_result(workdir, result)
  return result
