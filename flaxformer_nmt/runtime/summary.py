"""A mode's figures for a person: the few lines printed (on stderr) after the final JSON line.

The JSON line is for programs (and stays the last line of stdout); this is the same figures as a
reader wants them: which test set, a table of each search's BLEU both ways and chrF, and for a
multilingual run one row per direction (zero-shot ones marked) with their mean.
"""

from __future__ import annotations

import re
from typing import Any

_FIGURE = re.compile(r"^test_(sacrebleu|tokenized_bleu|chrf)_(\w+)$")
_COLUMNS = (("sacrebleu", "sacreBLEU"), ("tokenized_bleu", "tok. BLEU"), ("chrf", "chrF"))


def _searches(figures: dict[str, Any]) -> dict[str, dict[str, float]]:
  """{search name (greedy, beam4, ...): {metric: value}} of one set of test figures."""
  out: dict[str, dict[str, float]] = {}
  for key, value in figures.items():
    found = _FIGURE.match(key)
    if found and isinstance(value, int | float):
      out.setdefault(found[2], {})[found[1]] = float(value)
  return out


def _rows(label: str, figures: dict[str, Any]) -> list[list[str]]:
  return [
    [label, search] + [f"{values[m]:.2f}" if m in values else "-" for m, _ in _COLUMNS]
    for search, values in _searches(figures).items()
  ]


def lines(result: dict[str, Any]) -> list[str]:
  """The summary of `result` (a mode's final figures); [] when it has no test figures."""
  rows: list[list[str]] = []
  for group, mark in (("directions", ""), ("zero_shot", " (zero-shot)")):
    for direction, figures in (result.get(group) or {}).items():
      rows += _rows(direction + mark, figures)
  if rows and isinstance(result.get("mean"), dict):
    rows += _rows("mean", result["mean"])
  first = "direction" if rows else "test set"
  rows = rows or _rows(str(result.get("test_set", "test")), result)
  if not rows:
    return []
  header = [first, "search"] + [name for _, name in _COLUMNS]
  widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
  where = f"{result.get('mode', '')}" + (f" at step {result['step']}" if "step" in result else "")
  sentences = f", {result['test_sentences']} sentences" if "test_sentences" in result else ""
  out = [f"Summary ({where}{sentences}):"]
  for row in [header, *rows]:
    out.append(
      "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
    )
  return out
