"""Every relative link and anchor in README.md and docs/*.md leads somewhere: the file exists in
the repository, and a `#fragment` names a heading of its page (GitHub's anchors)."""

from __future__ import annotations

import pathlib
import re

import pytest

import helpers

PAGES = [helpers.REPO / "README.md", *sorted((helpers.REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: pathlib.Path) -> set[str]:
  """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces to
  hyphens, a repeated heading numbered -1, -2, ..."""
  seen: dict[str, int] = {}
  out = set()
  in_code = False
  for line in page.read_text(encoding="utf-8").splitlines():
    if line.startswith("```"):
      in_code = not in_code
    if in_code or not line.startswith("#"):
      continue
    text = line.lstrip("#").strip()
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    out.add(slug if n == 0 else f"{slug}-{n}")
  return out


def _links(page: pathlib.Path) -> list[str]:
  text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
  text = re.sub(r"`[^`\n]*`", "", text)  # an inline code span shows a link's form, not a link
  return [a or b for a, b in _LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_and_anchors_resolve(page):
  broken = []
  for target in _links(page):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
      continue
    path, _, fragment = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
      broken.append(f"{target}: no such file")
    elif helpers.REPO.resolve() not in (dest, *dest.parents):
      broken.append(f"{target}: outside the repository")
    elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
      broken.append(f"{target}: no heading #{fragment} in {dest.name}")
  assert not broken, f"{page.name}: {broken}"


def test_the_docs_index_lists_every_page():
  readme = (helpers.REPO / "README.md").read_text(encoding="utf-8")
  index = helpers.REPO / "docs" / "README.md"
  listed = index.read_text(encoding="utf-8") if index.exists() else readme
  missing = [p.name for p in PAGES[1:] if p.name != "README.md" and f"{p.name}" not in listed]
  assert not missing, f"pages no index links to: {missing}"


def test_the_readme_stays_under_2500_words():
  """The README is the first page a user reads: the details live in docs/."""
  words = len((helpers.REPO / "README.md").read_text(encoding="utf-8").split())
  assert words < 2500, words
