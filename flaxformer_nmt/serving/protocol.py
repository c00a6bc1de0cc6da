"""What a `POST /translate` body may say and what it gets back: the checks of a request (its
fields, lines, nesting and encoding), and the answer's shape. No aiohttp here: server.py routes,
this module reads and writes JSON.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from flaxformer_nmt.serving import batcher as batcher_lib

_FIELDS = ("text", "nbest", "alignments", "target_lang", "constraints", "source_lang")
# A line's terms, all together, may have at most this many characters: the beam widens to their
# pieces + 1, and a wider beam costs every line of the batch.
MAX_TERM_CHARS = 100


@dataclasses.dataclass(frozen=True)
class Limits:
  """What a request may ask: the body's size, its lines, and the n-best lists the search gives."""

  max_request_bytes: int = 1 << 20
  max_nbest: int = 1  # beam: beam_size; sample: any number up to this; greedy: 1
  nbest_rule: str = "greedy search finds one hypothesis"
  max_request_lines: int = 10_000
  # A multilingual model's languages ("target_lang" must name one); () for a bilingual model,
  # whose own target language `default_target` is the only one a request may name.
  targets: tuple[str, ...] = ()
  default_target: str = ""  # "" (multilingual): a request must say "target_lang"
  constraints: bool = False  # "constraints" may be asked for (beam search)
  # The languages a request's "source_lang" may name (a bilingual model: its own), and the one
  # it gets without: "" unless the model takes a source-language token (an imported M2M100).
  sources: tuple[str, ...] = ()
  default_source: str = ""


class BadRequest(ValueError):
  """A request the server refuses with 400 (its message is the one line)."""


class TooLarge(ValueError):
  """A request the server refuses with 413."""


@dataclasses.dataclass(frozen=True)
class Asked:
  """A /translate request, checked."""

  lines: list[str]
  kind: batcher_lib.Kind
  nbest_list: bool  # "nbest" was given: answer with lists of {"text", "score"}


def parse_request(body: bytes, limits: Limits) -> Asked:
  """What a /translate body asks for; BadRequest (or TooLarge), naming the field, otherwise."""
  try:
    request = json.loads(body.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise BadRequest(f"the body is not JSON: {' '.join(str(e).split())}") from None
  except (RecursionError, ValueError) as e:  # ValueError: e.g. an integer of over 4300 digits
    if not isinstance(e, RecursionError):
      raise BadRequest(f"the body is not JSON we read: {' '.join(str(e).split())[:200]}") from None
    raise BadRequest('the body is nested too deeply; send {"text": "..." | ["...", ...]}') from None
  if not isinstance(request, dict):
    raise BadRequest('the body must be a JSON object, e.g. {"text": "..."}')
  unknown = sorted(set(request) - set(_FIELDS))
  if unknown:
    raise BadRequest(f"unknown field {unknown[0]!r}; the fields are {', '.join(_FIELDS)}")
  if "text" not in request:
    raise BadRequest('"text" is missing: give a string or a list of strings')
  text = request["text"]
  lines = [text] if isinstance(text, str) else text
  if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
    raise BadRequest('"text" must be a string or a list of strings')
  if len(lines) > limits.max_request_lines:
    raise TooLarge(
      f'"text" has {len(lines)} lines; the limit is {limits.max_request_lines} '
      "(--max_request_lines): send them in several requests"
    )
  for i, line in enumerate(lines):
    if "\n" in line or "\r" in line:
      where = '"text"' if isinstance(text, str) else f'"text"[{i}]'
      raise BadRequest(f"{where} holds a line break: send one line per string")
  nbest = request.get("nbest", 1)
  if isinstance(nbest, bool) or not isinstance(nbest, int) or nbest < 1:
    raise BadRequest(f'"nbest" must be a whole number >= 1, got {json.dumps(nbest)}')
  if nbest > limits.max_nbest:
    raise BadRequest(f'"nbest"={nbest} is more than {limits.max_nbest}: {limits.nbest_rule}')
  alignments = request.get("alignments", False)
  if not isinstance(alignments, bool):
    raise BadRequest(f'"alignments" must be true or false, got {json.dumps(alignments)}')
  target = _target(request.get("target_lang"), limits)
  source = _source(request.get("source_lang"), limits)
  kind = batcher_lib.Kind(nbest, alignments, target, source_lang=source)
  if "constraints" in request:
    terms = _constraints(request["constraints"], text, limits)
    return Asked(
      list(zip(lines, terms, strict=True)),
      dataclasses.replace(kind, constrained=True),
      "nbest" in request,
    )
  return Asked(lines, kind, "nbest" in request)


def _constraints(given: Any, text: Any, limits: Limits) -> list[list[str]]:
  """The request's "constraints": a list of terms (strings) for a "text" string, a list of such
  lists for a list of lines; BadRequest naming what is wrong."""
  if not limits.constraints:
    raise BadRequest(
      '"constraints" needs beam search; this server\'s config.decode.method is not "beam"'
    )
  single = isinstance(text, str)
  rows = [given] if single else given
  shape = "a list of strings" if single else 'a list with a list of strings per "text" line'
  if not isinstance(rows, list) or (not single and len(rows) != len(text)):
    raise BadRequest(f'"constraints" must be {shape}')
  for i, row in enumerate(rows):
    where = '"constraints"' if single else f'"constraints"[{i}]'
    if not isinstance(row, list) or not all(isinstance(t, str) for t in row):
      raise BadRequest(f'"constraints" must be {shape}')
    if any("\n" in t or "\r" in t or "\t" in t for t in row):
      raise BadRequest(f"{where} holds a line break or tab: one term per string")
    if sum(len(t) for t in row) > MAX_TERM_CHARS:
      raise BadRequest(
        f"{where} has more than {MAX_TERM_CHARS} characters of terms; this server's limit"
      )
  return [[t for t in row if t.strip()] for row in rows]


def _target(target: Any, limits: Limits) -> str:
  """The request's "target_lang", checked against the model's languages ("" for a bilingual
  model, which has one)."""
  if target is not None and not isinstance(target, str):
    raise BadRequest(f'"target_lang" must be a language code string, got {json.dumps(target)}')
  if not limits.targets:
    if target and target != limits.default_target:
      raise BadRequest(
        f'"target_lang"={json.dumps(target)}: this model translates into '
        f"{limits.default_target or 'one language'} only"
      )
    return ""
  target = target or limits.default_target
  if not target:
    raise BadRequest(
      f'"target_lang" is missing: this model translates into {", ".join(limits.targets)}'
    )
  if target not in limits.targets:
    raise BadRequest(
      f'"target_lang"={json.dumps(target)} is unknown; this model\'s languages are '
      f"{', '.join(limits.targets)}"
    )
  return target


def _source(source: Any, limits: Limits) -> str:
  """The request's "source_lang", checked against the languages the model reads: a
  many-to-many model's token to put in front (default: the server's), else ""."""
  if source is not None and not isinstance(source, str):
    raise BadRequest(f'"source_lang" must be a language code string, got {json.dumps(source)}')
  if source and limits.sources and source not in limits.sources:
    raise BadRequest(
      f'"source_lang"={json.dumps(source)} is unknown; this model reads {", ".join(limits.sources)}'
    )
  return (source or limits.default_source) if limits.default_source else ""


def check_encodable(lines: list[Any], encode: Callable[[str], Any]) -> None:
  """BadRequest naming the first line `encode` (the tokenizer's) cannot take, e.g. one holding
  a lone surrogate ("\\ud800", valid JSON but not Unicode text); of a constrained request's
  (text, terms) pairs, the text and each term."""
  if lines and isinstance(lines[0], tuple):
    check_encodable([text for text, _ in lines], encode)
    for i, (_, terms) in enumerate(lines):
      try:
        for term in terms:
          term.encode("utf-8")
          encode(term)
      except Exception as e:  # pylint: disable=broad-except
        reason = " ".join(str(e).split())[:200]
        raise BadRequest(
          f'a term of "constraints"[{i}] cannot be encoded ({type(e).__name__}: {reason})'
        ) from None
    return
  for i, line in enumerate(lines):
    try:
      line.encode("utf-8")
      encode(line)
    except Exception as e:  # pylint: disable=broad-except
      where = '"text"' if len(lines) == 1 else f'"text"[{i}]'
      reason = " ".join(str(e).split())[:200]
      raise BadRequest(f"{where} cannot be encoded ({type(e).__name__}: {reason})") from None


def answer(lines: list[batcher_lib.Line], asked: Asked) -> dict:
  """The /translate response for the batcher's answers: plain strings for one hypothesis per
  line, lists of {"text", "score"} when an n-best list was asked for, "alignment" when asked."""

  def hypothesis(h: Any) -> dict[str, Any]:
    out = {"text": h.text, "score": h.score}
    if asked.kind.alignments:
      out["alignment"] = h.alignment
    return out

  if asked.nbest_list:
    translations: list[Any] = [[hypothesis(h) for h in line.hypotheses] for line in lines]
  elif asked.kind.alignments:
    translations = [hypothesis(line.hypotheses[0]) for line in lines]
  else:
    translations = [line.hypotheses[0].text for line in lines]
  return {"translations": translations, "truncated": [line.truncated for line in lines]}
