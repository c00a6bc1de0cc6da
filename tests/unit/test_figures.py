"""Every figure the README and docs/ cite from a benchmark record is that record's value.

A cited figure is a link whose text is the number and whose target is the record and the field:
`[12.3](benchmarks/results/decode_small_beam4.json#sentences_per_s)` (a dotted path inside the
record's `result`; list items by index; `%20` for a space in a key). The number must be the field's
value as written with the same decimals (a trailing `%` multiplies a fraction by 100), so a figure
cannot be mistyped, disagree with another page, or stay behind when its record is measured again
(`python -m flaxformer_nmt.benchmarking.citations --write` rewrites the pages from the records).
"""

from __future__ import annotations

import json
import pathlib

import pytest

from flaxformer_nmt.benchmarking import citations

import helpers

PAGES = citations.pages(helpers.REPO)
RESULTS = helpers.REPO / "benchmarks" / "results"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_cited_figure_is_its_records_value(page):
  wrong = [
    f"{c.text}: "
    + (f"the record says {c.record_says}" if c.record_says else "no such record or field")
    for c in citations.cited(page)
    if not c.agrees
  ]
  assert not wrong, f"{page.name}: {wrong}"


def test_a_figure_is_read_with_its_decimals_separators_and_percent():
  record = {"result": {"a b": [{"x": 1234.5678}], "share": 0.98321, "flag": True}}
  assert citations.as_written(citations.field(record, "a%20b.0.x"), "1,234.57", False) == "1,234.57"
  assert citations.as_written(citations.field(record, "a%20b.0.x"), "1235", False) == "1235"
  assert citations.as_written(citations.field(record, "share"), "98.32", True) == "98.32"
  with pytest.raises(TypeError):
    citations.as_written(citations.field(record, "flag"), "1", False)
  with pytest.raises(KeyError):
    citations.field(record, "missing")


def test_refresh_rewrites_a_stale_figure_and_keeps_its_decimals(tmp_path):
  (tmp_path / "benchmarks" / "results").mkdir(parents=True)
  record = {"result": {"speed": 12.3456, "share": 0.5}}
  (tmp_path / "benchmarks" / "results" / "r.json").write_text(json.dumps(record))
  page = tmp_path / "README.md"
  link = "(benchmarks/results/r.json#{})".format
  page.write_text(
    f"Speed [**11.0**]{link('speed')}, share [50%]{link('share')}, gone [1]{link('gone')}."
  )
  differ = citations.refresh(page)
  assert [c.figure for c in differ] == ["11.0", "1"]
  assert page.read_text().startswith(f"Speed [**12.3**]{link('speed')}, share [50%]")
  assert f"[1]{link('gone')}" in page.read_text()  # no such field: left alone
  assert all(c.agrees for c in citations.cited(page) if c.record_says)


def test_the_readme_results_table_cites_a_record_on_every_row():
  text = (helpers.REPO / "README.md").read_text(encoding="utf-8")
  lines = text.split("## Results", 1)[1].split("\n## ", 1)[0].splitlines()
  # Every table row but the headers (a header is the line above a |---| line).
  rows = [
    row
    for row, below in zip(lines, [*lines[1:], ""], strict=True)
    if row.startswith("|") and not row.startswith("|--") and not below.startswith("|--")
  ]
  assert len(rows) >= 10
  uncited = [r[:60] for r in rows if not citations.CITATION.search(r)]
  assert not uncited, uncited


def test_every_record_names_its_machine_versions_and_command_and_is_cited():
  records = sorted(RESULTS.glob("*.json"))
  assert records
  cited = {
    pathlib.Path(m["path"]).name
    for page in PAGES
    for m in citations.CITATION.finditer(page.read_text(encoding="utf-8"))
  }
  for path in records:
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["record"] == path.stem
    assert record["machine"]["processor"] and record["machine"]["cores"] >= 1, path.name
    assert "accelerator" in record["machine"], path.name
    assert record["versions"]["python"] and record["versions"]["jax"], path.name
    assert record["command"] and record["commit"] and record["date"], path.name
    assert path.name in cited, f"{path.name} is cited by no page"
