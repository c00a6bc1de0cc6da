"""What each `--mode` does, in terms of the stages: every mode reads downward from here.

Each mode but import starts the same way (`open_command`: the config's rules, the workdir, the
accelerator check), asks the `Workdir` which checkpoint and files it will use and checks its
outputs before any expensive work, builds the command's one `Components` (a decoding mode: its
one `Session`), reads only the data it needs, ends by writing its figures into the workdir, and
returns them (for `api.py`).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Any

import jax
import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions, run_config
from flaxformer_nmt.decoding import constraints as constraints_lib
from flaxformer_nmt.decoding.requests import Outputs, Request, translation_lines
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.run import command, selection
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import console, files, parallel


def open_command(
  config: ml_collections.ConfigDict | None, workdir: str, mode: str, typed: Collection[str] = ()
) -> command.Run:
  """The run a `mode` command works on, opened once (run/command.py open_run: the run's saved
  config read once, what this command may change of it, its paths and data checked), then the
  one warning line when a GPU or TPU is visible but JAX runs on the CPU. Every mode starts here
  and hands the Run (its folder, config and saved config) downward. Nothing is written but a
  new training run's folder."""
  run = command.open_run(config, workdir, mode, typed)
  if mode == "eval" and run.saved is not None:
    from flaxformer_nmt.decoding import evaluation  # pylint: disable=g-import-not-at-top

    evaluation.say_if_another_test_set(run.config, run.saved)
  console.warn_if_unused()
  return run


def train(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  config_name: str = "",
  typed: Collection[str] = (),
) -> dict[str, Any]:
  """Trains (or resumes, or returns a finished run's saved figures); see training/loop.py.
  `config_name`: what --config named (`demo`), recorded for messages about the run; `typed`: the
  fields the command line set (--config.model.num_heads=8: a fine-tune keeps them or refuses)."""
  from flaxformer_nmt.training import loop  # the training loop: this mode only

  made = Workdir(workdir).first_missing()  # the folders a refused start must not leave
  try:
    return _train(config, workdir, config_name, loop, typed)
  except errors.UserError:
    if made and parallel.is_main_process():  # refused before any work: no empty folder left
      Workdir(workdir).remove_if_empty(made)
    raise


def _train(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  config_name: str,
  loop: Any,
  typed: Collection[str],
) -> dict[str, Any]:
  run = open_command(config, workdir, "train", typed)
  config, folder = run.config, run.folder
  saved = loop.finished_result(config, folder)
  if saved is not None:
    # A rerun of a finished command (a notebook cell after a runtime reset, a repeated job): its
    # saved figures, with nothing trained, decoded or written again, and no lock to wait for.
    logging.info(
      "%s is already trained to step %d with this config: returning the figures saved in "
      "train_result.json, without decoding again (--mode=eval scores it anew).",
      workdir,
      saved["step"],
    )
    files.print_result(saved)
    return saved
  config = config.copy_and_resolve_references()  # the caller's config stays as it was
  # Recorded; a resume keeps it.
  run_config.resolve_dtype(config, parallel.auto_dtype(), resuming=bool(folder.training_steps()))
  result = loop.train_and_evaluate(config, folder, config_name)
  folder.write_result(result)
  return result


def evaluate(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  members: Sequence[str] = (),
  constraints_path: str = "",
) -> dict[str, Any]:
  """BLEU and chrF of the test set (greedy and the configured beam); last line JSON. With
  `members` (--ensemble), of the ensemble of --workdir's model and theirs. With
  `constraints_path` (--constraints), of the beam that must output each sentence's terms."""
  terms = constraints_lib.read_terms(constraints_path) if constraints_path else None
  run = open_command(config, workdir, "eval")
  config, folder = run.config, run.folder
  if terms is not None and directions.is_multilingual(config.data):
    raise errors.ConfigError(
      "--constraints with --mode=eval scores one test set; a multilingual run has one per "
      "direction: use --mode=translate --target_lang=X --constraints=FILE."
    )
  # The test set and its scorers (sacrebleu): eval's alone, not loaded by a translate or the API.
  from flaxformer_nmt.data import pipeline as data_lib  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.decoding import evaluation  # pylint: disable=g-import-not-at-top

  session = Session.of_run(run, which, members)
  data = data_lib.make_data(
    config, folder, need_train=False, eval_splits=("test",), tokenizer=session.components.tokenizer
  )
  result: dict[str, Any] = {"mode": "eval", "checkpoint": session.description}
  if terms is not None:
    result.update(
      evaluation.constrained_test_scores(session, data, folder.eval_dir, terms, constraints_path)
    )
  else:
    result.update(evaluation.score_test_set(session, data, folder.eval_dir))
  folder.write_result(result)
  return result


def load_session(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str = "auto",
  members: Sequence[str] = (),
  mode: str = "translate",
) -> Session:
  """The run in `workdir` checked as `mode` checks it, and the parameters `which` names (with
  the `members` of an ensemble) loaded once: `api.load`'s."""
  return Session.of_run(open_command(config, workdir, mode), which, members)


def decoding_request(
  config: ml_collections.ConfigDict | None, workdir: str, outputs: Outputs
) -> tuple[command.Run, Request]:
  """The run a decoding command works on, opened, and what it asks of it (`outputs`) checked
  once against the run's config: both before any input is read or parameter loaded."""
  run = open_command(config, workdir, "translate")
  return run, outputs.request(run.config)


def translate_hypotheses(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  lines: list[str],
  outputs: Outputs | None = None,
  terms: list[list[str]] | None = None,
) -> tuple[list[list[Any]], dict[str, Any], str]:
  """(each line's translator.Hypothesis list, speed figures, which parameters) of `lines`, with
  config.decode's search; with `terms`, each line's that its translations must contain."""
  outputs = outputs or Outputs()
  run, request = decoding_request(config, workdir, outputs)
  session = Session.of_run(run, which, outputs.members)
  return (*session.translate_checked(request, lines, terms), session.description)


def translate(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  input_path: str,
  output_path: str,
  outputs: Outputs | None = None,
) -> dict[str, Any]:
  """One translation per input line, in order (or n-best TSV: `translation_lines`); progress on
  stderr.

  Every process reads the input and decodes its share; process 0 writes the output. The figures
  go to `<workdir>/translate_result.json`, and to stdout as a JSON line unless the translations
  themselves go there (`--output=-`).
  """
  outputs = outputs or Outputs()
  run, request = decoding_request(config, workdir, outputs)  # the one check of the request
  files.check_output_file(output_path, "--output")  # before hours of decoding
  lines = files.read_lines(input_path)  # a bad file fails before the model loads
  terms = None
  if outputs.constraints:
    terms = constraints_lib.read_terms(outputs.constraints, len(lines), "--input")
  session = Session.of_run(run, which, outputs.members)
  hyps, stats = session.translate_checked(request, lines, terms)
  if parallel.is_main_process():
    files.write_lines(output_path, translation_lines(hyps, outputs))
  result = {
    "mode": "translate",
    "input": input_path,
    "output": output_path,
    "checkpoint": session.description,
    "method": stats.pop("method"),
    "nbest": outputs.nbest,
    **stats,
  }
  run.folder.write_result(result, echo=output_path != files.STDIO)
  return result


def score_pairs(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  sources: list[str],
  references: list[str],
  members: Sequence[str] = (),
  target_lang: str | None = None,
  source_lang: str | None = None,
) -> tuple[list[Any], dict[str, Any], str]:
  """(each pair's scoring.PairScore, corpus figures, which parameters): the model's score of
  each given translation (decoding/scoring.py)."""
  from flaxformer_nmt.decoding import scoring

  scoring.check_pairs(sources, references, "sources", "references")
  run = open_command(config, workdir, "score")
  lang = directions.resolve_target(run.config.data, target_lang)  # once, before the model loads
  source = directions.resolve_source(run.config.data, source_lang)
  session = Session.of_run(run, which, members)
  return (*session.score_checked(lang, sources, references, source), session.description)


def score(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  input_path: str,
  reference_path: str,
  output_path: str,
  members: Sequence[str] = (),
  target_lang: str | None = None,
  source_lang: str | None = None,
) -> dict[str, Any]:
  """--mode=score: one TSV row per pair (scoring.score_rows: the score the n-best list prints,
  the log-probability, the tokens) to `output_path`; corpus figures to
  `<workdir>/score_result.json` and stdout (unless the rows go there)."""
  from flaxformer_nmt.decoding import scoring

  run = open_command(config, workdir, "score")
  lang = directions.resolve_target(run.config.data, target_lang)  # before the files are read
  source = directions.resolve_source(run.config.data, source_lang)
  files.check_output_file(output_path, "--output")
  sources = files.read_lines(input_path)
  references = files.read_lines(reference_path)
  scoring.check_pairs(sources, references, f"--input={input_path}", f"--reference={reference_path}")
  session = Session.of_run(run, which, members)
  scores, figures = session.score_checked(lang, sources, references, source)
  if parallel.is_main_process():
    files.write_lines(output_path, scoring.score_rows(scores))
  result = {
    "mode": "score",
    "input": input_path,
    "reference": reference_path,
    "output": output_path,
    "checkpoint": session.description,
    **figures,
  }
  run.folder.write_result(result, echo=output_path != files.STDIO)
  return result


def serving_model(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  members: Sequence[str],
  distributed: str = "auto",
  target_lang: str = "",
  source_lang: str = "",
) -> Session:
  """--mode=serve's model: the run checked as every mode checks it, in one process, loaded once
  (serving/launch.py calls this on its loader thread, while the server already listens)."""
  parallel.maybe_initialize_distributed(distributed)
  run = open_command(config, workdir, "serve")
  if target_lang:
    directions.resolve_target(run.config.data, target_lang)  # one line, before the model loads
  directions.resolve_source(run.config.data, source_lang or None)  # the same for the input's
  if jax.process_count() > 1:
    raise errors.ConfigError(
      f"--mode=serve runs as one process (this job has {jax.process_count()}); start it on "
      "one host without JAX_COORDINATOR_ADDRESS, or with --distributed=off."
    )
  return Session.of_run(run, which, members)


def export(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  fmt: str,
  output: str,
  quantization: str,
) -> dict[str, Any]:
  """Converts the inference parameters and the vocabulary for another engine into the directory
  `output`: CTranslate2 (export/ctranslate2.py), or transformers' Marian format
  (export/huggingface.py; a many-to-many run: M2M100's, export/m2m100_folder.py); or a LoRA
  run's adapters for PEFT (export/peft.py)."""
  from flaxformer_nmt.export import ctranslate2, huggingface, m2m100_folder, peft  # lazily

  exporters = {"ctranslate2": ctranslate2, "huggingface": huggingface, "peft": peft}
  if fmt not in exporters:  # the flag allows no other; the API may
    raise errors.ConfigError(f"--format={fmt}: choose one of {', '.join(exporters)}.")
  exporter: Any = exporters[fmt]
  run = open_command(config, workdir, "export")
  if exporter is huggingface and m2m100_folder.is_m2m100(run.config):
    exporter = m2m100_folder
  exporter.check_output(output, quantization, run.config.model)  # before any work
  if exporter is peft:
    peft.check_run(run.folder, which)
  session = Session.of_run(run, which)
  result = exporter.write(session, run.folder, output, quantization)
  logging.info("Exported %s to %s (%s).", session.description, output, quantization)
  result = {"mode": "export", "checkpoint": session.description, **result}
  run.folder.write_result(result)
  return result


def import_model(source: str, workdir: str) -> dict[str, Any]:
  """Makes a run in `workdir` from a transformers Marian or M2M100 model folder or Hub id; see
  importing/imported_run.py (which leaves nothing behind when it refuses). The one mode that
  opens no existing run: its door is run/command.py's open_new_run."""
  from flaxformer_nmt.importing import imported_run  # safetensors and the readers

  return imported_run.import_run(source, workdir)


def prepare(config: ml_collections.ConfigDict | None, workdir: str) -> dict[str, Any]:
  """Builds the dataset (TFDS: needs the `[prepare]` extra), checks dev and test, and trains the
  vocabulary into the workdir; see data/prepare.py."""
  from flaxformer_nmt.data import prepare as prepare_lib  # TFDS's builder: this mode only

  run = open_command(config, workdir, "prepare")
  result = prepare_lib.prepare(run.config, run.folder, jax.process_count())
  run.folder.write_result(result)
  return result


def attention(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  text: str,
  output: str | None,
  target_lang: str | None = None,
  source_lang: str | None = None,
) -> dict[str, Any]:
  """PNG heatmaps of every attention (layers x heads) for `text` and its translation, and the
  positional encoding, in `output` (default <workdir>/attention); see attention_pictures.py."""
  if not text.strip():
    raise errors.ConfigError("--text is empty; give the sentence to translate and picture.")
  if output and output != files.STDIO and os.path.exists(output) and not os.path.isdir(output):
    raise errors.ConfigError(f"--output={output} exists and is not a directory.")
  run = open_command(config, workdir, "attention")
  languages = (target_lang, source_lang)
  directions.resolve_target(run.config.data, target_lang)  # one line, before the model loads
  directions.resolve_source(run.config.data, source_lang)
  session = Session.of_run(run, which)
  pictures = session.attention(text, None if output == files.STDIO else output, *languages)
  result = {"mode": "attention", "checkpoint": session.description, "text": text, **pictures}
  run.folder.write_result(result)
  return result


def average(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  num_checkpoints: int,
  which: str = "auto",
) -> dict[str, Any]:
  """Averages the parameters of the last K checkpoints into <workdir>/averaged (`which`="best":
  the last K up to the best step; "ema": the parameter averages of the last K); the average
  written last is what --checkpoint=averaged reads."""
  from flaxformer_nmt.checkpoints import averaging  # pylint: disable=g-import-not-at-top

  run = open_command(config, workdir, "average")
  config, folder = run.config, run.folder
  plan = selection.average_plan(folder, num_checkpoints, which)  # before any work
  components = Components.load(config, folder)
  params = averaging.average(
    folder.checkpoints, plan.steps, components.abstract_params, plan.path_in_state
  )
  path = selection.save_average(folder, params, plan.steps, plan.of)
  result = {
    "mode": "average",
    "steps": plan.steps,
    "path": path,
    "num_checkpoints": len(plan.steps),
    "of": plan.of,
  }
  folder.write_result(result)
  return result
