"""Every figure the README and docs/ cite from a benchmark record is that record's value.

A cited figure is a link whose text is the number and whose target is the record and the field:
`[12.3](benchmarks/results/decode_small_beam4.json#sentences_per_s)` (a dotted path inside the
record's `result`; list items by index; `%20` for a space in a key). The number must be the field's
value as written with the same decimals (a trailing `%` multiplies a fraction by 100), so a figure
cannot be mistyped, disagree with another page, or stay behind when its record is measured again.
"""

from __future__ import annotations

import json
import pathlib
import re
import urllib.parse

import pytest

import helpers

PAGES = [helpers.REPO / "README.md", *sorted((helpers.REPO / "docs").glob("*.md"))]
RESULTS = helpers.REPO / "benchmarks" / "results"
CITATION = re.compile(
  r"\[\**(?P<figure>[-+]?[0-9][0-9,]*(?:\.[0-9]+)?)(?P<percent>%?)\**\]"
  r"\((?P<path>(?:\.\./)?benchmarks/results/[^)#\s]+\.json)#(?P<field>[^)\s]+)\)"
)


def citations(page: pathlib.Path) -> list[re.Match]:
  return list(CITATION.finditer(page.read_text(encoding="utf-8")))


def field(record: dict, dotted: str):
  value = record["result"]
  for part in urllib.parse.unquote(dotted).split("."):
    value = value[int(part)] if isinstance(value, list) else value[part]
  return value


def as_written(value: float, figure: str, percent: bool) -> str:
  """`value` with as many decimals as `figure` shows (and its thousands separators)."""
  decimals = len(figure.partition(".")[2])
  value = value * 100 if percent else value
  return f"{value:,.{decimals}f}" if "," in figure else f"{value:.{decimals}f}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_cited_figure_is_its_records_value(page):
  wrong = []
  for match in citations(page):
    record = json.loads((page.parent / match["path"]).read_text(encoding="utf-8"))
    try:
      value = field(record, match["field"])
    except (KeyError, IndexError, ValueError, TypeError):
      wrong.append(f"{match[0]}: the record has no field {match['field']}")
      continue
    written = as_written(value, match["figure"], bool(match["percent"]))
    if written != match["figure"]:
      wrong.append(f"{match[0]}: the record says {written}")
  assert not wrong, f"{page.name}: {wrong}"


def test_the_readme_results_table_cites_a_record_on_every_row():
  text = (helpers.REPO / "README.md").read_text(encoding="utf-8")
  table = text.split("## Results", 1)[1].split("\n## ", 1)[0]
  rows = [r for r in table.splitlines() if r.startswith("|") and not r.startswith("|--")][1:]
  assert rows
  uncited = [r[:60] for r in rows if not CITATION.search(r)]
  assert not uncited, uncited


def test_every_record_names_its_machine_versions_and_command_and_is_cited():
  records = sorted(RESULTS.glob("*.json"))
  assert records
  cited = {pathlib.Path(m["path"]).name for page in PAGES for m in citations(page)}
  for path in records:
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["record"] == path.stem
    assert record["machine"]["processor"] and record["machine"]["cores"] >= 1, path.name
    assert "accelerator" in record["machine"], path.name
    assert record["versions"]["python"] and record["versions"]["jax"], path.name
    assert record["command"] and record["commit"] and record["date"], path.name
    assert path.name in cited, f"{path.name} is cited by no page"
