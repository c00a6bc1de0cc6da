"""Demo corpus: deterministic, disjoint splits, varied and short."""

from __future__ import annotations

import pytest

from flaxformer_nmt.data import demo


def test_deterministic() -> None:
  assert demo.make_demo_split("train", 300, seed=0) == demo.make_demo_split("train", 300, seed=0)
  assert demo.make_demo_split("train", 300, seed=0) != demo.make_demo_split("train", 300, seed=1)
  # A longer split extends a shorter one: sizes can grow without reshuffling.
  assert demo.make_demo_split("dev", 50, seed=0)[:20] == demo.make_demo_split("dev", 20, seed=0)


def test_splits_are_disjoint() -> None:
  sources = {
    split: {src for src, _ in demo.make_demo_split(split, size, seed=0)}
    for split, size in (("train", 5000), ("dev", 500), ("test", 500))
  }
  assert not sources["train"] & sources["dev"]
  assert not sources["train"] & sources["test"]
  assert not sources["dev"] & sources["test"]
  assert len(sources["test"]) == 500  # held-out sentences are distinct


def test_split_follows_hash() -> None:
  for split in demo.SPLITS:
    assert all(demo.split_of(src) == split for src, _ in demo.make_demo_split(split, 100, seed=3))


def test_varied_and_short() -> None:
  pairs = demo.make_demo_split("train", 3000, seed=0)
  sources = [src for src, _ in pairs]
  for marker in (
    "apples",
    "chairs",
    "books",
    "years old",
    "day",
    "house",
    "time",
    "born",
    "year",
    "o'clock",
  ):
    assert any(marker in s for s in sources), marker
  assert any("thousand" in s for s in sources)  # large numbers
  assert any(s in ("three", "five", "seven") for s in sources)  # small bare numbers
  assert any(t.startswith("am ") and "ten Tag" in t for _, t in pairs)  # dative ordinal
  assert max(len(s.split()) + len(t.split()) for s, t in pairs) <= 20
  assert all(s and t for s, t in pairs)


def test_bad_split() -> None:
  with pytest.raises(ValueError, match="Unknown demo split 'valid'"):
    demo.make_demo_split("valid", 10, seed=0)


def test_the_large_variant_is_a_shifted_domain() -> None:
  """5- and 6-digit numbers only, none of its sentences in the standard corpus (which stops at 4
  digits), and the standard corpus unchanged by the variant's existence."""
  large = demo.make_demo_split("train", 300, 0, "large")
  assert large == demo.make_demo_split("train", 300, 0, "large")
  assert all("tausend" in de for _, de in large)
  standard = demo.make_demo_split("train", 3000, 0)
  assert not {en for en, _ in large} & {en for en, _ in standard}
  assert standard == demo.make_demo_split("train", 3000, 0, "standard")
  for split in ("dev", "test"):  # held-out splits stay disjoint by the same hash
    assert all(demo.split_of(en) == split for en, _ in demo.make_demo_split(split, 50, 0, "large"))
