"""What each `--mode` does, in terms of the stages: every mode reads downward from here.

Each mode starts the same way (`_begin`: the config's rules, the workdir, the accelerator check),
asks the `Workdir` which checkpoint and files it will use and checks its outputs before any
expensive work, builds the command's one `Components`, reads only the data it needs, ends by
writing its figures into the workdir, and returns them (for `api.py`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
from absl import logging

from flaxformer_nmt import data as data_lib
from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import averaging
from flaxformer_nmt.config import directions, run_config
from flaxformer_nmt.decoding import constraints as constraints_lib
from flaxformer_nmt.decoding import evaluation, translator
from flaxformer_nmt.run import command, selection
from flaxformer_nmt.run import loaded as loaded_model
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import accelerators, files, parallel, records


def _begin(
  config: ml_collections.ConfigDict | None, workdir: str, mode: str
) -> tuple[ml_collections.ConfigDict, Workdir]:
  """What every mode does first (run/command.py: the run's saved config read once, what this
  command may change of it, its paths and data checked), then the one warning line when a GPU or
  TPU is visible but JAX runs on the CPU. Nothing is written but a new training run's folder."""
  run = command.open_run(config, workdir, mode)
  if mode == "eval" and run.saved is not None:
    _say_if_another_test_set(run.config, run.saved)
  accelerators.warn_if_unused()
  return run.config, run.folder


def _say_if_another_test_set(
  config: ml_collections.ConfigDict, saved: ml_collections.ConfigDict
) -> None:
  """One warning line when eval scores a test set other than the run's own (free: docs/runs.md),
  so a --config meant for another run is not taken for this run's figures."""
  ours, theirs = evaluation.test_set_tag(config.data), evaluation.test_set_tag(saved.data)
  if ours != theirs:
    logging.warning(
      "Scoring the test set %s, not the run's own (%s); its files in eval/ are named so.",
      ours.removeprefix("test_"),
      theirs.removeprefix("test_"),
    )


def train(
  config: ml_collections.ConfigDict | None, workdir: str, config_name: str = ""
) -> dict[str, Any]:
  """Trains (or resumes, or returns a finished run's saved figures); see training/loop.py.
  `config_name`: what --config named (`demo`), recorded for messages about the run."""
  from flaxformer_nmt.training import loop  # the training loop: this mode only

  config, run = _begin(config, workdir, "train")
  saved = loop.finished_result(config, run)
  if saved is not None:
    # A rerun of a finished command (a notebook cell after a runtime reset, a repeated job): its
    # saved figures, with nothing trained, decoded or written again, and no lock to wait for.
    logging.info(
      "%s is already trained to step %d with this config: returning the figures saved in "
      "train_result.json, without decoding again (--mode=eval scores it anew).",
      workdir,
      saved["step"],
    )
    records.print_result(saved)
    return saved
  config = config.copy_and_resolve_references()  # the caller's config stays as it was
  # Recorded; a resume keeps it.
  run_config.resolve_dtype(config, parallel.auto_dtype(), resuming=bool(run.training_steps()))
  result = loop.train_and_evaluate(config, run, config_name)
  run.write_result(result)
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
  config, run = _begin(config, workdir, "eval")
  if terms is not None and directions.is_multilingual(config.data):
    raise errors.ConfigError(
      "--constraints with --mode=eval scores one test set; a multilingual run has one per "
      "direction: use --mode=translate --target_lang=X --constraints=FILE."
    )
  loaded = loaded_model.load(config, run, which, members)
  data = data_lib.make_data(
    config, run, need_train=False, eval_splits=("test",), tokenizer=loaded.components.tokenizer
  )
  result: dict[str, Any] = {"mode": "eval", "checkpoint": loaded.description}
  if terms is not None:
    result.update(
      evaluation.constrained_test_scores(
        loaded.components, loaded.params, data, run.eval_dir, loaded.tag, terms, constraints_path
      )
    )
  else:
    result.update(
      evaluation.score_test_set(loaded.components, loaded.params, data, run.eval_dir, loaded.tag)
    )
  run.write_result(result)
  return result


@dataclasses.dataclass(frozen=True)
class Outputs:
  """What --mode=translate writes besides the best translation of each line."""

  nbest: int = 1  # hypotheses per line: > 1 writes TSV (`output_lines`)
  alignments: bool = False  # word alignments (Pharaoh "i-j") from the cross-attention
  members: tuple[str, ...] = ()  # --ensemble: the other workdirs
  target_lang: str | None = None  # --target_lang: a multilingual model's output language
  constraints: str = ""  # --constraints: each line's terms, tab-separated (constraints.py)

  def check(self, config: ml_collections.ConfigDict) -> None:
    """ConfigError for an n-best list the search cannot give, or a language the model has no
    tag for (before any work)."""
    directions.resolve_target(config.data, self.target_lang)
    d = config.decode
    if self.nbest < 1:
      raise errors.ConfigError(f"--nbest={self.nbest}: give 1 or more.")
    if self.nbest > 1 and d.method == "greedy":
      raise errors.ConfigError(
        f"--nbest={self.nbest} with config.decode.method='greedy', which finds one hypothesis; "
        "use 'beam' (nbest <= beam_size) or 'sample'."
      )
    if self.constraints and d.method != "beam":
      raise errors.ConfigError(
        f"--constraints with config.decode.method={d.method!r}: only beam search can be made "
        "to output given terms; use --config.decode.method=beam."
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


def translate_hypotheses(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  lines: list[str],
  outputs: Outputs = Outputs(),
  terms: list[list[str]] | None = None,
) -> tuple[list[list[Any]], dict[str, Any], str]:
  """(each line's translator.Hypothesis list, speed figures, which parameters) of `lines`, with
  config.decode's search; with `terms`, each line's that its translations must contain."""
  config, run = _begin(config, workdir, "translate")
  outputs.check(config)
  loaded = loaded_model.load(config, run, which, outputs.members)
  decoder = translator.make_translator(
    loaded.components,
    loaded.params,
    nbest=outputs.nbest,
    alignments=outputs.alignments,
    target_lang=outputs.target_lang,
  )
  hyps = decoder.translate_nbest(lines, constraints=terms)
  logging.info("Translated %d lines in %.1fs.", len(lines), decoder.stats.seconds)
  return hyps, dict(decoder.stats.as_dict(), method=config.decode.method), loaded.description


def translate(
  config: ml_collections.ConfigDict | None,
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
  if config is not None:
    outputs.check(config)  # before the input is read (translate_hypotheses checks it again)
  files.check_output_file(output_path, "--output")  # before hours of decoding
  lines = files.read_lines(input_path)  # a bad file fails before the model loads
  terms = None
  if outputs.constraints:
    terms = constraints_lib.read_terms(outputs.constraints, len(lines), "--input")
  hyps, stats, description = translate_hypotheses(config, workdir, which, lines, outputs, terms)
  if parallel.is_main_process():
    files.write_lines(output_path, output_lines(hyps, outputs))
  result = {
    "mode": "translate",
    "input": input_path,
    "output": output_path,
    "checkpoint": description,
    "method": stats.pop("method"),
    "nbest": outputs.nbest,
    **stats,
  }
  Workdir(workdir).write_result(result, echo=output_path != files.STDIO)
  return result


def score_pairs(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  sources: list[str],
  references: list[str],
  members: Sequence[str] = (),
  target_lang: str | None = None,
) -> tuple[list[Any], dict[str, Any], str]:
  """(each pair's scoring.PairScore, corpus figures, which parameters): the model's score of
  each given translation (decoding/scoring.py)."""
  from flaxformer_nmt.decoding import scoring

  scoring.check_pairs(sources, references, "sources", "references")
  config, run = _begin(config, workdir, "score")
  lang = directions.resolve_target(config.data, target_lang)
  loaded = loaded_model.load(config, run, which, members)
  parts = translator.ModelParts.of(loaded.components)
  scorer = scoring.Scorer(
    parts,
    loaded.params,
    alpha=float(config.decode.alpha),
    source_prefix=translator.target_prefix(parts, lang),
    reserved_ids=translator.reserved_ids(parts),
  )
  scores = scorer.score(sources, references)
  figures = {
    **scoring.summary(scores),
    "num_truncated": len(scorer.truncated),
    "seconds": scorer.seconds,
  }
  return scores, figures, loaded.description


def score(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  input_path: str,
  reference_path: str,
  output_path: str,
  members: Sequence[str] = (),
  target_lang: str | None = None,
) -> dict[str, Any]:
  """--mode=score: one TSV row per pair (scoring.output_lines: the score the n-best list prints,
  the log-probability, the tokens) to `output_path`; corpus figures to
  `<workdir>/score_result.json` and stdout (unless the rows go there)."""
  from flaxformer_nmt.decoding import scoring

  if config is not None:
    directions.resolve_target(config.data, target_lang)  # before the files are read
  files.check_output_file(output_path, "--output")
  sources = files.read_lines(input_path)
  references = files.read_lines(reference_path)
  scoring.check_pairs(sources, references, f"--input={input_path}", f"--reference={reference_path}")
  scores, figures, description = score_pairs(
    config, workdir, which, sources, references, members, target_lang
  )
  if parallel.is_main_process():
    files.write_lines(output_path, scoring.output_lines(scores))
  result = {
    "mode": "score",
    "input": input_path,
    "reference": reference_path,
    "output": output_path,
    "checkpoint": description,
    **figures,
  }
  Workdir(workdir).write_result(result, echo=output_path != files.STDIO)
  return result


def serving_model(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  members: Sequence[str],
  distributed: str = "auto",
  target_lang: str = "",
) -> loaded_model.LoadedModel:
  """--mode=serve's model: the run checked as every mode checks it, in one process, loaded once
  (serving/launch.py calls this on its loader thread, while the server already listens)."""
  parallel.maybe_initialize_distributed(distributed)
  config, run = _begin(config, workdir, "serve")
  if target_lang:
    directions.resolve_target(config.data, target_lang)  # one line, before the model loads
  if jax.process_count() > 1:
    raise errors.ConfigError(
      f"--mode=serve runs as one process (this job has {jax.process_count()}); start it on "
      "one host without JAX_COORDINATOR_ADDRESS, or with --distributed=off."
    )
  return loaded_model.load(config, run, which, members)


def export(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  fmt: str,
  output: str,
  quantization: str,
) -> dict[str, Any]:
  """Converts the inference parameters and the vocabulary for another engine (CTranslate2) into
  the directory `output`."""
  from flaxformer_nmt.export import ctranslate2  # CTranslate2 is an optional extra

  if fmt not in ctranslate2.FORMATS:
    raise ValueError(f"Unknown export format {fmt!r}.")  # main.py's flag allows no other
  config, run = _begin(config, workdir, "export")
  ctranslate2.check_request(output, quantization, config.model)  # before any work
  loaded = loaded_model.load(config, run, which)
  params = jax.device_get(loaded.params)
  c = loaded.components
  result = ctranslate2.export_ctranslate2(c.model_cfg, params, c.tokenizer, output, quantization)
  logging.info("Exported %s to %s (%s).", loaded.description, output, quantization)
  result = {"mode": "export", "checkpoint": loaded.description, **result}
  run.write_result(result)
  return result


def prepare(config: ml_collections.ConfigDict | None, workdir: str) -> dict[str, Any]:
  """Builds the dataset (TFDS: needs the `[prepare]` extra), checks dev and test, and trains the
  vocabulary into the workdir; see data/prepare.py."""
  from flaxformer_nmt.data import prepare as prepare_lib  # TFDS's builder: this mode only

  config, run = _begin(config, workdir, "prepare")
  result = prepare_lib.prepare(config, run, jax.process_count())
  run.write_result(result)
  return result


def attention(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  which: str,
  text: str,
  output: str,
  target_lang: str | None = None,
) -> dict[str, Any]:
  """PNG heatmaps of every attention (layers x heads) for `text` and its translation, and the
  positional encoding, in `output` (default <workdir>/attention); see attention_pictures.py."""
  from flaxformer_nmt.decoding import attention_pictures, decode  # matplotlib: this mode only
  from flaxformer_nmt.model.tokens import EOS_ID

  if not text.strip():
    raise errors.ConfigError("--text is empty; give the sentence to translate and picture.")
  config, run = _begin(config, workdir, "attention")
  out_dir = output if output and output != files.STDIO else run.attention_dir
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise errors.ConfigError(f"--output={out_dir} exists and is not a directory.")
  prefix_lang = directions.resolve_target(config.data, target_lang)  # before the model loads
  loaded = loaded_model.load(config, run, which)
  c, params = loaded.components, jax.device_get(loaded.params)
  prefix = translator.target_prefix(translator.ModelParts.of(c), prefix_lang)
  source = (prefix + c.tokenizer.encode(text))[: c.max_src_len - 1] + [EOS_ID]
  search = decode.SearchConfig.from_config(config.decode)
  target = attention_pictures.translate_ids(c.model, params, source, search)
  pictures = attention_pictures.write_pictures(
    c.model, params, c.tokenizer.id_to_piece, source, target, out_dir
  )
  result = {
    "mode": "attention",
    "checkpoint": loaded.description,
    "text": text,
    "translation": c.tokenizer.decode(target),
    **pictures,
  }
  run.write_result(result)
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
  config, run = _begin(config, workdir, "average")
  plan = selection.average_plan(run, num_checkpoints, which)  # before any work
  components = Components.load(config, run)
  params = averaging.average(
    run.checkpoints, plan.steps, components.abstract_params, plan.path_in_state
  )
  path = selection.save_average(run, params, plan.steps, plan.of)
  result = {
    "mode": "average",
    "steps": plan.steps,
    "path": path,
    "num_checkpoints": len(plan.steps),
    "of": plan.of,
  }
  run.write_result(result)
  return result
