"""Many directions in one model: which directions, which corpora, tags and sampling weights.

A multilingual config sets `data.directions` ("en-de,de-en,en-fr,..."). Every source then starts
with the target language's tag, a reserved piece of the shared vocabulary (`<2de>`, a
SentencePiece user-defined symbol, Johnson et al. 2017), and a corpus may add its own tag after
it (`<BT>` on back-translated data: tagged back-translation, Caswell et al. 2019). Tags are ids
put in front of the encoded source, never text, so a tag is one piece whatever the text around it.

Training draws its pairs from every (direction, corpus) with a temperature (M2M-100, mBART):
direction d gets p_d proportional to n_d^(1/T), where n_d is its corpora's weighted size, and
within a direction each corpus gets its weighted share. T = 1 samples as the data is; T = inf
samples every direction equally. A bilingual config (`data.directions` = "") is untouched.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import ml_collections
import numpy as np

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


def lang_tag(lang: str) -> str:
  """The target-language tag put in front of every source: `<2fr>`."""
  return f"<2{lang}>"


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
    if not weight > 0 or not np.isfinite(weight):
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
  tags = [lang_tag(lang) for lang in languages(data_config)]
  corpora = parse_corpora(str(data_config.get("corpora", "")), data_config.train_prefix)
  return tags + list(dict.fromkeys(c.tag for c in corpora if c.tag))


def target_languages(data_config: ml_collections.ConfigDict) -> list[str]:
  """Languages a multilingual model may be asked to translate into: the targets of its trained
  directions, then those of its zero-shot ones (a language it only reads has an untrained tag)."""
  return list(dict.fromkeys(d.tgt for d in trained(data_config) + zero_shot(data_config)))


def sampling_probabilities(
  direction_of: Sequence[int], weighted_sizes: Sequence[float], temperature: float
) -> np.ndarray:
  """Probability of each group (a direction's corpus) from its direction and weighted size:
  direction d gets p_d proportional to n_d^(1/T), n_d its groups' summed weighted sizes, split
  among its groups in proportion to their weighted sizes. Returns [groups], summing to 1."""
  direction_of = np.asarray(direction_of, np.int64)  # [groups]
  sizes = np.asarray(weighted_sizes, np.float64)  # [groups]
  totals = np.bincount(direction_of, weights=sizes)  # [directions]
  if not totals.sum() > 0:
    raise errors.DataError("No training pairs in any direction.")
  # Relative to the largest, so that a low temperature cannot overflow: (n / n_max)^(1/T) <= 1.
  relative = totals / totals.max()
  scaled = np.where(totals > 0, np.maximum(relative, 1e-300) ** (1.0 / temperature), 0.0)
  p_dir = scaled / scaled.sum()  # [directions]
  share = np.divide(sizes, totals[direction_of], out=np.zeros_like(sizes), where=sizes > 0)
  return p_dir[direction_of] * share


def epoch_counts(
  probabilities: Sequence[float], total: int, rng: np.random.Generator | None = None
) -> np.ndarray:
  """How many of an epoch's `total` draws each group gets: probability x total, rounded down,
  and the draws left over given to groups by their remainders, so the counts sum to `total`
  exactly. With `rng` (an epoch's generator: deterministic) the leftovers are drawn, each group
  with probability its remainder, so its expected count is exactly its share and a group owed
  less than one draw an epoch still gets it over epochs; without `rng` they go to the largest
  remainders."""
  p = np.asarray(probabilities, np.float64)
  exact = p / p.sum() * total
  counts = np.floor(exact).astype(np.int64)
  rest = total - int(counts.sum())
  remainders = exact - counts
  if rest and rng is not None:
    # Systematic sampling: group i is chosen with probability exactly remainders[i] (< 1 each,
    # summing to `rest`), so its expected count is its exact share.
    points = rng.random() + np.arange(rest)  # [rest]
    chosen = np.minimum(np.searchsorted(np.cumsum(remainders), points, side="right"), len(p) - 1)
  else:
    chosen = np.argsort(-remainders, kind="stable")[:rest]
  counts[chosen] += 1
  return counts


def resolve_target(data_config: ml_collections.ConfigDict, target_lang: str | None) -> str | None:
  """The language a decoding command translates into (`--target_lang`, the server's
  "target_lang"): a multilingual model's tag to put in front, or None for a bilingual model.
  ConfigError, one line, for a language the model has no tag for, or a multilingual model
  asked without one when its directions go into several languages."""
  target = (target_lang or "").strip()
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
