"""What a decoding command asks for, checked once before any work: the request's one owner.

The command line's --nbest, --alignments, --ensemble, --target_lang and --constraints (`Outputs`),
and the API's arguments, are checked against the run's config.decode by `check_request`, before
the parameters are read; `output_lines` is how --mode=translate writes what was asked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions


def check_request(
  config: Any, nbest: int = 1, constrained: bool = False, target_lang: str | None = None
) -> str | None:
  """The one check of what a decoding request asks (the command line's --nbest, --constraints
  and --target_lang, the API's arguments), before any work: ConfigError (one line) for an n-best
  list or terms config.decode's search cannot give, or a language the model has no tag for.
  Returns the output language (None for a bilingual model)."""
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
  return lang


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
    tag for (before any work): session.check_request, the API's check too."""
    check_request(config, self.nbest, bool(self.constraints), self.target_lang)


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
