"""A deterministic English->German corpus generated in code, so the whole system runs offline.

Numbers are the core of it: German writes "forty-five" as "fünfundvierzig" (units before tens, one
compound word), so a model must reorder and compound, which exercises attention without needing a
real corpus. A dozen short templates around cardinals, ordinals and years, every number spelled
out, add word-order changes ("She was born in nineteen ninety-nine." -> "Sie wurde
neunzehnhundertneunundneunzig geboren."). The task is regular and its vocabulary small, so a tiny
Transformer learns it to a high BLEU in minutes on a CPU.

Splits are disjoint by construction: every candidate sentence is assigned to exactly one split by a
stable hash of its English side, so no test source ever appears in training.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable

from num2words import num2words

SPLITS = ("train", "dev", "test")

# Share of the hash space (out of _HASH_BUCKETS) owned by each held-out split; train owns the rest.
# 5% each keeps rejection sampling for dev/test cheap while leaving 90% of sentences for training.
_HASH_BUCKETS = 1000
_DEV_BUCKETS = range(0, 50)
_TEST_BUCKETS = range(50, 100)


@functools.cache
def _words(n: int, lang: str, to: str) -> str:
  """num2words is ~100 us a call; numbers repeat a lot, so a cache makes generation ~50x faster."""
  return num2words(n, lang=lang, to=to)


def _cardinal(rng: random.Random, low: int = 0) -> int:
  """A number whose digit count is drawn first, so both small and large numbers appear often."""
  magnitude = rng.choices((1, 2, 3, 4), weights=(0.15, 0.3, 0.3, 0.25))[0]
  lo = max(low, 0 if magnitude == 1 else 10 ** (magnitude - 1))
  return rng.randint(lo, 10**magnitude - 1)


def _large_cardinal(rng: random.Random, low: int = 0) -> int:
  """5- and 6-digit numbers ("zweiundvierzigtausenddreihundertsieben"), which the standard corpus
  never holds (it stops at 4 digits): the shifted domain of the LARGE variant."""
  del low
  return rng.randint(10_000, 999_999)


def _ordinal(rng: random.Random) -> int:
  """Ordinals from 1 to 999, mostly small (as ordinals are in text)."""
  magnitude = rng.choices((1, 2, 3), weights=(0.3, 0.4, 0.3))[0]
  return rng.randint(1 if magnitude == 1 else 10 ** (magnitude - 1), 10**magnitude - 1)


def _year(rng: random.Random) -> int:
  # num2words writes years in this range idiomatically in both languages ("nineteen ninety-nine",
  # "neunzehnhundertneunundneunzig"); years like 100 give odd German ("einshundert").
  return rng.randint(1100, 2099)


def _en(n: int, to: str = "cardinal") -> str:
  return _words(n, "en", to)


def _de(n: int, to: str = "cardinal") -> str:
  return _words(n, "de", to)


# Each template draws its numbers and returns (english, german). Plural nouns need n >= 2 (German
# "eins" would be ungrammatical before a noun); "am"/"zum" take the ordinal's dative "-n" ending
# ("am dritten Tag"), which num2words' nominative form plus "n" gives for every ordinal.
Template = Callable[[random.Random], tuple[str, str]]


def _apples(rng: random.Random, number: Callable[..., int] = _cardinal) -> tuple[str, str]:
  n = number(rng, low=2)
  return f"I have {_en(n)} apples.", f"Ich habe {_de(n)} Äpfel."


def _chairs(rng: random.Random, number: Callable[..., int] = _cardinal) -> tuple[str, str]:
  n = number(rng, low=2)
  return f"We need {_en(n)} chairs.", f"Wir brauchen {_de(n)} Stühle."


def _books(rng: random.Random, number: Callable[..., int] = _cardinal) -> tuple[str, str]:
  n = number(rng, low=2)
  return (f"There are {_en(n)} books on the table.", f"Auf dem Tisch liegen {_de(n)} Bücher.")


def _age(rng: random.Random) -> tuple[str, str]:
  n = rng.randint(2, 120)
  return f"He is {_en(n)} years old.", f"Er ist {_de(n)} Jahre alt."


def _day(rng: random.Random) -> tuple[str, str]:
  n = _ordinal(rng)
  return f"on the {_en(n, 'ordinal')} day", f"am {_de(n, 'ordinal')}n Tag"


def _house(rng: random.Random) -> tuple[str, str]:
  n = _ordinal(rng)
  return f"the {_en(n, 'ordinal')} house", f"das {_de(n, 'ordinal')} Haus"


def _time(rng: random.Random) -> tuple[str, str]:
  n = _ordinal(rng)
  return f"for the {_en(n, 'ordinal')} time", f"zum {_de(n, 'ordinal')}n Mal"


def _born(rng: random.Random) -> tuple[str, str]:
  y = _year(rng)
  return f"She was born in {_en(y, 'year')}.", f"Sie wurde {_de(y, 'year')} geboren."


def _in_year(rng: random.Random) -> tuple[str, str]:
  y = _year(rng)
  return f"in the year {_en(y, 'year')}", f"im Jahr {_de(y, 'year')}"


def _train(rng: random.Random) -> tuple[str, str]:
  h = rng.randint(1, 12)
  # German says "ein Uhr", not "eins Uhr".
  de = "ein" if h == 1 else _de(h)
  return f"The train leaves at {_en(h)} o'clock.", f"Der Zug fährt um {de} Uhr ab."


def _bare_cardinal(rng: random.Random, number: Callable[..., int] = _cardinal) -> tuple[str, str]:
  n = number(rng)
  return _en(n), _de(n)


def _bare_ordinal(rng: random.Random) -> tuple[str, str]:
  n = _ordinal(rng)
  return _en(n, "ordinal"), _de(n, "ordinal")


TEMPLATES: tuple[Template, ...] = (
  _apples,
  _chairs,
  _books,
  _age,
  _day,
  _house,
  _time,
  _born,
  _in_year,
  _train,
  _bare_cardinal,
  _bare_ordinal,
)


# The shifted domain (`variant="large"`): the four cardinal templates with 5- and 6-digit numbers.
# Its sentences never occur in the standard corpus, so a model trained there meets numbers it has
# never seen the German of: a small in-domain set to fine-tune on (docs/fine-tuning.md).
LARGE_TEMPLATES: tuple[Template, ...] = tuple(
  functools.partial(t, number=_large_cardinal) for t in (_apples, _chairs, _books, _bare_cardinal)
)
VARIANTS = {"standard": TEMPLATES, "large": LARGE_TEMPLATES}


def split_of(source: str) -> str:
  """The split that owns a source sentence: a stable hash, so splits never share a sentence."""
  bucket = int.from_bytes(hashlib.md5(source.encode("utf-8")).digest()[:8], "little")
  bucket %= _HASH_BUCKETS
  if bucket in _DEV_BUCKETS:
    return "dev"
  if bucket in _TEST_BUCKETS:
    return "test"
  return "train"


def make_demo_split(
  split: str, size: int, seed: int, variant: str = "standard"
) -> list[tuple[str, str]]:
  """`size` (english, german) pairs of `split`, identical for the same (split, size, seed,
  variant); `variant` "large" draws from LARGE_TEMPLATES.

  Candidates come from a stream seeded by (seed, split) and are kept only when the hash of their
  English side assigns them to `split`. Held-out splits hold distinct sentences (so BLEU is not
  dominated by repeats); train may repeat a sentence, as real corpora do.
  """
  if split not in SPLITS:
    raise ValueError(f"Unknown demo split {split!r}; choose one of {SPLITS}.")
  templates = VARIANTS[variant]
  tag = "" if variant == "standard" else f"-{variant}"  # the standard corpus as it always was
  rng = random.Random(f"flaxformer_nmt-demo-{seed}-{split}{tag}")
  pairs: list[tuple[str, str]] = []
  seen: set[str] = set()
  while len(pairs) < size:
    src, tgt = rng.choice(templates)(rng)
    if split_of(src) != split:
      continue
    if split != "train":
      if src in seen:
        continue
      seen.add(src)
    pairs.append((src, tgt))
  return pairs
