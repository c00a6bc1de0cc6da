"""A trained run loaded once, for many calls: what `api.load` returns, and what the decoding
modes (translate, score, attention) use for their one call.

Loading a run (its config, vocabulary and parameters) and compiling its searches is most of a
short command's time. A `Session` does both once. A `Translator` (translator.py) holds compiled
searches, and making a new one per call (what the API did) re-traced every batch shape:
`Translators` makes one per kind of request (`Request`: n-best, alignments, output language,
beam), puts the parameters on the devices once for all of them, and hands back the same one for
the same kind. The command line, the server (serving/service.py), scoring and the API all take
theirs from here. What a request asks is checked once, before any work (`check_request`;
`Outputs` is --mode=translate's). A Session's defaults are the command line's: config.decode's
search, the 1-best translation, the model's own target language.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions
from flaxformer_nmt.decoding import translator as translator_lib
from flaxformer_nmt.run import loaded as loaded_lib
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.run.loaded import LoadedModel
from flaxformer_nmt.runtime import parallel

if TYPE_CHECKING:
  from flaxformer_nmt.run.command import Run


class Session:
  """`loaded` (run/loaded.py) in `run`, with its translators made once per kind of request."""

  def __init__(self, loaded: LoadedModel, run: Workdir) -> None:
    self.loaded = loaded
    self.run = run
    self.translators = Translators(loaded)

  @classmethod
  def of_run(cls, run: Run, which: str = "auto", members: Sequence[str] = ()) -> Session:
    """The parameters `which` names (with an ensemble's `members`) of an opened run, loaded."""
    return cls(loaded_lib.load(run.config, run.folder, which, members), run.folder)

  @property
  def config(self) -> Any:
    return self.loaded.components.config

  @property
  def description(self) -> str:
    """Which parameters were loaded ("step 600 in runs/demo/checkpoints", an ensemble...)."""
    return self.loaded.description

  def request(
    self,
    nbest: int = 1,
    alignments: bool = False,
    target_lang: str | None = None,
    constrained: bool = False,
  ) -> Request:
    """This kind of request, checked against the run's config (`check_request`)."""
    return check_request(self.config, nbest, constrained, target_lang, alignments)

  def translator(self, request: Request) -> translator_lib.Translator:
    """The kept translator of a checked `request` (`request`, `check_request`)."""
    return self.translators.get(request)

  def translate_checked(
    self, request: Request, lines: Sequence[str], terms: Sequence[Sequence[str]] | None = None
  ) -> tuple[list[list[translator_lib.Hypothesis]], dict[str, Any]]:
    """(each line's hypotheses, speed figures) of a checked `request` (--mode=translate's)."""
    decoder = self.translator(request)
    hyps = decoder.translate_nbest(list(lines), constraints=terms)
    logging.info("Translated %d lines in %.1fs.", len(lines), decoder.stats.seconds)
    return hyps, dict(decoder.stats.as_dict(), method=self.config.decode.method)

  def translate_nbest(
    self,
    lines: Sequence[str],
    nbest: int = 4,
    *,
    alignments: bool = False,
    target_lang: str | None = None,
    constraints: Sequence[Sequence[str]] | None = None,
  ) -> list[list[translator_lib.Hypothesis]]:
    """`nbest` hypotheses per line, best first (translator.Hypothesis: text, score, alignment);
    with `constraints`, each line's terms its hypotheses must contain (beam search)."""
    _check_lines(lines)
    request = self.request(nbest, alignments, target_lang, constraints is not None)
    return self.translator(request).translate_nbest(list(lines), constraints=constraints)

  def translate(self, lines: Sequence[str], target_lang: str | None = None) -> list[str]:
    """The best translation of each line, with config.decode's search."""
    return [h[0].text for h in self.translate_nbest(lines, 1, target_lang=target_lang)]

  def score(
    self, sources: Sequence[str], targets: Sequence[str], target_lang: str | None = None
  ) -> list[Any]:
    """The model's score of each (source, translation) pair: scoring.PairScore(score,
    log_prob, tokens), the score as the n-best list prints it (--mode=score)."""
    from flaxformer_nmt.decoding import scoring  # pylint: disable=g-import-not-at-top

    _check_lines(sources)
    _check_lines(targets)
    scoring.check_pairs(list(sources), list(targets), "sources", "targets")
    lang = directions.resolve_target(self.config.data, target_lang)
    return self.translators.scorer(lang).score(list(sources), list(targets))

  def attention(
    self, text: str, output: str | None = None, target_lang: str | None = None
  ) -> dict[str, Any]:
    """PNG heatmaps of every attention (layers x heads) for `text` and its translation, and the
    positional encoding, in `output` (default <workdir>/attention); the translation and the
    files written (decoding/attention_pictures.py)."""
    # matplotlib: imported by the pictures only.
    from flaxformer_nmt.decoding import attention_pictures, decode  # pylint: disable=g-import-not-at-top
    from flaxformer_nmt.model.tokens import EOS_ID  # pylint: disable=g-import-not-at-top

    if not text.strip():
      raise errors.ConfigError("--text is empty; give the sentence to translate and picture.")
    out_dir = output or self.run.attention_dir
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
      raise errors.ConfigError(f"--output={out_dir} exists and is not a directory.")
    c = self.loaded.components
    lang = directions.resolve_target(c.config.data, target_lang)
    params = jax.device_get(self.loaded.params)
    prefix = translator_lib.target_prefix(translator_lib.ModelParts.of(c), lang)
    source = (prefix + c.tokenizer.encode(text))[: c.max_src_len - 1] + [EOS_ID]
    search = decode.SearchConfig.from_config(c.config.decode)
    target = attention_pictures.translate_ids(c.model, params, source, search)
    pictures = attention_pictures.write_pictures(
      c.model, params, c.tokenizer.id_to_piece, source, target, out_dir
    )
    return {"translation": c.tokenizer.decode(target), **pictures}


def _check_lines(lines: Sequence[str]) -> None:
  if isinstance(lines, str):
    raise TypeError("lines must be a list of sentences, not one string.")


@dataclasses.dataclass(frozen=True)
class Request:
  """What a search is asked for: the translator a kind of request needs."""

  nbest: int = 1
  alignments: bool = False
  target_lang: str = ""  # "" = the model's only target language (a bilingual model: its own)
  beam_size: int | None = None  # None = config.decode's


class Translators:
  """The translators (and scorers) of one loaded model, by `Request`, made when first asked."""

  def __init__(
    self,
    loaded: LoadedModel,
    *,
    log_progress: bool = True,
    rows_per_shard: Sequence[int] | None = None,
  ) -> None:
    self.loaded = loaded
    self._log_progress = log_progress
    self._rows_per_shard = rows_per_shard
    self._made: dict[Request, translator_lib.Translator] = {}
    self._scorers: dict[str, Any] = {}
    self._lock = threading.Lock()
    # The parameters go to the devices once, for every kind.
    self.replicated = parallel.replicate(loaded.params)

  def get(self, request: Request | None = None) -> translator_lib.Translator:
    """The translator of `request` (default: config.decode's 1-best; made and kept on first
    use; thread-safe)."""
    request = request or Request()
    with self._lock:
      if request not in self._made:
        start = time.perf_counter()
        self._made[request] = translator_lib.make_translator(
          self.loaded.components,
          self.replicated,
          replicated=True,
          beam_size=request.beam_size,
          nbest=request.nbest,
          alignments=request.alignments,
          log_progress=self._log_progress,
          rows_per_shard=self._rows_per_shard,
          target_lang=request.target_lang or None,
        )
        logging.info("Search for %s made in %.1f s.", request, time.perf_counter() - start)
      return self._made[request]

  def scorer(self, lang: str | None = None) -> Any:
    """The teacher-forced scorer (decoding/scoring.py) into `lang`, an output language already
    resolved (directions.resolve_target; None for a bilingual model), kept like a translator."""
    from flaxformer_nmt.decoding import scoring  # pylint: disable=g-import-not-at-top

    components = self.loaded.components
    lang = lang or ""
    with self._lock:
      if lang not in self._scorers:
        parts = translator_lib.ModelParts.of(components)
        self._scorers[lang] = scoring.Scorer(
          parts,
          self.replicated,
          alpha=float(components.config.decode.alpha),
          source_prefix=translator_lib.target_prefix(parts, lang or None),
          reserved_ids=translator_lib.reserved_ids(parts),
          replicated=True,
        )
      return self._scorers[lang]


def check_request(
  config: Any,
  nbest: int = 1,
  constrained: bool = False,
  target_lang: str | None = None,
  alignments: bool = False,
) -> Request:
  """The one check of what a decoding request asks (the command line's --nbest, --constraints
  and --target_lang, the API's arguments), before any work: ConfigError (one line) for an n-best
  list or terms config.decode's search cannot give, or a language the model has no tag for.
  Returns the checked Request, its output language resolved ("" for a bilingual model), which
  nothing below resolves again."""
  lang = directions.resolve_target(config.data, target_lang)
  d = config.decode
  if nbest < 1:
    raise errors.ConfigError(f"--nbest={nbest}: give 1 or more.")
  if nbest > 1 and d.method == "greedy":
    raise errors.ConfigError(
      f"--nbest={nbest} with config.decode.method='greedy', which finds one hypothesis; "
      "use 'beam' (nbest <= beam_size) or 'sample'."
    )
  if constrained and d.method != "beam":
    raise errors.ConfigError(
      f"--constraints with config.decode.method={d.method!r}: only beam search can be made "
      "to output given terms; use --config.decode.method=beam."
    )
  if nbest > d.beam_size and d.method == "beam":
    raise errors.ConfigError(
      f"--nbest={nbest} is more than config.decode.beam_size={d.beam_size}: beam search "
      f"finds at most beam_size hypotheses; raise the beam or lower --nbest."
    )
  return Request(nbest, alignments, lang or "")


@dataclasses.dataclass(frozen=True)
class Outputs:
  """What --mode=translate writes besides the best translation of each line."""

  nbest: int = 1  # hypotheses per line: > 1 writes TSV (`output_lines`)
  alignments: bool = False  # word alignments (Pharaoh "i-j") from the cross-attention
  members: tuple[str, ...] = ()  # --ensemble: the other workdirs
  target_lang: str | None = None  # --target_lang: a multilingual model's output language
  constraints: str = ""  # --constraints: each line's terms, tab-separated (constraints.py)

  def request(self, config: ml_collections.ConfigDict) -> Request:
    """The checked request these outputs make of the run whose config is `config` (before
    any work): ConfigError for an n-best list the search cannot give, or a language the model
    has no tag for (`check_request`)."""
    return check_request(
      config, self.nbest, bool(self.constraints), self.target_lang, self.alignments
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
