r"""Figures cited from benchmark records, in README.md and docs/*.md: found, checked and refreshed.

A page cites a figure as a link whose text is the number and whose target is the record and the
field: `[12.3](benchmarks/results/decode_small_beam4.json#sentences_per_s)`, where the field is a
dotted path inside the record's `result` (list items by index; `%20` for a space in a key). The
figure is the field's value with as many decimals as the page shows (thousands separators if it
shows them; a trailing `%` inside the brackets means a fraction times 100).

tests/unit/test_figures.py checks that every cited figure is its record's value. After measuring a
figure again (its record rewritten), this rewrites every page's citations of it, keeping each one's
decimals, and lists what changed:

  python -m flaxformer_nmt.benchmarking.citations          # list the figures that differ
  python -m flaxformer_nmt.benchmarking.citations --write  # and rewrite them in the pages
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import urllib.parse
from typing import Any

CITATION = re.compile(
  r"\[(?P<stars>\**)(?P<figure>[-+]?[0-9][0-9,]*(?:\.[0-9]+)?)(?P<percent>%?)\**\]"
  r"\((?P<path>(?:\.\./)?benchmarks/results/[^)#\s]+\.json)#(?P<field>[^)\s]+)\)"
)
REPO = pathlib.Path(__file__).resolve().parents[2]


def pages(repo: pathlib.Path = REPO) -> list[pathlib.Path]:
  """The pages that may cite records: README.md and docs/*.md."""
  return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def field(record: dict[str, Any], dotted: str) -> Any:
  """The value at `dotted` inside `record["result"]` (KeyError, IndexError or ValueError: none)."""
  value = record["result"]
  for part in urllib.parse.unquote(dotted).split("."):
    value = value[int(part)] if isinstance(value, list) else value[part]
  return value


def as_written(value: float, figure: str, percent: bool) -> str:
  """`value` as a page writes it: as many decimals as `figure` shows, its thousands separators."""
  if isinstance(value, bool) or not isinstance(value, int | float):
    raise TypeError(f"not a number: {value!r}")
  decimals = len(figure.partition(".")[2])
  value = value * 100 if percent else value
  return f"{value:,.{decimals}f}" if "," in figure else f"{value:.{decimals}f}"


@dataclasses.dataclass(frozen=True)
class Cited:
  """One citation on a page: what it says, and what its record says (None: no record or field)."""

  page: pathlib.Path
  text: str  # the whole link, as written
  start: int  # where it starts in the page's text
  figure: str
  record_says: str | None

  @property
  def agrees(self) -> bool:
    return self.record_says == self.figure


def cited(page: pathlib.Path) -> list[Cited]:
  """Every citation on `page` with its record's value (None: no such record, or no such field)."""
  out = []
  for match in CITATION.finditer(page.read_text(encoding="utf-8")):
    path = page.parent / match["path"]
    try:
      record = json.loads(path.read_text(encoding="utf-8"))
      says = as_written(field(record, match["field"]), match["figure"], bool(match["percent"]))
    except (OSError, KeyError, IndexError, ValueError, TypeError):
      says = None
    out.append(Cited(page, match[0], match.start(), match["figure"], says))
  return out


def refresh(page: pathlib.Path) -> list[Cited]:
  """Rewrites `page`'s citations that differ from their records (those with no such field are
  left as they are); returns the ones that differed."""
  differ = [c for c in cited(page) if not c.agrees]
  text = page.read_text(encoding="utf-8")
  for c in sorted(differ, key=lambda c: c.start, reverse=True):
    if c.record_says is not None:
      new = c.text.replace(c.figure, c.record_says, 1)
      text = text[: c.start] + new + text[c.start + len(c.text) :]
  page.write_text(text, encoding="utf-8")
  return differ


def main(write: bool) -> None:
  """Lists the figures that differ from their records; with `write`, rewrites them too."""
  for page in pages():
    differ = refresh(page) if write else [c for c in cited(page) if not c.agrees]
    for c in differ:
      where = os.path.relpath(page, REPO)
      now = c.record_says if c.record_says is not None else "no such record, or no such field"
      print(f"{where}: {c.text} -> {now}")


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top

  _WRITE = flags.DEFINE_bool("write", False, "Rewrite the figures that differ from their records.")
  app.run(lambda argv: main(_WRITE.value))
