"""The input side of a multilingual config: every direction's corpora, the language-balanced
vocabulary sample, the training split with its groups, and each direction's dev and test sets.

directions.py says what the config asks for; this module finds the files (sources.FilesSource,
one per direction and corpus), and pipeline.make_data puts the pieces into its `Data`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Sequence

import ml_collections
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions
from flaxformer_nmt.data import direction_mix, sources, streams, tokenized
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.data.tokenizer import source_prefix


@dataclasses.dataclass(frozen=True)
class TrainCorpus:
  """One group of the training split: a direction's corpus, and where its pairs are read."""

  direction: directions.Direction
  corpus: directions.Corpus
  source: sources.FilesSource

  @property
  def name(self) -> str:
    return f"{self.direction.name}:{self.corpus.prefix}"


def _source(
  dc: ml_collections.ConfigDict, d: directions.Direction, **prefixes: str
) -> sources.FilesSource:
  full = {"train": dc.train_prefix, "dev": dc.dev_prefix, "test": dc.test_prefix, **prefixes}
  return sources.FilesSource(dc, src_lang=d.src, tgt_lang=d.tgt, prefixes=full)


def train_corpora(dc: ml_collections.ConfigDict) -> list[TrainCorpus]:
  """Every (direction, corpus) with files, in config order. DataError for a direction without its
  first corpus (its main data), or a further corpus found for no direction (a typo would
  otherwise be skipped silently)."""
  corpora = directions.parse_corpora(str(dc.get("corpora", "")), dc.train_prefix)
  out: list[TrainCorpus] = []
  for d in directions.trained(dc):
    for i, corpus in enumerate(corpora):
      source = _source(dc, d, train=corpus.prefix)
      if source.has("train"):
        out.append(TrainCorpus(d, corpus, source))
      elif i == 0:
        source.files("train")  # raises, naming the files looked for
  for corpus in corpora[1:]:
    if not any(c.corpus == corpus for c in out):
      raise errors.DataError(
        f"config.data.corpora: no direction has files of {corpus.prefix!r} in "
        f"{dc.dir} (such as {corpus.prefix}.en-de.en or {corpus.prefix}.en)."
      )
  return out


def eval_sources(dc: ml_collections.ConfigDict, split: str) -> dict[str, sources.FilesSource]:
  """{direction name: its source} of the dev ("dev": trained directions) or test split ("test":
  trained, then zero-shot directions)."""
  chosen = directions.trained(dc) + (directions.zero_shot(dc) if split == "test" else [])
  return {d.name: _source(dc, d) for d in chosen}


def check(dc: ml_collections.ConfigDict, need_train: bool, eval_splits: Sequence[str]) -> None:
  """The cheap checks of every file the command will read, before any expensive work."""
  if need_train:
    for c in train_corpora(dc):
      c.source.check(("train",))
  for split in eval_splits:
    for source in eval_sources(dc, split).values():
      source.check((split,))


def _language_lines(
  corpora: Sequence[TrainCorpus],
) -> dict[str, list[tuple[sources.FilesSource, int]]]:
  """{language: [(files, side)]}: where each language's training sentences are, each file read
  once (multi-way files serve several directions)."""
  out: dict[str, list[tuple[sources.FilesSource, int]]] = {}
  seen: set[tuple[tuple[str, ...], int]] = set()
  for c in corpora:
    files = tuple(c.source.files("train"))
    for side, lang in enumerate((c.direction.src, c.direction.tgt)):
      key = (files, side) if len(files) == 1 else ((files[side],), 0)
      if key in seen:
        continue
      seen.add(key)
      out.setdefault(lang, []).append((c.source, side))
  return out


def _sentences(where: list[tuple[sources.FilesSource, int]]) -> Iterator[str]:
  for source, side in where:
    for pair in source.iter_pairs("train"):
      if pair[side]:
        yield pair[side]


def vocabulary_sample(dc: ml_collections.ConfigDict, seed: int) -> list[str]:
  """The sentences the shared vocabulary is trained on, balanced over languages with the
  sampling temperature: language l gets q_l proportional to n_l^(1/T) of L x
  data.vocab_sample_size sentences (L languages; at most its n_l), so a small language's script
  and words are not drowned by a large one's. Seeded and in a fixed order: deterministic."""
  where = _language_lines(train_corpora(dc))
  counts = {lang: sum(1 for _ in _sentences(w)) for lang, w in where.items()}
  q = direction_mix.sampling_probabilities(
    list(range(len(counts))), list(counts.values()), float(dc.temperature)
  )
  budget = len(counts) * int(dc.vocab_sample_size)
  out: list[str] = []
  for (lang, w), share in zip(where.items(), q, strict=True):
    n = counts[lang]
    k = min(n, round(share * budget))
    rng = random.Random(f"{seed}-{lang}")
    chosen = set(rng.sample(range(n), k)) if k < n else None
    out.extend(s for i, s in enumerate(_sentences(w)) if chosen is None or i in chosen)
    logging.info("Vocabulary sample: %d of %d %s sentences.", k, n, lang)
  return out


def train_split(
  dc: ml_collections.ConfigDict,
  tokenizer: tokenizer_lib.Tokenizer,
  cache_dir: str | None,
  shard: tokenized.Shard,
) -> tuple[tokenized.TokenizedSplit, streams.Groups]:
  """This process's shard of every group, one group after another, and the groups' sampling."""
  corpora = train_corpora(dc)
  direction_index = {d: i for i, d in enumerate(directions.trained(dc))}
  parts = []
  for c in corpora:
    prefix = source_prefix(tokenizer, c.direction.tgt, c.corpus.tag, dc)
    parts.append(
      tokenized.load_or_tokenize(c.source, "train", tokenizer, cache_dir, shard, src_prefix=prefix)
    )
  of_pair = np.concatenate([np.full(len(p), g, np.int32) for g, p in enumerate(parts)])
  groups = streams.Groups(
    of_pair=of_pair,
    direction_of=tuple(direction_index[c.direction] for c in corpora),
    weights=tuple(c.corpus.weight for c in corpora),
    temperature=float(dc.temperature),
  )
  sizes = [len(p) * c.corpus.weight for p, c in zip(parts, corpora, strict=True)]
  p = direction_mix.sampling_probabilities(groups.direction_of, sizes, groups.temperature)
  logging.info(
    "Training groups (this process's pairs, sampling probability at T=%g): %s.",
    groups.temperature,
    ", ".join(
      f"{c.name} {len(part)} ({prob:.3f})" for c, part, prob in zip(corpora, parts, p, strict=True)
    ),
  )
  return tokenized.concatenate(parts), groups
