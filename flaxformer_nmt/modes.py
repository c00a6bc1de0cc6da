"""What each `--mode` of main.py does, in terms of the library's pieces.

Each mode validates the config and checks its inputs before any expensive work, reads only the
data it needs (`Run(data=...)`), ends by writing its figures (`reporting.write_result`), and
returns them (for `api.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import averaging
from flaxformer_nmt.components import Run, check_checkpoint_fits, check_workdir
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.decoding import decode, ensemble
from flaxformer_nmt.runtime import accelerators, files, parallel
from flaxformer_nmt.runtime import records as reporting


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (or resumes, or returns a finished run's saved figures); see train.py."""
  from flaxformer_nmt.training import loop as train_lib  # the training loop: this mode only

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
  config: ml_collections.ConfigDict,
  workdir: str,
  which: str,
  data: str,
  members: Sequence[str] = (),
) -> tuple[Run, object, str]:
  """(the Run, the parameters, where they came from) for an inference mode. With `members`
  (--ensemble), the parameters are a decode.Ensemble of --workdir's model and theirs."""
  config_lib.validate(config)
  check_workdir(workdir)
  accelerators.warn_if_unused()
  requested, which = which, averaging.resolve_inference_source(workdir, which)  # fails early
  check_checkpoint_fits(config, workdir, averaging.inference_dir(workdir, which))
  # Each member applies the requested rule in its own workdir ("auto": its own averaged or not).
  checked = ensemble.check_members(config, workdir, members, requested) if members else []
  run = Run(config, workdir, data=data)
  params, description = averaging.load_inference_params(workdir, run.abstract_params(), which)
  if checked:
    loaded = ensemble.load_members(checked, run.abstract_params())
    params = decode.Ensemble((params, *(p for p, _ in loaded)))
    description = f"ensemble of {len(loaded) + 1} models: " + "; ".join(
      [description, *(f"{m}: {d}" for (m, _), (_, d) in zip(checked, loaded, strict=True))]
    )
  logging.info("Using %s.", description)
  return run, params, description


def evaluate(
  config: ml_collections.ConfigDict, workdir: str, which: str, members: Sequence[str] = ()
) -> dict[str, Any]:
  """BLEU and chrF of the test set (greedy and the configured beam); last line JSON. With
  `members` (--ensemble), of the ensemble of --workdir's model and theirs."""
  run, params, description = _inference_run(config, workdir, which, "test", members)
  tag = description.split()[0]  # e.g. "averaged" or "step1000"
  if members:
    tag = f"ensemble{len(members) + 1}_{which}"
  result = {"mode": "eval", "checkpoint": description}
  result.update(run.test_scores(params, tag))
  reporting.write_result(workdir, result)
  return result


@dataclasses.dataclass(frozen=True)
class Outputs:
  """What --mode=translate writes besides the best translation of each line."""

  nbest: int = 1  # hypotheses per line: > 1 writes TSV (`output_lines`)
  alignments: bool = False  # word alignments (Pharaoh "i-j") from the cross-attention
  members: tuple[str, ...] = ()  # --ensemble: the other workdirs

  def check(self, config: ml_collections.ConfigDict) -> None:
    """ConfigError for an n-best list the search cannot give (before any work)."""
    d = config.decode
    if self.nbest < 1:
      raise errors.ConfigError(f"--nbest={self.nbest}: give 1 or more.")
    if self.nbest > 1 and d.method == "greedy":
      raise errors.ConfigError(
        f"--nbest={self.nbest} with config.decode.method='greedy', which finds one hypothesis; "
        "use 'beam' (nbest <= beam_size) or 'sample'."
      )
    if self.nbest > d.beam_size and d.method == "beam":
      raise errors.ConfigError(
        f"--nbest={self.nbest} is more than config.decode.beam_size={d.beam_size}: beam search "
        f"finds at most beam_size hypotheses; raise the beam or lower --nbest."
      )


def output_lines(hypotheses: list[list[Any]], outputs: Outputs) -> list[str]:
  """The output file's lines. One best translation per input line (with " ||| " and its
  alignment, if asked); with n-best, TSV rows: input line (0-based), rank (0 = best), the score
  the search ranks by, hypothesis (and alignment), exactly n rows per input line, in order."""
  if outputs.nbest == 1:
    return [
      h[0].text + (f" ||| {h[0].alignment}" if outputs.alignments else "") for h in hypotheses
    ]
  rows = []
  for i, hyps in enumerate(hypotheses):
    for rank, h in enumerate(hyps):
      fields = [str(i), str(rank), f"{h.score:.6f}", h.text.replace("\t", " ")]
      rows.append("\t".join(fields + ([h.alignment] if outputs.alignments else [])))
  return rows


def translate_lines(
  config: ml_collections.ConfigDict,
  workdir: str,
  which: str,
  lines: list[str],
  outputs: Outputs = Outputs(),
) -> tuple[list[list[Any]], dict[str, Any], str]:
  """(each line's translate.Hypothesis list, speed figures, which parameters) of `lines`, with
  config.decode's search."""
  from flaxformer_nmt.decoding import translator as translate_lib

  outputs.check(config)
  run, params, description = _inference_run(config, workdir, which, "none", outputs.members)
  translator = translate_lib.make_translator(
    run.tokenizer,
    run.model,
    params,
    config.decode,
    max_src_len=config.data.max_len,
    nbest=outputs.nbest,
    alignments=outputs.alignments,
  )
  hyps = translator.translate_nbest(lines)
  logging.info("Translated %d lines in %.1fs.", len(lines), translator.stats.seconds)
  return hyps, translator.stats.as_dict(), description


def translate(
  config: ml_collections.ConfigDict,
  workdir: str,
  which: str,
  input_path: str,
  output_path: str,
  outputs: Outputs = Outputs(),
) -> dict[str, Any]:
  """One translation per input line, in order (or n-best TSV, `output_lines`); progress on stderr.

  Every process reads the input and decodes its share; process 0 writes the output. The figures
  go to `<workdir>/translate_result.json`, and to stdout as a JSON line unless the translations
  themselves go there (`--output=-`).
  """
  outputs.check(config)
  lines = files.read_lines(input_path)  # a bad file fails before the model loads
  hyps, stats, description = translate_lines(config, workdir, which, lines, outputs)
  if parallel.is_main_process():
    files.write_lines(output_path, output_lines(hyps, outputs))
  result = {
    "mode": "translate",
    "input": input_path,
    "output": output_path,
    "checkpoint": description,
    "method": config.decode.method,
    "nbest": outputs.nbest,
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
  from flaxformer_nmt.export import ctranslate2 as export_lib

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
  from flaxformer_nmt.data import prepare as prepare_lib

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

  from flaxformer_nmt import errors
  from flaxformer_nmt.decoding import attention_pictures as attention_lib
  from flaxformer_nmt.decoding import decode
  from flaxformer_nmt.model.tokens import EOS_ID

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
  config: ml_collections.ConfigDict, workdir: str, num_checkpoints: int, which: str = "auto"
) -> dict[str, Any]:
  """Averages the parameters of the last K checkpoints into <workdir>/averaged (`which`="best":
  the last K up to the best step; "ema": the parameter averages of the last K)."""
  config_lib.validate(config)
  check_workdir(workdir)
  averaging.check_num_checkpoints(workdir, num_checkpoints, which)  # before any work
  accelerators.warn_if_unused()
  run = Run(config, workdir, data="none")
  params, steps = averaging.average_checkpoints(
    workdir, num_checkpoints, run.abstract_params(), which
  )
  path = averaging.save_averaged(workdir, params, steps, "ema" if which == "ema" else "params")
  result = {
    "mode": "average",
    "steps": steps,
    "path": path,
    "num_checkpoints": len(steps),
    "of": "ema" if which == "ema" else "params",
  }
  reporting.write_result(workdir, result)
  return result
