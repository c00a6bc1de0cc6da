"""The Python API: every `--mode` of main.py as a function, for notebooks and scripts.

absl flags cannot be parsed inside a notebook kernel, so this module takes configs and plain
arguments instead. Each function does exactly what its `--mode` does (the same code, `modes.py`):
validates first, writes its figures into the workdir, and returns them as a dict.

  from flaxformer_nmt import api
  config = api.load_config("demo", {"num_train_steps": 300})
  api.train(config, "runs/demo")
  api.evaluate(config, "runs/demo")["test_sacrebleu_beam4"]
  model = api.load("runs/demo")                    # loaded once: many calls, compiled once
  model.translate(["We need forty-two chairs."])

Rerunning `train` with the same workdir resumes from its latest checkpoint, as the command does.
Once a run has saved its config.json, `config` may be None: the run's own config is used
(`api.evaluate(None, "runs/demo")`), and a config given is held to the run's rules
(docs/runs.md: what a command may change).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders
from flaxformer_nmt.config.choices import CHECKPOINTS  # noqa: F401  (the checkpoint= choices)
from flaxformer_nmt.runtime import console

if TYPE_CHECKING:
  from flaxformer_nmt.decoding.session import Session


def _modes() -> ModuleType:
  """modes.py, imported by the first call that runs a mode: importing the API (for a config,
  say) loads neither JAX nor the model, the searches or the checkpoint reader."""
  return importlib.import_module("flaxformer_nmt.modes")


def load_config(
  name_or_path: str, overrides: Mapping[str, Any] | None = None
) -> ml_collections.ConfigDict:
  """An installed config by name (`demo`, `wmt14_ende_base:files`) or any config file by path
  (`path.py:argument` allowed), with overrides.

  overrides: {"num_train_steps": 300, "model.dtype": "float32", ...}, the dotted names of
  `--config.<name>=value`. An unknown name is a ConfigError naming it; the result is validated.
  """
  from flaxformer_nmt.config import loading  # pylint: disable=g-import-not-at-top (configs/)

  config = loading.load(name_or_path)
  for name, value in (overrides or {}).items():
    builders.set_field(config, name, value)
  builders.validate(config)
  return config


def precision() -> dict[str, Any]:
  """What `model.dtype="auto"` trains in on this machine: {"device", "platform",
  "compute_capability", "dtype", "loss_scale"}. bfloat16 on TPUs and on GPUs from compute
  capability 8.0 (A100, L4, H100), float16 with a dynamic loss scale on older GPUs (Colab's T4,
  V100), float32 on CPUs. A run records what it resolved in its config.json and keeps it."""
  from flaxformer_nmt.runtime import parallel  # pylint: disable=g-import-not-at-top

  return parallel.precision()


def load_run_config(
  workdir: str, overrides: Mapping[str, Any] | None = None
) -> ml_collections.ConfigDict:
  """The config a trained run saved (`<workdir>/config.json`, with its types), with `overrides`
  ({"decode.beam_size": 8}); every mode then holds it to the run's rules (docs/runs.md), so only
  what a command may change should differ. ConfigError if the run saved none."""
  from flaxformer_nmt.run import saved_config  # pylint: disable=g-import-not-at-top

  config = saved_config.get_config(workdir)
  for path, value in (overrides or {}).items():
    builders.set_field(config, path, value)
  return config


def load(
  workdir: str,
  checkpoint: str = "auto",
  overrides: Mapping[str, Any] | None = None,
  ensemble: Sequence[str] | str = (),
) -> Session:
  """The run in `workdir` loaded once, for many calls: `.translate(lines, target_lang=None)`,
  `.translate_nbest(lines, nbest=4)`, `.score(sources, targets)`, `.attention(text)`. Its
  defaults are the command line's (the run's own config, `checkpoint="auto"`, config.decode's
  search); `overrides` ({"decode.beam_size": 8}) are held to the run's rules, and a mistyped
  field is one ConfigError with the closest name. Its searches are compiled by the first call
  and reused by the next: a second translate of a few lines runs at once."""
  console.install_quiet()  # orbax's "read only" warnings, as on the command line
  config = load_run_config(workdir, overrides)
  return _modes().load_session(config, workdir, checkpoint, _members(ensemble))


def _members(ensemble: Sequence[str] | str) -> tuple[str, ...]:
  """The ensemble's other workdirs; one string is one workdir (not its characters)."""
  return (ensemble,) if isinstance(ensemble, str) else tuple(ensemble)


def prepare(config: ml_collections.ConfigDict | None, workdir: str) -> dict[str, Any]:
  """Builds the data (TFDS needs `pip install -e ".[prepare]"`) and the vocabulary."""
  return _modes().prepare(config, workdir)


def train(
  config: ml_collections.ConfigDict | None, workdir: str, config_name: str = ""
) -> dict[str, Any]:
  """Trains (or resumes) to config.num_train_steps; returns the final dev and test figures.
  `config_name` ("demo"): recorded in the run's run.json, so its messages can say which config
  the run was trained with, as the command line's --config is."""
  return _modes().train(config, workdir, config_name)


def evaluate(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  checkpoint: str = "auto",
  ensemble: Sequence[str] | str = (),
  constraints: str = "",
) -> dict[str, Any]:
  """Test BLEU (sacreBLEU and tokenized) and chrF, greedy and the configured beam; of the
  ensemble of `workdir`'s model and those of the `ensemble` workdirs, if any. `constraints`: a
  file of terms per test sentence (--constraints): the constrained beam's scores instead."""
  return _modes().evaluate(config, workdir, checkpoint, _members(ensemble), constraints)


def translate(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  lines: Sequence[str],
  checkpoint: str = "auto",
  ensemble: Sequence[str] | str = (),
  target_lang: str | None = None,
  constraints: Sequence[Sequence[str]] | None = None,
  source_lang: str | None = None,
) -> list[str]:
  """One translation per line, with config.decode's search (method, beam, sampling), into
  `target_lang` for a multilingual model (from `source_lang` for an imported M2M100);
  `constraints`: each line's terms, which its translation must contain (beam search)."""
  hyps = translate_nbest(
    config,
    workdir,
    lines,
    1,
    checkpoint,
    ensemble,
    target_lang=target_lang,
    constraints=constraints,
    source_lang=source_lang,
  )
  return [h[0].text for h in hyps]


def translate_nbest(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  lines: Sequence[str],
  nbest: int,
  checkpoint: str = "auto",
  ensemble: Sequence[str] | str = (),
  alignments: bool = False,
  target_lang: str | None = None,
  constraints: Sequence[Sequence[str]] | None = None,
  source_lang: str | None = None,
) -> list[list[Any]]:
  """`nbest` hypotheses per line, best first: translator.Hypothesis(text, score, alignment).

  Beam search gives its n best (nbest <= config.decode.beam_size); config.decode.method="sample"
  gives n samples. `alignments` adds Pharaoh word alignments ("i-j" pairs, 0-based).
  `target_lang`: a multilingual model's output language (its tag starts every source);
  `source_lang`: an imported M2M100's input language (its token starts every source, and
  `target_lang`'s is forced as the first output). `constraints`: each line's terms (a list of
  strings per line, [] for none), which every hypothesis must contain (beam search only;
  docs/decoding.md).
  """
  if isinstance(lines, str):
    raise TypeError("lines must be a list of sentences, not one string.")
  lines = list(lines)  # a generator is read once
  terms = None
  if constraints is not None:
    if isinstance(constraints, str) or any(not isinstance(r, list | tuple) for r in constraints):
      raise TypeError("constraints: one list of strings per line, e.g. [['Haus'], []].")
    terms = [[_term(t) for t in row] for row in constraints]
    if len(terms) != len(lines):
      raise errors.ConfigError(
        f"constraints has {len(terms)} rows for {len(lines)} lines: one list of terms per line."
      )
  console.install_quiet()
  outputs = _modes().Outputs(
    nbest,
    alignments,
    _members(ensemble),
    target_lang,
    "constraints" if terms is not None else "",
    source_lang,
  )
  run, request = _modes().decoding_request(config, workdir, outputs)  # checked once
  from flaxformer_nmt.decoding import session as session_lib  # pylint: disable=g-import-not-at-top

  session = session_lib.Session.of_run(run, checkpoint, outputs.members)
  hyps = session.translator(request).translate_nbest(list(lines), constraints=terms)
  session_lib.warn_empty(lines, hyps, stacklevel=3)
  return hyps


def _term(term: Any) -> str:
  """A term of `constraints`: a string (a list of strings per line, not one string per line)."""
  if not isinstance(term, str):
    raise TypeError(f"constraints: each line's terms are a list of strings, not {term!r}.")
  return term


def score(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  sources: Sequence[str],
  references: Sequence[str],
  checkpoint: str = "auto",
  ensemble: Sequence[str] | str = (),
  target_lang: str | None = None,
  source_lang: str | None = None,
) -> list[Any]:
  """The model's score of each (source, translation) pair: scoring.PairScore(score, log_prob,
  tokens), the score as the n-best list prints it (--mode=score)."""
  console.install_quiet()
  scores, _, _ = _modes().score_pairs(
    config,
    workdir,
    checkpoint,
    list(sources),
    list(references),
    _members(ensemble),
    target_lang,
    source_lang,
  )
  return scores


def average(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  num_checkpoints: int = 5,
  checkpoint: str = "latest",
) -> dict[str, Any]:
  """Averages the last `num_checkpoints` checkpoints into <workdir>/averaged (checkpoint="best":
  the last ones up to the best step; "ema": their parameter averages)."""
  return _modes().average(config, workdir, num_checkpoints, checkpoint)


def export(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  output: str,
  quantization: str = "float32",
  checkpoint: str = "auto",
  fmt: str = "ctranslate2",
) -> dict[str, Any]:
  """A CTranslate2 model directory in `output` (needs `pip install -e ".[export]"`), or with
  `fmt="huggingface"` a transformers Marian model folder (docs/pretrained.md), `fmt="peft"` a
  LoRA run's adapters (docs/fine-tuning.md)."""
  return _modes().export(config, workdir, checkpoint, fmt, output, quantization)


def import_model(source: str, workdir: str) -> dict[str, Any]:
  """A run in `workdir` made of a transformers Marian or M2M100 model: a folder, or a Hub id
  such as "Helsinki-NLP/opus-mt-en-de" (downloaded with huggingface_hub). Translate with it,
  fine-tune from it (`init_from`), export it: docs/pretrained.md."""
  return _modes().import_model(source, workdir)


def attention(
  config: ml_collections.ConfigDict | None,
  workdir: str,
  text: str,
  output: str | None = None,
  checkpoint: str = "auto",
  target_lang: str | None = None,
  source_lang: str | None = None,
) -> dict[str, Any]:
  """Attention heatmaps and the positional-encoding picture (PNG) in `output`
  (default <workdir>/attention); the result lists the files."""
  return _modes().attention(config, workdir, checkpoint, text, output, target_lang, source_lang)
