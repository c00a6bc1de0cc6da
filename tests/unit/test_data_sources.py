"""Sources: local files (plain, .gz, TSV), TFDS through its offline mock, and every bad-input error.

Each error must be a DataError of one line naming the culprit, raised while reading.
"""

from __future__ import annotations

import gzip
import pathlib
import types

import ml_collections
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.data import sources

_EN = ["A dog runs.", "Two men talk.", "", "A red car."]
_DE = ["Ein Hund rennt.", "Zwei Männer reden.", "Leer.", "Ein rotes Auto."]


def _config(data_dir: pathlib.Path, **overrides) -> ml_collections.ConfigDict:
  c = config_lib.base_config("tiny").data
  c.source = "files"
  c.dir = str(data_dir)
  c.update(overrides)
  return c


def _write(path: pathlib.Path, lines: list[str] | bytes) -> None:
  data = (
    lines if isinstance(lines, bytes) else "".join(line + "\n" for line in lines).encode("utf-8")
  )
  if path.suffix == ".gz":
    with gzip.open(path, "wb") as f:
      f.write(data)
  else:
    path.write_bytes(data)


def _write_splits(d: pathlib.Path, suffix: str = "") -> None:
  for prefix in ("train", "val", "test"):
    _write(d / f"{prefix}.en{suffix}", _EN)
    _write(d / f"{prefix}.de{suffix}", _DE)


def _one_line_error(fn, match: str) -> str:
  with pytest.raises(errors.DataError, match=match) as e:
    fn()
  assert "\n" not in str(e.value)
  return str(e.value)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_aligned_files(tmp_path: pathlib.Path, suffix: str) -> None:
  _write_splits(tmp_path, suffix)
  source = sources.make_source(_config(tmp_path))
  source.check()
  # Empty lines are kept, in order.
  assert list(source.iter_pairs("dev")) == list(zip(_EN, _DE, strict=True))
  reverse = list(
    sources.make_source(_config(tmp_path, src_lang="de", tgt_lang="en")).iter_pairs("test")
  )
  assert reverse == list(zip(_DE, _EN, strict=True))


def test_tsv_and_crlf(tmp_path: pathlib.Path) -> None:
  _write_splits(tmp_path)
  (tmp_path / "train.tsv").write_bytes(b"A dog.\tEin Hund.\r\n\r\nA cat. \t Eine Katze.\n")
  pairs = list(sources.make_source(_config(tmp_path)).iter_pairs("train"))
  assert pairs == [("A dog.", "Ein Hund."), ("", ""), ("A cat.", "Eine Katze.")]


def test_tsv_wrong_field_count(tmp_path: pathlib.Path) -> None:
  _write_splits(tmp_path)
  (tmp_path / "train.tsv").write_text("a\tb\nno tab here\n")
  _one_line_error(
    lambda: list(sources.make_source(_config(tmp_path)).iter_pairs("train")),
    r"train.tsv:2: expected",
  )


def test_mismatched_line_counts(tmp_path: pathlib.Path) -> None:
  _write_splits(tmp_path)
  _write(tmp_path / "train.de", _DE + ["Noch einer.", "Und noch einer."])
  load = lambda: list(sources.make_source(_config(tmp_path)).iter_pairs("train"))
  msg = _one_line_error(load, "Line counts differ")
  assert "train.en has 4 lines" in msg and "train.de has 6" in msg


def test_invalid_utf8_names_file_and_line(tmp_path: pathlib.Path) -> None:
  _write_splits(tmp_path, ".gz")
  _write(tmp_path / "val.de.gz", b"Gut.\nAuch gut.\n" + b"Schlecht \xff\n")
  load = lambda: list(sources.make_source(_config(tmp_path)).iter_pairs("dev"))
  _one_line_error(load, r"val.de.gz:3: invalid UTF-8")


def test_empty_file(tmp_path: pathlib.Path) -> None:
  _write_splits(tmp_path)
  _write(tmp_path / "test.en", b"")
  source = sources.make_source(_config(tmp_path))
  _one_line_error(source.check, r"test.en: file is empty")
  _one_line_error(lambda: list(source.iter_pairs("test")), r"test.en: file is empty")


def test_empty_gz_file(tmp_path: pathlib.Path) -> None:
  _write_splits(tmp_path, ".gz")
  _write(tmp_path / "train.de.gz", b"")  # a valid gzip stream of zero bytes
  load = lambda: list(sources.make_source(_config(tmp_path)).iter_pairs("train"))
  _one_line_error(load, r"train.de.gz: file is empty")


def test_missing_file(tmp_path: pathlib.Path) -> None:
  _write_splits(tmp_path)
  (tmp_path / "val.de").unlink()
  source = sources.make_source(_config(tmp_path))
  msg = _one_line_error(source.check, r"data.dev_prefix='val': missing .*val\.de\[\.gz\]")
  assert "val.en" not in msg.split("missing")[1].split("(")[0]


def test_missing_dir(tmp_path: pathlib.Path) -> None:
  _one_line_error(sources.make_source(_config(tmp_path / "nope")).check, "no such folder")


def test_fingerprint_changes_with_content(tmp_path: pathlib.Path) -> None:
  _write_splits(tmp_path)
  source = sources.make_source(_config(tmp_path))
  before = source.fingerprint("train")
  _write(tmp_path / "train.en", _EN[:3] + ["A blue car."])
  assert source.fingerprint("train") != before


# --------------------------------------------------------------------------------------- TFDS


@pytest.fixture
def tfds() -> types.ModuleType:
  """tensorflow_datasets, imported by the tests that mock it (not at collection: a few tenths of
  a second in every xdist worker)."""
  import tensorflow_datasets  # pylint: disable=g-import-not-at-top

  return tensorflow_datasets


def _tfds_config(**overrides) -> ml_collections.ConfigDict:
  c = config_lib.base_config("tiny").data
  c.source = "tfds"
  c.update(overrides)
  return c


def test_tfds_mock_random_examples(tfds) -> None:
  source = sources.make_source(_tfds_config())
  source.check()
  with tfds.testing.mock_data(num_examples=7):
    pairs = list(source.iter_pairs("train"))
    assert len(pairs) == 7 and all(isinstance(s, str) and isinstance(t, str) for s, t in pairs)
    assert source.size_hint("dev") == 7


@pytest.mark.parametrize(
  "name,src,tgt", [("wmt14_translate/de-en", "en", "de"), ("wmt14_translate/fr-en", "en", "fr")]
)
def test_tfds_direction_follows_src_tgt_lang(tfds, name: str, src: str, tgt: str) -> None:
  other = "de" if tgt == "de" else "fr"
  examples = [{"en": f"english {i}".encode(), other: f"foreign {i}"} for i in range(3)]
  seen_splits = []

  def as_data_source(self, split, **kwargs):
    del self, kwargs
    seen_splits.append(split)
    return examples

  source = sources.make_source(_tfds_config(tfds_name=name, src_lang=src, tgt_lang=tgt))
  source.check()
  with tfds.testing.mock_data(as_data_source_fn=as_data_source):
    assert list(source.iter_pairs("test")) == [(f"english {i}", f"foreign {i}") for i in range(3)]
    list(source.iter_pairs("dev"))
  assert seen_splits == ["test", "validation"]  # newstest2014 for BLEU, newstest2013 for dev
  reverse = sources.make_source(_tfds_config(tfds_name=name, src_lang=tgt, tgt_lang=src))
  with tfds.testing.mock_data(as_data_source_fn=as_data_source):
    assert next(reverse.iter_pairs("train")) == ("foreign 0", "english 0")


def test_tfds_unknown_names() -> None:
  _one_line_error(
    sources.make_source(_tfds_config(tfds_name="wmt99_translate/de-en")).check,
    "data.tfds_name='wmt99_translate/de-en': unknown TFDS dataset 'wmt99_translate'",
  )
  _one_line_error(
    sources.make_source(_tfds_config(tfds_name="wmt14_translate/xx-en")).check,
    "unknown config 'xx-en'",
  )
  _one_line_error(
    sources.make_source(_tfds_config(tgt_lang="fr")).check,
    "data.tgt_lang='fr' is not a language of wmt14_translate/de-en",
  )


def test_tfds_not_prepared_is_one_line(tmp_path: pathlib.Path) -> None:
  source = sources.make_source(_tfds_config(tfds_data_dir=str(tmp_path)))
  source.check()
  _one_line_error(lambda: next(source.iter_pairs("dev")), r"not prepared in .*tfds build wmt14")
