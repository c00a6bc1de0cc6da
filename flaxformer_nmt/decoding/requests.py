"""What a decoding request asks, checked once before any work: `Request` (the translator a kind of
request needs), `check_request` (the command line's --nbest, --constraints and --target_lang, the
API's arguments), and what --mode=translate writes (`Outputs`, `translation_lines`).

Every decoder (decoding/session.py's Session) is asked with a checked Request, whose output
language is already resolved: nothing below resolves it again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions


@dataclasses.dataclass(frozen=True)
class Request:
  """What a search is asked for: the translator a kind of request needs."""

  nbest: int = 1
  alignments: bool = False
  target_lang: str = ""  # "" = the model's only target language (a bilingual model: its own)
  beam_size: int | None = None  # None = config.decode's
  source_lang: str = ""  # a many-to-many model's input language; "" = its data.src_lang


def check_request(
  config: Any,
  nbest: int = 1,
  constrained: bool = False,
  target_lang: str | None = None,
  alignments: bool = False,
  source_lang: str | None = None,
) -> Request:
  """The one check of what a decoding request asks (the command line's --nbest, --constraints
  and --target_lang, the API's arguments), before any work: ConfigError (one line) for an n-best
  list or terms config.decode's search cannot give, or a language the model has no tag for.
  Returns the checked Request, its output language resolved ("" for a bilingual model), which
  nothing below resolves again. `source_lang` (--source_lang): a many-to-many model's input
  language; any other model only checks it is the language it reads."""
  lang = directions.resolve_target(config.data, target_lang)
  source = directions.resolve_source(config.data, source_lang)
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
  return Request(nbest, alignments, lang or "", source_lang=source or "")


@dataclasses.dataclass(frozen=True)
class Outputs:
  """What --mode=translate writes besides the best translation of each line."""

  nbest: int = 1  # hypotheses per line: > 1 writes TSV (`translation_lines`)
  alignments: bool = False  # word alignments (Pharaoh "i-j") from the cross-attention
  members: tuple[str, ...] = ()  # --ensemble: the other workdirs
  target_lang: str | None = None  # --target_lang: a multilingual model's output language
  constraints: str = ""  # --constraints: each line's terms, tab-separated (constraints.py)
  source_lang: str | None = None  # --source_lang: a many-to-many model's input language

  def request(self, config: ml_collections.ConfigDict) -> Request:
    """The checked request these outputs make of the run whose config is `config` (before
    any work): ConfigError for an n-best list the search cannot give, or a language the model
    has no tag for (`check_request`)."""
    return check_request(
      config,
      self.nbest,
      bool(self.constraints),
      self.target_lang,
      self.alignments,
      self.source_lang,
    )


def translation_lines(hypotheses: list[list[Any]], outputs: Outputs) -> list[str]:
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
