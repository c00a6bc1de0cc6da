"""A run's model loaded once, and the one owner of its decoding.

`Session` is the loaded model: the command's Components (config, vocabulary, model), the
parameters (an Ensemble with --ensemble), where they came from, and the searches made for them.
Everything that decodes asks one: --mode=translate, eval (evaluation.py), score and attention,
the trainer's dev BLEU (a session of the train state's parameters), the server
(serving/service.py) and the API (`api.load` returns one).

Loading a run (its config, vocabulary and parameters) and compiling its searches is most of a
short command's time. A `Translator` (translator.py) holds compiled searches, and making one per
call re-traced every batch shape: a Session makes one per kind of request (requests.Request:
n-best, alignments, output language, beam), puts the parameters on the devices once for all of
them, and hands back the same one for the same kind. What a request asks is checked once, before
any work (requests.check_request). A Session's defaults are the command line's: config.decode's
search, the 1-best translation, the model's own target language.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import threading
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import params as params_lib
from flaxformer_nmt.config import directions
from flaxformer_nmt.decoding import translator as translator_lib
from flaxformer_nmt.decoding.requests import Request, check_request
from flaxformer_nmt.model.ensemble import Ensemble
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import parallel

if TYPE_CHECKING:
  from flaxformer_nmt.run.command import Run


@dataclasses.dataclass(frozen=True)
class _Options:
  """How a session's translators report and batch: the server's own (`quiet`) or the CLI's."""

  log_progress: bool = True
  rows_per_shard: tuple[int, ...] | None = None


class Session:
  """`components` with `params` (read from `folder`'s checkpoint, or the trainer's), its
  translators and scorers made once per kind of request and kept (thread-safe: the server's
  loader and batcher threads share one)."""

  def __init__(
    self,
    components: Components,
    params: Any,
    *,
    description: str = "",
    tag: str = "",
    step: int = 0,
    folder: Workdir | None = None,
    replicated: bool = False,
    options: _Options = _Options(),
  ) -> None:
    """`description`: a line saying where the parameters came from ("step 600 in ..."); `tag`:
    what output file names carry; `step`: of the checkpoint read. `replicated`: `params` are
    on every local device already (the train state's)."""
    self.components = components
    self.params = params
    self.description = description
    self.tag = tag
    self.step = step
    self.folder = folder
    self._replicated = params if replicated else None
    self._options = options
    self._made: dict[Request, translator_lib.Translator] = {}
    self._scorers: dict[tuple[str, str], Any] = {}
    self._lock = threading.Lock()

  @classmethod
  def load(
    cls,
    config: ml_collections.ConfigDict,
    folder: Workdir,
    which: str = "auto",
    members: Sequence[str] = (),
  ) -> Session:
    """The parameters `which` names (and, with `members`, each member's by the same rule in
    its own workdir), every checkpoint's shapes checked against the model before any is read.
    `config` is the command's, already held to the run's rules (run/command.py open_run)."""
    location = selection.resolve(folder, which)
    resolved = selection.resolve_members(folder, members, which, config) if members else []
    components = Components.load(config, folder)
    params_lib.check_fits(location.directory, components.abstract_params)
    for member, member_location in resolved:
      try:
        params_lib.check_fits(member_location.directory, components.abstract_params)
      except errors.UserError as e:
        raise type(e)(f"--ensemble member {member.path}: {e}") from e
    params, description, step = params_lib.load_with_step(location, components.abstract_params)
    tag = params_lib.tag(location, step)  # e.g. "averaged-params_5_steps_200_to_600", "step1000"
    if resolved:
      loaded = [params_lib.load(loc, components.abstract_params) for _, loc in resolved]
      params = Ensemble((params, *(p for p, _ in loaded)))
      parts = [
        description,
        *(f"{m.path}: {d}" for (m, _), (_, d) in zip(resolved, loaded, strict=True)),
      ]
      description = f"ensemble of {len(parts)} models: " + "; ".join(parts)
      tag = ensemble_tag(which, parts)
    logging.info("Using %s.", description)
    return cls(components, params, description=description, tag=tag, step=step, folder=folder)

  @classmethod
  def of_run(cls, run: Run, which: str = "auto", members: Sequence[str] = ()) -> Session:
    """The parameters `which` names (with an ensemble's `members`) of an opened run, loaded."""
    return cls.load(run.config, run.folder, which, members)

  def quiet(self, rows_per_shard: Sequence[int] | None = None) -> Session:
    """This model as the server decodes with it: no per-call progress lines, its batches of
    `rows_per_shard` sentences per device (None: translate's). It keeps none of this session's
    searches, and shares its parameters."""
    quiet = Session(
      self.components,
      self.params,
      description=self.description,
      tag=self.tag,
      step=self.step,
      folder=self.folder,
      options=_Options(False, None if rows_per_shard is None else tuple(rows_per_shard)),
    )
    on_devices = self.__dict__.get("replicated", self._replicated)
    if on_devices is not None:  # already on the devices: put there once
      quiet._replicated = on_devices  # pylint: disable=protected-access
    return quiet

  @property
  def config(self) -> Any:
    return self.components.config

  @functools.cached_property
  def replicated(self) -> Any:
    """The parameters on every local device, put there once for every kind of request."""
    return self._replicated if self._replicated is not None else parallel.replicate(self.params)

  def request(
    self,
    nbest: int = 1,
    alignments: bool = False,
    target_lang: str | None = None,
    constrained: bool = False,
    source_lang: str | None = None,
  ) -> Request:
    """This kind of request, checked against the run's config (requests.check_request)."""
    return check_request(self.config, nbest, constrained, target_lang, alignments, source_lang)

  def translator(self, request: Request | None = None) -> translator_lib.Translator:
    """The translator of a checked `request` (default: config.decode's 1-best), made on first
    use and kept."""
    request = request or Request()
    with self._lock:
      if request not in self._made:
        start = time.perf_counter()
        self._made[request] = translator_lib.make_translator(
          self.components,
          self.replicated,
          replicated=True,
          beam_size=request.beam_size,
          nbest=request.nbest,
          alignments=request.alignments,
          log_progress=self._options.log_progress,
          rows_per_shard=self._options.rows_per_shard,
          target_lang=request.target_lang or None,
          source_lang=request.source_lang or None,
        )
        logging.info("Search for %s made in %.1f s.", request, time.perf_counter() - start)
      return self._made[request]

  def kept_translators(self) -> int:
    """How many kinds of request have a translator made (each made once)."""
    return len(self._made)

  def scorer(self, lang: str | None = None, source_lang: str | None = None) -> Any:
    """The teacher-forced scorer (decoding/scoring.py) into `lang`, an output language already
    resolved (directions.resolve_target; None for a bilingual model), from `source_lang` (a
    many-to-many model's, resolved; None: its default), kept like a translator."""
    from flaxformer_nmt.decoding import scoring  # pylint: disable=g-import-not-at-top

    c, key = self.components, (lang or "", source_lang or "")
    with self._lock:
      if key not in self._scorers:
        prefix, first_id = translator_lib.language_ids(c, lang or None, source_lang or None)
        self._scorers[key] = scoring.Scorer(
          c,
          self.replicated,
          alpha=float(c.config.decode.alpha),
          source_prefix=prefix,
          reserved_ids=translator_lib.reserved_ids(c),
          replicated=True,
          first_id=first_id,
        )
      return self._scorers[key]

  def translate_checked(
    self, request: Request, lines: Sequence[str], terms: Sequence[Sequence[str]] | None = None
  ) -> tuple[list[list[translator_lib.Hypothesis]], dict[str, Any]]:
    """(each line's hypotheses, speed figures) of a checked `request` (--mode=translate's)."""
    decoder = self.translator(request)
    hyps = decoder.translate_nbest(list(lines), constraints=terms)
    logging.info("Translated %d lines in %.1fs.", len(lines), decoder.stats.seconds)
    return hyps, dict(decoder.stats.as_dict(), method=self.config.decode.method)

  def translate_with(
    self, sources: Sequence[str], beam_size: int, target_lang: str | None = None
  ) -> list[str]:
    """The best translation of each source by beam search of `beam_size` (1: greedy), into
    `target_lang`, a language already resolved (evaluation's, by direction)."""
    request = Request(beam_size=beam_size, target_lang=target_lang or "")
    return self.translator(request).translate(list(sources))

  def translate_nbest(
    self,
    lines: Sequence[str],
    nbest: int = 4,
    *,
    alignments: bool = False,
    target_lang: str | None = None,
    constraints: Sequence[Sequence[str]] | None = None,
    source_lang: str | None = None,
  ) -> list[list[translator_lib.Hypothesis]]:
    """`nbest` hypotheses per line, best first (translator.Hypothesis: text, score, alignment);
    with `constraints`, each line's terms its hypotheses must contain (beam search)."""
    return self._translate_nbest(lines, nbest, alignments, target_lang, constraints, 3, source_lang)

  def _translate_nbest(
    self,
    lines: Sequence[str],
    nbest: int,
    alignments: bool,
    target_lang: str | None,
    constraints: Sequence[Sequence[str]] | None,
    stacklevel: int,
    source_lang: str | None = None,
  ) -> list[list[translator_lib.Hypothesis]]:
    _check_lines(lines)
    lines = list(lines)  # a generator is read once
    request = self.request(nbest, alignments, target_lang, constraints is not None, source_lang)
    hyps = self.translator(request).translate_nbest(list(lines), constraints=constraints)
    warn_empty(lines, hyps, stacklevel + 1)
    return hyps

  def translate(
    self, lines: Sequence[str], target_lang: str | None = None, source_lang: str | None = None
  ) -> list[str]:
    """The best translation of each line, with config.decode's search."""
    hyps = self._translate_nbest(lines, 1, False, target_lang, None, 3, source_lang)
    return [h[0].text for h in hyps]

  def score_checked(
    self,
    lang: str | None,
    sources: Sequence[str],
    targets: Sequence[str],
    source_lang: str | None = None,
  ) -> tuple[list[Any], dict[str, Any]]:
    """(each pair's scoring.PairScore, corpus figures) into `lang` from `source_lang`, already
    resolved (--mode=score's)."""
    from flaxformer_nmt.decoding import scoring  # pylint: disable=g-import-not-at-top

    scorer = self.scorer(lang, source_lang)
    scores = scorer.score(list(sources), list(targets))
    figures = {
      **scoring.summary(scores),
      "num_truncated": len(scorer.truncated),
      "seconds": scorer.seconds,
    }
    return scores, figures

  def score(
    self,
    sources: Sequence[str],
    targets: Sequence[str],
    target_lang: str | None = None,
    source_lang: str | None = None,
  ) -> list[Any]:
    """The model's score of each (source, translation) pair: scoring.PairScore(score,
    log_prob, tokens), the score as the n-best list prints it (--mode=score)."""
    from flaxformer_nmt.decoding import scoring  # pylint: disable=g-import-not-at-top

    _check_lines(sources)
    _check_lines(targets)
    scoring.check_pairs(list(sources), list(targets), "sources", "targets")
    lang = directions.resolve_target(self.config.data, target_lang)
    source = directions.resolve_source(self.config.data, source_lang)
    return self.scorer(lang, source).score(list(sources), list(targets))

  def attention(
    self,
    text: str,
    output: str | None = None,
    target_lang: str | None = None,
    source_lang: str | None = None,
  ) -> dict[str, Any]:
    """PNG heatmaps of every attention (layers x heads) for `text` and its translation, and the
    positional encoding, in `output` (default <workdir>/attention); the translation and the
    files written (decoding/attention_pictures.py)."""
    # matplotlib: imported by the pictures only.
    from flaxformer_nmt.decoding import attention_pictures, decode  # pylint: disable=g-import-not-at-top
    from flaxformer_nmt.model.tokens import EOS_ID  # pylint: disable=g-import-not-at-top

    if not text.strip():
      raise errors.ConfigError("--text is empty; give the sentence to translate and picture.")
    if output is None and self.folder is None:
      raise errors.ConfigError("attention: give the folder to write the pictures into.")
    out_dir = output or self.folder.attention_dir  # type: ignore[union-attr]
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
      raise errors.ConfigError(f"--output={out_dir} exists and is not a directory.")
    c = self.components
    lang = directions.resolve_target(c.config.data, target_lang)
    source_lang = directions.resolve_source(c.config.data, source_lang)
    params = jax.device_get(self.params)
    prefix, first_id = translator_lib.language_ids(c, lang, source_lang)
    source = (prefix + c.tokenizer.encode(text))[: c.max_src_len - 1] + [EOS_ID]
    search = decode.SearchConfig.from_config(c.config.decode)
    target = attention_pictures.translate_ids(c.model, params, source, search, first_id)
    pictures = attention_pictures.write_pictures(
      c.model, params, c.tokenizer.id_to_piece, source, target, out_dir
    )
    return {"translation": c.tokenizer.decode(target), **pictures}


def ensemble_tag(which: str, parts: Sequence[str]) -> str:
  """The name an ensemble's output files carry: its size, the rule, and a digest of what each
  member loaded (its checkpoint's path and step), so two ensembles never share file names."""
  digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
  return f"ensemble{len(parts)}_{which}_{digest[:8]}"


def warn_empty(
  lines: Sequence[str], hyps: Sequence[Sequence[translator_lib.Hypothesis]], stacklevel: int
) -> None:
  """An empty string among an API call's translations, said once (a Python warning, which a
  script or notebook shows): the command line counts blank lines in its figures (num_empty), and
  an API caller gets nothing but the strings."""
  blank = sum(1 for line in lines if not line.strip())
  nothing = sum(1 for line, h in zip(lines, hyps, strict=True) if line.strip() and not h[0].text)
  said = []
  if blank:
    said.append(f"{blank} of {len(lines)} lines are blank (their translations are empty)")
  if nothing:
    said.append(f"{nothing} non-blank lines translated to nothing (the model ended at once)")
  if said:
    warnings.warn("; ".join(said) + ".", stacklevel=stacklevel)


def _check_lines(lines: Sequence[str]) -> None:
  if isinstance(lines, str):
    raise TypeError("lines must be a list of sentences, not one string.")
