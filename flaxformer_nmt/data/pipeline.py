"""The input side from a config: checks, vocabulary, tokenization (cached), then batches.

`make_data` reads the dev and test sets and checks the sources first, so data errors surface before
vocabulary training, and hands the train split to this process's training streams (streams.py:
one per device, with a restorable position). `Data` is what the trainer, evaluation and
translation get.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Protocol

import ml_collections
from absl import logging

from flaxformer_nmt.data import packing, prefetch, sources, streams, tokenized
from flaxformer_nmt.data import tokenizer as tokenizer_lib

Batch = packing.Batch

# The vocabulary sample is seeded by this, not by config.seed, so runs that differ only in their
# training seed share the same vocabulary.
_VOCAB_SEED = 0


class RunFolder(Protocol):
  """Where a run keeps its vocabulary and tokenized corpora (`workdir.Workdir` is one)."""

  @property
  def data_cache(self) -> str: ...

  def vocabulary(self, config: ml_collections.ConfigDict | None = None) -> str: ...


def _process_defaults(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top  # keep the data side importable without jax

    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} is not in [0, process_count={process_count}).")
  return process_index, process_count


@dataclasses.dataclass
class Data:
  """Everything the trainer needs from the input side."""

  tokenizer: tokenizer_lib.Tokenizer
  # None when made with need_train=False (eval, translate); packed ahead unless prefetch is 0.
  train: streams.DeviceStreams | prefetch.Prefetcher | None
  global_rows: int  # rows of a global batch; each process yields global_rows / process_count
  eval_rows: int  # rows of a global evaluation batch (one micro-batch's worth)
  num_devices: int  # devices of the whole run: one training stream each
  max_len: int
  process_index: int
  process_count: int
  _eval: dict[str, tokenized.TokenizedSplit]
  _pairs: dict[str, list[tuple[str, str]]]
  _names: dict[str, str]

  def eval_batches(self, split: str) -> Iterator[Batch]:
    """'dev' or 'test' batches in order, nothing dropped (dev loss uses these)."""
    if split not in self._eval:
      raise ValueError(f"Unknown evaluation split {split!r}; choose 'dev' or 'test'.")
    return streams.eval_batches(
      self._eval[split], self.eval_rows, self.max_len, self.process_index, self.process_count
    )

  def pairs(self, split: str) -> list[tuple[str, str]]:
    """Raw (source, reference) text of 'dev' or 'test' in file order (for BLEU)."""
    if split not in self._pairs:
      raise ValueError(f"Unknown evaluation split {split!r}; choose 'dev' or 'test'.")
    return self._pairs[split]

  def split_name(self, split: str) -> str:
    """What 'dev' or 'test' is called in its source, e.g. `newstest2014` (for reports)."""
    return self._names[split]


def make_data(
  config: ml_collections.ConfigDict,
  workdir: RunFolder,
  num_devices: int | None = None,
  process_index: int | None = None,
  process_count: int | None = None,
  need_train: bool = True,
  accumulate_steps: int | None = None,
  eval_splits: Sequence[str] = ("dev", "test"),
  tokenizer: tokenizer_lib.Tokenizer | None = None,
) -> Data:
  """Checks the data, loads or trains the vocabulary, tokenizes (or loads the cache), batches.

  `workdir` says where the vocabulary and the tokenized corpora live; `tokenizer`, when the caller
  has loaded the run's vocabulary already, is used as it is.

  `num_devices` is the global device count (default: JAX's, as are the process index and count):
  one training stream each, and global rows are a multiple of it times `accumulate_steps` (default
  config.optim.accumulate_steps; each device splits its rows into that many micro-batches).
  Cheap checks and the (small) dev and test sets are read first, so data errors surface before
  vocabulary training. `need_train=False` (evaluation, translation) skips the train split's
  tokenization and iterator; the vocabulary is still trained if the workdir has none.
  `eval_splits` are the evaluation splits read (`--mode=eval` reads only "test", so a test set
  such as the filtered newstest2014 can be scored without dev files beside it).
  """
  dc = config.data
  if num_devices is None:
    import jax  # pylint: disable=g-import-not-at-top  # keep the data side importable without jax

    num_devices = jax.device_count()
  if accumulate_steps is None:
    accumulate_steps = int(config.optim.accumulate_steps) if "optim" in config else 1
  process_index, process_count = _process_defaults(process_index, process_count)
  if num_devices % process_count:
    raise ValueError(f"{num_devices} devices do not split over process_count={process_count}.")
  num_local = num_devices // process_count
  global_rows = packing.num_rows(dc.tokens_per_batch, dc.max_len, num_devices * accumulate_steps)
  if global_rows * dc.max_len > dc.tokens_per_batch:
    logging.warning(
      "data.tokens_per_batch=%d is below one row of data.max_len=%d per device and micro-batch; "
      "using %d rows.",
      dc.tokens_per_batch,
      dc.max_len,
      global_rows,
    )
  logging.info(
    "Batches: %d rows x %d tokens per step (%d per device%s), budget %d tokens per side.",
    global_rows,
    dc.max_len,
    global_rows // num_devices,
    f", in {accumulate_steps} micro-batches" if accumulate_steps > 1 else "",
    dc.tokens_per_batch,
  )
  source = sources.make_source(dc)
  source.check(sources.SPLITS if need_train else tuple(eval_splits))
  pairs = {split: list(source.iter_pairs(split)) for split in eval_splits}
  for split, split_pairs in pairs.items():
    logging.info("%s: %d pairs.", split, len(split_pairs))
  if tokenizer is None:
    tokenizer = tokenizer_lib.load_or_train_tokenizer(
      dc,
      workdir.vocabulary(config),
      lambda: source.iter_pairs("train"),
      seed=_VOCAB_SEED,
      process_index=process_index,
    )
  train = None
  if need_train:
    # This process's devices' streams: pairs i with (i // num_local) % process_count == index.
    train_split = tokenized.load_or_tokenize(
      source,
      "train",
      tokenizer,
      workdir.data_cache,
      shard=tokenized.Shard(process_index, process_count, block=num_local),
    )
    train = streams.DeviceStreams(
      train_split,
      num_local=num_local,
      first_stream=process_index * num_local,
      rows_per_device=global_rows // num_devices,
      max_len=dc.max_len,
      seed=config.seed,
    )
    if dc.prefetch_batches:
      train = prefetch.Prefetcher(train, dc.prefetch_batches)
  return Data(
    tokenizer=tokenizer,
    train=train,
    global_rows=global_rows,
    eval_rows=global_rows // accumulate_steps,
    num_devices=num_devices,
    max_len=dc.max_len,
    process_index=process_index,
    process_count=process_count,
    _eval={s: tokenized.tokenize_pairs(p, tokenizer, name=s) for s, p in pairs.items()},
    _pairs=pairs,
    _names={split: source.split_name(split) for split in pairs},
  )
