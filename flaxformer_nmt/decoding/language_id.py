"""Which language an output is in: the off-target rate of a multilingual model's translations.

A zero-shot direction's classic failure is output in the wrong language, often the pivot
(English). The identifier is py3langid's (langid.py's model, shipped in the package: nothing is
downloaded), restricted to the model's own languages, so each line is judged as one of them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any


@functools.lru_cache(maxsize=1)
def supported() -> frozenset[str]:
  """The languages py3langid identifies (ISO 639-1 codes: en, de, fr, cs, ...)."""
  from py3langid import langid  # pylint: disable=g-import-not-at-top  # loads a model (~1 s)

  return frozenset(_model(langid).nb_classes)


def _model(langid: Any) -> Any:
  return langid.LanguageIdentifier.from_modelpath(langid.MODEL_DIR / langid.MODEL_FILE)


@functools.lru_cache(maxsize=8)
def _identifier(languages: tuple[str, ...]) -> Any:
  from py3langid import langid  # pylint: disable=g-import-not-at-top

  identifier = _model(langid)
  identifier.set_languages(list(languages))
  return identifier


def identify(lines: Sequence[str], languages: Sequence[str]) -> list[str]:
  """The language of each line, as one of `languages` ("" for an empty line); the languages
  py3langid does not know are left out of the choice."""
  known = tuple(sorted(set(languages) & supported()))
  if not known:
    raise ValueError(f"py3langid knows none of {sorted(set(languages))}.")
  identifier = _identifier(known)
  return [identifier.classify(line)[0] if line.strip() else "" for line in lines]


def off_target_rate(lines: Sequence[str], target: str, languages: Sequence[str]) -> float | None:
  """The share of `lines` not identified as `target` (an empty line counts as off target), or
  None where py3langid does not know `target` (a code such as pt_BR): then there is no rate."""
  if target not in supported():
    return None
  if not lines:
    return 0.0
  found = identify(lines, languages)
  return sum(lang != target for lang in found) / len(lines)
