"""make_data end to end: files and demo sources, cache, determinism, process shards, errors."""

from __future__ import annotations

import os
import pathlib

import ml_collections
import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.data import pipeline, prefetch, sources, streams, tokenized
from flaxformer_nmt.run.folder import Workdir

_ANIMALS = ["dog", "cat", "horse", "bird", "cow", "fox", "duck", "goat"]
_TIERE = ["Hund", "Katze", "Pferd", "Vogel", "Kuh", "Fuchs", "Ente", "Ziege"]


def _corpus(n: int, offset: int = 0) -> tuple[list[str], list[str]]:
  """n distinct, varied-length sentence pairs (the number makes each one unique)."""
  en, de = [], []
  for i in range(offset, offset + n):
    k = 1 + i % 5
    en.append(f"{i} " + " and ".join(f"the {_ANIMALS[(i + j) % 8]}" for j in range(k)) + ".")
    de.append(f"{i} " + " und ".join(f"der {_TIERE[(i + j) % 8]}" for j in range(k)) + ".")
  return en, de


def _write_corpus(d: pathlib.Path, train: int = 300) -> None:
  for prefix, n, offset in (("train", train, 0), ("val", 23, 10_000), ("test", 31, 20_000)):
    en, de = _corpus(n, offset)
    (d / f"{prefix}.en").write_text("\n".join(en) + "\n")
    (d / f"{prefix}.de").write_text("\n".join(de) + "\n")


def _config(data_dir: pathlib.Path, **data) -> ml_collections.ConfigDict:
  c = config_lib.base_config("tiny")
  c.data.update(
    dict(source="files", dir=str(data_dir), vocab_size=120, tokens_per_batch=512, max_len=32)
  )
  c.data.update(data)
  return c


def _texts(data: pipeline.Data, batch: dict[str, np.ndarray], side: str = "targets") -> list[str]:
  """Decoded segments of a batch."""
  out = []
  for r in range(batch[side].shape[0]):
    seg = batch[f"{side}_segmentation"][r]
    for k in range(1, seg.max() + 1):
      out.append(data.tokenizer.decode(batch[side][r][seg == k]))
  return out


def _make_data(config, workdir, *args, **kwargs):
  """make_data with the run folder at `workdir` (a path)."""
  return pipeline.make_data(config, Workdir(str(workdir)), *args, **kwargs)


@pytest.fixture
def corpus(tmp_path: pathlib.Path) -> pathlib.Path:
  d = tmp_path / "corpus"
  d.mkdir()
  _write_corpus(d)
  return d


def test_files_end_to_end(corpus: pathlib.Path, tmp_path: pathlib.Path) -> None:
  data = _make_data(
    _config(corpus), str(tmp_path / "run"), num_devices=8, process_index=0, process_count=1
  )
  assert data.global_rows == 16  # 512 // 32
  batch = next(data.train)
  assert all(v.shape == (16, 32) for v in batch.values())
  en, de = _corpus(300)
  assert set(_texts(data, batch)) <= set(de)
  assert set(_texts(data, batch, "inputs")) <= set(en)
  assert data.pairs("test") == list(sources.make_source(_config(corpus).data).iter_pairs("test"))
  dev = [t for b in data.eval_batches("dev") for t in _texts(data, b)]
  assert sorted(dev) == sorted(_corpus(23, 10_000)[1])
  assert os.path.isfile(tmp_path / "run" / "spm.model")


def test_restart_reuses_vocab_and_cache(corpus, tmp_path, monkeypatch) -> None:
  workdir = str(tmp_path / "run")
  first = _make_data(_config(corpus), workdir, 8, 0, 1)
  batches = [next(first.train) for _ in range(3)]
  caches = os.listdir(os.path.join(workdir, "data_cache"))
  assert len(caches) == 1 and caches[0].startswith("train-")
  encoded = []
  real = tokenized.tokenize_pairs
  monkeypatch.setattr(
    tokenized,
    "tokenize_pairs",
    lambda p, t, name="", **k: encoded.append(name) or real(p, t, name=name, **k),
  )
  second = _make_data(_config(corpus), workdir, 8, 0, 1)
  assert "train" not in encoded  # the cached ids were loaded
  assert second.tokenizer.fingerprint == first.tokenizer.fingerprint
  for want in batches:  # the same config and seed give the same batches
    got = next(second.train)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


def test_two_workdirs_identical_and_restorable(corpus, tmp_path) -> None:
  a = _make_data(_config(corpus), str(tmp_path / "a"), 8, 0, 1)
  b = _make_data(_config(corpus), str(tmp_path / "b"), 8, 0, 1)
  for _ in range(7):
    next(a.train)
  b.train.set_state(a.train.get_state())
  for _ in range(3):
    x, y = next(a.train), next(b.train)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_prefetched_batches_and_positions_equal_the_training_loops_own(corpus, tmp_path) -> None:
  """Packed ahead in a thread (the default) or in the loop (prefetch_batches=0): the same batches,
  and after each the same position (that of the batches handed out, not of those packed ahead),
  also across a set_state."""
  ahead = _make_data(_config(corpus), str(tmp_path / "a"), 8, 0, 1)
  inline = _make_data(_config(corpus, prefetch_batches=0), str(tmp_path / "b"), 8, 0, 1)
  assert isinstance(ahead.train, prefetch.Prefetcher)
  assert isinstance(inline.train, streams.DeviceStreams)
  saved: list = []
  for i in range(12):
    if i == 6:  # back to an earlier position, as a resume does
      ahead.train.set_state(saved)
      inline.train.set_state(saved)
    x, y = next(ahead.train), next(inline.train)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
    assert ahead.train.get_state() == inline.train.get_state()
    if i == 2:
      saved = inline.train.get_state()
  assert ahead.train.wait_seconds > 0.0
  ahead.train.close()
  with pytest.raises(RuntimeError, match="prefetcher is closed"):
    next(ahead.train)  # an error, not a wait forever on an empty queue


def test_a_packing_error_reaches_the_training_loop(corpus, tmp_path, monkeypatch) -> None:
  data = _make_data(_config(corpus, prefetch_batches=1), str(tmp_path / "a"), 8, 0, 1)
  next(data.train)

  def broken(self):
    raise OSError("disk gone")

  monkeypatch.setattr(streams.DeviceStreams, "__next__", broken)
  with pytest.raises(OSError, match="disk gone"):
    for _ in range(4):  # what was packed before the failure comes first
      next(data.train)
  with pytest.raises(RuntimeError, match="packing failed"):
    next(data.train)  # not a wait forever on a worker that has ended
  data.train.close()


def test_global_batches_do_not_depend_on_the_process_count(corpus, tmp_path) -> None:
  """8 devices in 1 process or in 2 of 4: the same global batches, each device its own stream."""
  workdir = str(tmp_path / "run")
  whole = _make_data(_config(corpus), workdir, 8, 0, 1)  # trains the shared vocabulary
  parts = [
    _make_data(_config(corpus), workdir, 8, process_index=p, process_count=2) for p in range(2)
  ]
  assert [p.train.num_streams for p in parts] == [4, 4]
  assert sum(p.train.examples_per_epoch for p in parts) == whole.train.examples_per_epoch == 300
  for _ in range(30):  # several epochs of every stream
    want = next(whole.train)
    got = [next(p.train) for p in parts]
    assert got[0]["targets"].shape == (8, 32)  # half of the 16 global rows
    for k in want:
      np.testing.assert_array_equal(np.concatenate([got[0][k], got[1][k]]), want[k])
    # Device d's 2 rows hold pairs i with i % 8 == d (each corpus sentence starts with its i).
    for device in range(8):
      rows = {k: v[2 * device : 2 * device + 2] for k, v in want.items()}
      assert {int(t.split()[0]) % 8 for t in _texts(whole, rows)} <= {device}
  positions = [p.train.get_state() for p in parts]
  assert positions[0] + positions[1] == whole.train.get_state()


def test_resume_positions_exact_or_approximate() -> None:
  saved = {"streams": [{"epoch": 2, "index": 10 + d, "size": 40} for d in range(8)]}
  positions, exact = streams.resume_positions(saved, 4, [40] * 4, 8)
  assert exact and positions == [{"epoch": 2, "index": 14 + j} for j in range(4)]
  # Another device count: every stream restarts at the earliest saved fraction of the epoch.
  positions, exact = streams.resume_positions(saved, 0, [80, 81], 2)
  assert not exact and positions == [{"epoch": 2, "index": 20}, {"epoch": 2, "index": 20}]


def test_demo_end_to_end(tmp_path) -> None:
  c = config_lib.base_config("tiny")
  c.data.update(
    dict(
      vocab_size=300,
      tokens_per_batch=1024,
      max_len=32,
      demo_train_size=2000,
      demo_dev_size=50,
      demo_test_size=60,
    )
  )
  data = _make_data(c, str(tmp_path), 8, 0, 1)
  assert len(data.pairs("test")) == 60
  test = [t for b in data.eval_batches("test") for t in _texts(data, b)]
  assert sorted(test) == sorted(t for _, t in data.pairs("test"))
  assert data.train.examples_per_epoch == 2000  # no demo sentence exceeds 31 tokens


def test_data_errors_come_before_vocabulary_training(corpus, tmp_path) -> None:
  (corpus / "test.de").write_text("nur eine Zeile\n")
  workdir = tmp_path / "run"
  with pytest.raises(errors.DataError, match=r"test.en has 31 lines but .*test.de has 1"):
    _make_data(_config(corpus), str(workdir), 8, 0, 1)
  assert not (workdir / "spm.model").exists()


def test_over_long_and_empty_train_pairs_are_dropped(corpus, tmp_path, caplog) -> None:
  en, de = _corpus(300)
  en[5] = " ".join(["the cat"] * 40)  # far beyond max_len=32
  de[7] = ""
  (corpus / "train.en").write_text("\n".join(en) + "\n")
  (corpus / "train.de").write_text("\n".join(de) + "\n")
  caplog.set_level("INFO", logger="absl")  # absl's own level, as in test_data_packing.py
  data = _make_data(_config(corpus), str(tmp_path / "run"), 8, 0, 1)
  assert data.train.examples_per_epoch == 298
  assert "dropped 1 with a side longer than data.max_len=32" in caplog.text
  assert "and 1 with an empty side" in caplog.text


def test_need_train_false_skips_train_split(corpus, tmp_path) -> None:
  workdir = tmp_path / "run"
  _make_data(_config(corpus), str(workdir), 8, 0, 1)
  (corpus / "train.en").unlink()  # evaluation must not need the train text once a vocabulary exists
  data = _make_data(_config(corpus), str(workdir), 8, 0, 1, need_train=False)
  assert data.train is None
  test = [t for b in data.eval_batches("test") for t in _texts(data, b)]
  assert sorted(test) == sorted(_corpus(31, 20_000)[1])


def test_tfds_end_to_end_offline(tmp_path) -> None:
  tfds = pytest.importorskip("tensorflow_datasets")
  corpora = {"train": _corpus(200), "validation": _corpus(20, 10_000), "test": _corpus(25, 20_000)}

  def as_data_source(self, split, **kwargs):
    del self, kwargs
    en, de = corpora[split]
    return [{"de": d.encode(), "en": e.encode()} for e, d in zip(en, de, strict=True)]

  c = _config(tmp_path, source="tfds", dir="")
  with tfds.testing.mock_data(as_data_source_fn=as_data_source):
    data = _make_data(c, str(tmp_path / "run"), 8, 0, 1)
  assert data.pairs("dev") == list(zip(*corpora["validation"], strict=True))  # EN -> DE, in order
  assert data.train.examples_per_epoch == 200
  assert set(_texts(data, next(data.train))) <= set(corpora["train"][1])
