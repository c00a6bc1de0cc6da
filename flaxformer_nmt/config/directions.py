"""Many directions in one model, as the config spells them: which directions, which corpora, tags.

A multilingual config sets `data.directions` ("en-de,de-en,en-fr,..."). Every source then starts
with the target language's tag, a reserved piece of the shared vocabulary (`<2de>`, a
SentencePiece user-defined symbol, Johnson et al. 2017), and a corpus may add its own tag after
it (`<BT>` on back-translated data: tagged back-translation, Caswell et al. 2019). Tags are ids
put in front of the encoded source, never text, so a tag is one piece whatever the text around it.

How training samples among them is data/direction_mix.py's. A bilingual config (`data.directions` =
"") is untouched.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re

import ml_collections

from flaxformer_nmt import errors

_LANG = re.compile(r"^[a-z]{2,3}([_-][A-Za-z0-9]{2,8})?$")
_TAG = re.compile(r"^<[A-Za-z0-9_]{1,16}>$")


@dataclasses.dataclass(frozen=True)
class Direction:
  """One translation direction, such as en-de."""

  src: str
  tgt: str

  @property
  def name(self) -> str:
    return f"{self.src}-{self.tgt}"


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A training corpus of every direction: files `<prefix>.<src>-<tgt>.<lang>` (or the
  multi-way `<prefix>.<lang>`), sampled by `weight` within its direction, its sources tagged with
  `tag` ("" = none) after the language tag."""

  prefix: str
  weight: float = 1.0
  tag: str = ""


def lang_tag(lang: str, data_config: ml_collections.ConfigDict | None = None) -> str:
  """The target-language tag put in front of every source: `<2fr>`, or as
  `data.lang_tag_format` spells it (an imported OPUS-MT model's `>>fr<<`)."""
  fmt = str(data_config.get("lang_tag_format", "") or "<2{}>") if data_config else "<2{}>"
  return fmt.format(lang)


def is_language(code: str) -> bool:
  """Whether `code` is a language code a direction may name (en, deu, por_Latn)."""
  return bool(_LANG.match(code))


def parse_directions(text: str, field: str = "data.directions") -> list[Direction]:
  """`"en-de,de-en"` -> directions; ConfigError naming `field` for a malformed or repeated one."""
  out: list[Direction] = []
  for item in (s.strip() for s in text.split(",")):
    if not item:
      continue
    src, sep, tgt = item.partition("-")
    if not sep or not _LANG.match(src) or not _LANG.match(tgt):
      raise errors.ConfigError(
        f"config.{field}={text!r}: {item!r} is not a direction such as 'en-de' (language codes "
        "of 2 or 3 lower-case letters)."
      )
    if src == tgt:
      raise errors.ConfigError(f"config.{field}={text!r}: {item!r} translates into itself.")
    d = Direction(src, tgt)
    if d in out:
      raise errors.ConfigError(f"config.{field}={text!r}: {item!r} is listed twice.")
    out.append(d)
  return out


def parse_corpora(text: str, default_prefix: str) -> list[Corpus]:
  """`data.corpora`: comma-separated `PREFIX[:WEIGHT[:TAG]]`, e.g. `"train,bt:0.5:<BT>"`; ""
  is `data.train_prefix` alone. ConfigError naming the entry that is malformed."""
  if not text.strip():
    return [Corpus(default_prefix)]
  out: list[Corpus] = []
  for item in (s.strip() for s in text.split(",")):
    if not item:
      continue
    prefix, *rest = item.split(":")
    if len(rest) > 2 or not prefix:
      raise errors.ConfigError(
        f"config.data.corpora={text!r}: {item!r} is not PREFIX[:WEIGHT[:TAG]]."
      )
    try:
      weight = float(rest[0]) if rest and rest[0] else 1.0
    except ValueError:
      raise errors.ConfigError(
        f"config.data.corpora={text!r}: the weight of {item!r} is not a number."
      ) from None
    if not weight > 0 or not math.isfinite(weight):
      raise errors.ConfigError(f"config.data.corpora={text!r}: the weight of {item!r} is not > 0.")
    tag = rest[1] if len(rest) == 2 else ""
    if tag and not _TAG.match(tag):
      raise errors.ConfigError(
        f"config.data.corpora={text!r}: the tag of {item!r} is not like '<BT>' (letters, digits, "
        "'_' between angle brackets)."
      )
    if tag.lower() in ("<pad>", "<unk>", "<s>", "</s>", "<eos>", "<bos>"):
      raise errors.ConfigError(
        f"config.data.corpora={text!r}: the tag {tag!r} is a reserved piece of the vocabulary."
      )
    if tag.startswith("<2"):
      raise errors.ConfigError(
        f"config.data.corpora={text!r}: the tag {tag!r} looks like a language tag; name it "
        "otherwise."
      )
    if any(c.prefix == prefix for c in out):
      raise errors.ConfigError(f"config.data.corpora={text!r}: {prefix!r} is listed twice.")
    out.append(Corpus(prefix, weight, tag))
  if not out:
    raise errors.ConfigError(f"config.data.corpora={text!r}: names no corpus.")
  return out


def is_multilingual(data_config: ml_collections.ConfigDict) -> bool:
  return bool(str(data_config.get("directions", "")).strip())


def trained(data_config: ml_collections.ConfigDict) -> list[Direction]:
  """The directions a multilingual config trains ([] for a bilingual one)."""
  return parse_directions(str(data_config.get("directions", "")))


def zero_shot(data_config: ml_collections.ConfigDict) -> list[Direction]:
  """The directions scored but never trained (`data.zero_shot`)."""
  return parse_directions(str(data_config.get("zero_shot", "")), "data.zero_shot")


def languages(data_config: ml_collections.ConfigDict) -> list[str]:
  """Every language a multilingual config names, in order of first mention."""
  langs: dict[str, None] = {}
  for d in trained(data_config) + zero_shot(data_config):
    langs.setdefault(d.src)
    langs.setdefault(d.tgt)
  return list(langs)


def user_symbols(data_config: ml_collections.ConfigDict) -> list[str]:
  """The reserved pieces the vocabulary must hold: a tag per language (every language, so that
  a zero-shot direction's target has one), then the corpora's tags."""
  if not is_multilingual(data_config):
    return []
  tags = [lang_tag(lang, data_config) for lang in languages(data_config)]
  corpora = parse_corpora(str(data_config.get("corpora", "")), data_config.train_prefix)
  return tags + list(dict.fromkeys(c.tag for c in corpora if c.tag))


def target_languages(data_config: ml_collections.ConfigDict) -> list[str]:
  """Languages a multilingual model may be asked to translate into: the targets of its trained
  directions, then those of its zero-shot ones (a language it only reads has an untrained tag)."""
  return list(dict.fromkeys(d.tgt for d in trained(data_config) + zero_shot(data_config)))


def many_to_many(data_config: ml_collections.ConfigDict) -> list[str]:
  """A many-to-many model's languages (`data.languages`, with `data.lang_tokens="m2m100"`: an
  imported M2M100's); [] for any other model."""
  return [x for x in (s.strip() for s in str(data_config.get("languages", "")).split(",")) if x]


# ISO 639-1 -> the ISO 639-3 code NLLB-200's FLORES-200 codes start with, for a hint only (the
# widely used languages; `arb`, `pes`, `zho` are FLORES-200's choices for ar, fa, zh).
_ISO_639_3 = dict(
  pair.split(":")
  for pair in (
    "af:afr am:amh ar:arb az:azj be:bel bg:bul bn:ben bs:bos ca:cat cs:ces cy:cym da:dan de:deu "
    "el:ell en:eng eo:epo es:spa et:est eu:eus fa:pes fi:fin fr:fra ga:gle gl:glg gu:guj ha:hau "
    "he:heb hi:hin hr:hrv hu:hun hy:hye id:ind ig:ibo is:isl it:ita ja:jpn jv:jav ka:kat kk:kaz "
    "km:khm kn:kan ko:kor ky:kir lo:lao lt:lit lv:lvs mk:mkd ml:mal mn:khk mr:mar ms:zsm my:mya "
    "ne:npi nl:nld no:nob pa:pan pl:pol ps:pbt pt:por ro:ron ru:rus si:sin sk:slk sl:slv so:som "
    "sq:als sr:srp sv:swe sw:swh ta:tam te:tel th:tha tl:tgl tr:tur uk:ukr ur:urd uz:uzn vi:vie "
    "xh:xho yo:yor zh:zho zu:zul"
  ).split()
)


def _pick(given: str, default: str, langs: list[str], flag: str) -> str:
  """`given` (or `default`) checked against a many-to-many model's languages: one line naming
  the closest it has when it has not that one."""
  lang = given or default
  if lang not in langs:
    # A longer spelling of one of its codes (deu, eng_Latn, pt-BR) first, then NLLB's code of
    # a two- or three-letter one (es or spa: spa_Latn), then the nearest.
    prefixes = sorted((x for x in langs if lang.lower().startswith(x)), key=len, reverse=True)
    iso3 = _ISO_639_3.get(lang.lower(), lang.lower() if len(lang) == 3 else "")
    flores = [x for x in langs if iso3 and x.split("_")[0] == iso3]
    close = prefixes or flores or difflib.get_close_matches(lang, langs, n=1, cutoff=0.0)
    hint = f" (closest: {close[0]})" if close else ""
    raise errors.ConfigError(
      f"--{flag}={lang}: this model has no such language{hint}; it has {len(langs)} "
      f"({', '.join(langs[:8])}{', ...' if len(langs) > 8 else ''})."
    )
  return lang


def resolve_source(data_config: ml_collections.ConfigDict, source_lang: str | None) -> str | None:
  """The language a decoding command reads (`--source_lang`, the server's "source_lang"): a
  many-to-many model's source token to put in front (default: its data.src_lang), else None
  (the model reads its source language without a token). ConfigError, one line, for a language
  the model does not read."""
  source = (source_lang or "").strip()
  langs = many_to_many(data_config)
  if langs:
    return _pick(source, str(data_config.src_lang), langs, "source_lang")
  if source:
    reads = list(dict.fromkeys(d.src for d in trained(data_config) + zero_shot(data_config)))
    reads = reads or [str(data_config.src_lang)]
    if source not in reads:
      raise errors.ConfigError(f"--source_lang={source}: this model reads {', '.join(reads)} only.")
  return None


def resolve_target(data_config: ml_collections.ConfigDict, target_lang: str | None) -> str | None:
  """The language a decoding command translates into (`--target_lang`, the server's
  "target_lang"): a multilingual model's tag to put in front (a many-to-many model's token to
  force first: default its data.tgt_lang), or None for a bilingual model.
  ConfigError, one line, for a language the model has no tag for, or a multilingual model
  asked without one when its directions go into several languages."""
  target = (target_lang or "").strip()
  langs = many_to_many(data_config)
  if langs:
    return _pick(target, str(data_config.tgt_lang), langs, "target_lang")
  if not is_multilingual(data_config):
    if target and target != data_config.tgt_lang:
      raise errors.ConfigError(
        f"--target_lang={target}: this model translates {data_config.src_lang}-"
        f"{data_config.tgt_lang} only."
      )
    return None
  known = target_languages(data_config)
  if target:
    if target not in known:
      raise errors.ConfigError(
        f"--target_lang={target}: unknown language; this model translates into {', '.join(known)}."
      )
    return target
  targets = list(dict.fromkeys(d.tgt for d in trained(data_config)))
  if len(targets) == 1:
    return targets[0]
  raise errors.ConfigError(
    f"This model translates into {', '.join(targets)}: give --target_lang (the server: "
    '"target_lang").'
  )
