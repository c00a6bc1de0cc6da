"""Where sentence pairs come from: TFDS (WMT14), local text files, or the demo generator.

A source streams (source, target) strings of a split in a fixed order; everything downstream
(vocabulary, tokenization cache, batching) is source-agnostic. Every error a user can cause (a
missing or empty file, mismatched line counts, invalid UTF-8, an unknown TFDS name) is a
`DataError` with one line naming the culprit, raised while reading, i.e. before training starts.
Empty lines are passed through: training drops (and counts) them, evaluation keeps file order.
"""

from __future__ import annotations

import abc
import hashlib
import itertools
import os
from collections.abc import Iterator, Sequence

import ml_collections
from absl import logging

from flaxformer_nmt.data import demo
from flaxformer_nmt.errors import DataError
from flaxformer_nmt.runtime import files

SPLITS = ("train", "dev", "test")

Pair = tuple[str, str]


class Source(abc.ABC):
  """Streams the pairs of the 'train', 'dev' and 'test' splits."""

  @abc.abstractmethod
  def check(self, splits: Sequence[str] = SPLITS) -> None:
    """Cheap checks of `splits` (files exist, names resolve) before any expensive work."""

  @abc.abstractmethod
  def iter_pairs(self, split: str) -> Iterator[Pair]:
    """(source, target) of `split`, always in the same order."""

  @abc.abstractmethod
  def fingerprint(self, split: str) -> str:
    """Identifies the content of `split` (for cache keys): changes when the data changes."""

  def size_hint(self, split: str) -> int | None:
    """Number of pairs of `split` when cheaply known (for progress ETAs), else None."""
    del split
    return None

  def split_name(self, split: str) -> str:
    """What `split` is called where it comes from (for reports), e.g. `newstest2014`."""
    return split


def _check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"Unknown split {split!r}; choose one of {SPLITS}.")


# --------------------------------------------------------------------------------------- demo


class DemoSource(Source):
  """The in-code EN->DE number corpus of `demo.py`; sizes from `data.demo_*_size`."""

  def __init__(self, data_config: ml_collections.ConfigDict) -> None:
    self._sizes = {
      "train": int(data_config.demo_train_size),
      "dev": int(data_config.demo_dev_size),
      "test": int(data_config.demo_test_size),
    }
    self._seed = int(data_config.get("demo_seed", 0))
    # Generated once per split (seconds for 200k pairs): the vocabulary and tokenization both read.
    self._generated: dict[str, list[Pair]] = {}

  def check(self, splits: Sequence[str] = SPLITS) -> None:
    del splits  # generated in code: the sizes are checked by config.checks.validate

  def iter_pairs(self, split: str) -> Iterator[Pair]:
    _check_split(split)
    if split not in self._generated:
      self._generated[split] = demo.make_demo_split(split, self._sizes[split], self._seed)
    return iter(self._generated[split])

  def fingerprint(self, split: str) -> str:
    return f"demo-v1-{split}-{self._sizes[split]}-{self._seed}"

  def split_name(self, split: str) -> str:
    return f"demo {split}"

  def size_hint(self, split: str) -> int | None:
    return self._sizes[split]


# -------------------------------------------------------------------------------------- files


def read_lines(path: str) -> Iterator[str]:
  """Lines of a corpus file (files.iter_lines), and a DataError if there are none."""
  empty = True
  for line in files.iter_lines(path):
    empty = False
    yield line
  if empty:
    raise DataError(f"{path}: file is empty.")


def _count_rest(lines: Iterator[str]) -> int:
  return sum(1 for _ in lines)


class FilesSource(Source):
  """`<dir>/<prefix>.<lang>[.gz]` line-aligned pairs, or `<dir>/<prefix>.tsv[.gz]` (src<TAB>tgt).

  A TSV holds (source, target) in that order. Files named as fairseq names them,
  `<prefix>.<src>-<tgt>.<lang>` (or `.tsv`), are read too, and so is the pair named the other way
  round. A multilingual config makes one FilesSource per direction and corpus (`src_lang`,
  `tgt_lang`, `prefixes` override the config's); there a bare `<prefix>.tsv` is not read.
  """

  def __init__(
    self,
    data_config: ml_collections.ConfigDict,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    prefixes: dict[str, str] | None = None,
  ) -> None:
    self._dir = data_config.dir
    self._prefixes = prefixes or {
      "train": data_config.train_prefix,
      "dev": data_config.dev_prefix,
      "test": data_config.test_prefix,
    }
    self._src_lang = src_lang or data_config.src_lang
    self._tgt_lang = tgt_lang or data_config.tgt_lang
    self._bare_tsv = src_lang is None
    # Where the files can be downloaded from (Multi30k): then a missing file names the fix.
    self._hint = " Run --mode=prepare to download them." if data_config.get("url") else ""

  def _existing(self, stem: str) -> str | None:
    for path in (stem, stem + ".gz"):
      if os.path.isfile(path):
        return path
    return None

  def _find(self, stem: str) -> tuple[tuple[str, ...], bool] | None:
    """(the TSV or the (source, target) files under `stem`, whether a TSV holds (target,
    source)), or None."""
    s, t = self._src_lang, self._tgt_lang
    if self._bare_tsv and (tsv := self._existing(stem + ".tsv")):
      return (tsv,), False
    src, tgt = self._existing(f"{stem}.{s}"), self._existing(f"{stem}.{t}")
    if src and tgt:
      return (src, tgt), False
    for pair, swapped in ((f"{s}-{t}", False), (f"{t}-{s}", True)):
      if tsv := self._existing(f"{stem}.{pair}.tsv"):
        return (tsv,), swapped
      src, tgt = self._existing(f"{stem}.{pair}.{s}"), self._existing(f"{stem}.{pair}.{t}")
      if src and tgt:
        return (src, tgt), False
    return None

  def has(self, split: str) -> bool:
    """Whether `split`'s files exist (a multilingual corpus may lack some directions)."""
    return self._find(os.path.join(self._dir, self._prefixes[split])) is not None

  def files(self, split: str) -> tuple[str, ...]:
    """The one TSV or the two (source, target) files of `split`; DataError naming what's missing."""
    _check_split(split)
    stem = os.path.join(self._dir, self._prefixes[split])
    found = self._find(stem)
    if found:
      return found[0]
    s, t = self._src_lang, self._tgt_lang
    if not self._bare_tsv:
      raise DataError(
        f"{self._prefixes[split]!r} of {s}-{t}: none of {stem}.{s} and .{t}, {stem}.{s}-{t}.{s} "
        f"and .{t}, {stem}.{t}-{s}.{s} and .{t}, {stem}.{s}-{t}.tsv, {stem}.{t}-{s}.tsv "
        f"([.gz] each).{self._hint}"
      )
    pairs = ((s, self._existing(f"{stem}.{s}")), (t, self._existing(f"{stem}.{t}")))
    missing = [f"{stem}.{lang}[.gz]" for lang, path in pairs if not path]
    raise DataError(
      f"data.{split}_prefix={self._prefixes[split]!r}: missing {' and '.join(missing)} "
      f"(and no {stem}.tsv[.gz]).{self._hint}"
    )

  def check(self, splits: Sequence[str] = SPLITS) -> None:
    if os.path.exists(self._dir) and not os.path.isdir(self._dir):
      raise DataError(f"data.dir={self._dir!r}: is a file, not the folder of the corpus.")
    if not os.path.isdir(self._dir):
      raise DataError(f"data.dir={self._dir!r}: no such folder.{self._hint}")
    for split in splits:
      for path in self.files(split):
        if os.path.getsize(path) == 0:
          raise DataError(f"{path}: file is empty.")

  def iter_pairs(self, split: str) -> Iterator[Pair]:
    paths = self.files(split)
    if len(paths) == 1:
      swapped = self._find(os.path.join(self._dir, self._prefixes[split]))[1]  # type: ignore[index]
      pairs = self._iter_tsv(paths[0])
      return ((t, s) for s, t in pairs) if swapped else pairs
    return self._iter_aligned(*paths)

  def _iter_tsv(self, path: str) -> Iterator[Pair]:
    for lineno, line in enumerate(read_lines(path), start=1):
      fields = line.split("\t")
      if len(fields) != 2:
        if not line.strip():
          yield "", ""  # An empty line: dropped and counted by training like any empty pair.
          continue
        raise DataError(
          f"{path}:{lineno}: expected 'source<TAB>target', found {len(fields)} fields."
        )
      yield fields[0].strip(), fields[1].strip()

  def _iter_aligned(self, src_path: str, tgt_path: str) -> Iterator[Pair]:
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    n = 0
    for src, tgt in itertools.zip_longest(src_lines, tgt_lines):
      if src is None or tgt is None:
        n_src = n + (src is not None) + _count_rest(src_lines)
        n_tgt = n + (tgt is not None) + _count_rest(tgt_lines)
        raise DataError(
          f"Line counts differ: {src_path} has {n_src} lines but {tgt_path} has {n_tgt}."
        )
      n += 1
      yield src.strip(), tgt.strip()

  def fingerprint(self, split: str) -> str:
    parts = []
    for path in self.files(split):
      st = os.stat(path)
      parts.append(f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}")
    if not self._bare_tsv:  # which side is the source: a TSV read either way round
      parts.append(f"{self._src_lang}-{self._tgt_lang}")
    return "files-v1-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

  def split_name(self, split: str) -> str:
    return self._prefixes[split]  # e.g. newstest2014 or test_2016_flickr


# --------------------------------------------------------------------------------------- TFDS


def import_tfds():  # -> module; lazy: importing TFDS costs seconds and only this source needs it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  # TFDS registers a builder when its module is imported; without TensorFlow `tfds.builder` does not
  # import the catalogue, so import the translation builders we support explicitly.
  for module in ("wmt14", "wmt15", "wmt16", "wmt17", "wmt18", "wmt19", "wmt13", "wmt_t2t"):
    try:
      __import__(f"tensorflow_datasets.translate.{module}")
    except ImportError as e:  # pragma: no cover - depends on the TFDS version
      logging.warning("Could not import tensorflow_datasets.translate.%s: %s", module, e)
  return tfds


class TfdsSource(Source):
  """A TFDS translation dataset (default `wmt14_translate/de-en`), read without TensorFlow.

  Reads through `tfds.data_source` (random access over array_record files, no TensorFlow). A
  dataset prepared as TFRecord needs `tfds.load`, hence TensorFlow: used only if it is installed.
  The supervised keys are (de, en) / (fr, en); `data.src_lang` / `data.tgt_lang` pick the direction.
  """

  def __init__(self, data_config: ml_collections.ConfigDict) -> None:
    self._name = data_config.tfds_name
    self._data_dir = data_config.tfds_data_dir or None
    self._splits = {
      "train": data_config.train_split,
      "dev": data_config.dev_split,
      "test": data_config.test_split,
    }
    self._src_lang = data_config.src_lang
    self._tgt_lang = data_config.tgt_lang
    self._tfds = import_tfds()

  def check(self, splits: Sequence[str] = SPLITS) -> None:
    del splits  # the dataset and config names are the same for every split
    tfds = self._tfds
    dataset, _, config = self._name.partition("/")
    try:
      builder_cls = tfds.builder_cls(dataset)
    except Exception:  # pylint: disable=broad-except  # DatasetNotFoundError and friends
      raise DataError(f"data.tfds_name={self._name!r}: unknown TFDS dataset {dataset!r}.") from None
    configs = {c.name: c for c in getattr(builder_cls, "BUILDER_CONFIGS", [])}
    if configs and config not in configs:
      raise DataError(
        f"data.tfds_name={self._name!r}: unknown config {config!r}; "
        f"choose one of {sorted(configs)}."
      )
    pair = getattr(configs.get(config), "language_pair", None)
    if pair is not None:
      for field, lang in (("src_lang", self._src_lang), ("tgt_lang", self._tgt_lang)):
        if lang not in pair:
          raise DataError(
            f"data.{field}={lang!r} is not a language of {self._name} (languages: {pair})."
          )

  def _load(self, split: str):  # -> Sequence[dict] or an iterable of dicts
    tfds = self._tfds
    name = self._splits[split]
    try:
      return tfds.data_source(self._name, split=name, data_dir=self._data_dir, download=False)
    except Exception as e:  # pylint: disable=broad-except
      first_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    builder = tfds.builder(self._name, data_dir=self._data_dir)
    if not builder.is_prepared():
      data_dir = f" --data_dir={self._data_dir}" if self._data_dir else ""
      raise DataError(
        f"data.tfds_name={self._name!r}: not prepared in {builder.data_dir} (nothing is "
        f"downloaded during training); run once: tfds build {self._name} "
        f"--file_format=array_record{data_dir}"
      )
    try:
      import tensorflow  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    except ImportError:
      raise DataError(
        f"data.tfds_name={self._name!r} split {name!r}: cannot read it without TensorFlow "
        f"({first_error}); prepare it with file_format=array_record in data.tfds_data_dir."
      ) from None
    logging.info("tfds.data_source failed (%s); falling back to tfds.load.", first_error)
    try:
      ds = tfds.load(self._name, split=name, data_dir=self._data_dir, download=False)
    except Exception as e:  # pylint: disable=broad-except
      reason = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise DataError(f"data.tfds_name={self._name!r} split {name!r}: {reason}") from None
    return tfds.as_numpy(ds)

  def iter_pairs(self, split: str) -> Iterator[Pair]:
    _check_split(split)
    for i, example in enumerate(_iter_examples(self._load(split))):
      try:
        src, tgt = example[self._src_lang], example[self._tgt_lang]
      except KeyError:
        raise DataError(
          f"{self._name} {self._splits[split]}: examples have keys {sorted(example)}, not "
          f"data.src_lang={self._src_lang!r} and data.tgt_lang={self._tgt_lang!r}."
        ) from None
      yield _text(src, self._name, i).strip(), _text(tgt, self._name, i).strip()

  def fingerprint(self, split: str) -> str:
    parts = (self._name, self._data_dir, self._splits[split], self._src_lang, self._tgt_lang)
    return "tfds-v1-" + "-".join(map(str, parts))

  def split_name(self, split: str) -> str:
    """The WMT sets a split is made of, from the builder (wmt14_translate: `newstest2014` for
    test, `newstest2013` for validation), else the TFDS split's own name."""
    name = self._splits[split]
    try:
      subsets = self._tfds.builder(self._name, data_dir=self._data_dir).subsets
    except Exception:  # pylint: disable=broad-except  # not a WMT builder, or no subsets
      return name
    return "+".join(subsets.get(name, [])) or name

  def size_hint(self, split: str) -> int | None:
    try:
      return len(self._load(split))  # type: ignore[arg-type]
    except Exception:  # pylint: disable=broad-except
      return None


def _iter_examples(data) -> Iterator[dict]:
  """Examples in order; reads a random-access data source in chunks (array_record reads a chunk
  in parallel), falling back to one at a time where batch reads fail (TFDS 4.9.10's mock)."""
  if not (hasattr(data, "__getitems__") and hasattr(data, "__len__")):
    yield from data
    return
  n = len(data)
  try:
    first = data.__getitems__(list(range(min(1024, n))))
  except TypeError as e:
    logging.info("Batch reads failed (%s); reading examples one at a time.", e)
    yield from (data[i] for i in range(n))
    return
  yield from first
  for start in range(1024, n, 1024):
    yield from data.__getitems__(list(range(start, min(start + 1024, n))))


def _text(value: str | bytes, name: str, index: int) -> str:
  if isinstance(value, bytes):
    try:
      return value.decode("utf-8")
    except UnicodeDecodeError:
      raise DataError(f"{name}: example {index} is not valid UTF-8.") from None
  return str(value)


# ------------------------------------------------------------------------------------ factory


def make_source(data_config: ml_collections.ConfigDict) -> Source:
  """The source named by `data.source` (one of config.choices.SOURCES)."""
  kinds = {"demo": DemoSource, "files": FilesSource, "tfds": TfdsSource}
  return kinds[data_config.source](data_config)
