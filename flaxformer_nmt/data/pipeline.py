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

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions as directions_lib
from flaxformer_nmt.data import multilingual, packing, prefetch, sources, streams, tokenized
from flaxformer_nmt.data import tokenizer as tokenizer_lib

Batch = packing.Batch

# The vocabulary sample is seeded by this, not by config.seed, so runs that differ only in their
# training seed share the same vocabulary.
_VOCAB_SEED = 0


class RunFolder(Protocol):
  """Where a run keeps its vocabulary and tokenized corpora (`run.folder.Workdir` is one)."""

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
  # Keyed by split ('dev', 'test'), or by split/direction ('test/en-de') for a multilingual run.
  _eval: dict[str, tokenized.TokenizedSplit]
  _pairs: dict[str, list[tuple[str, str]]]
  _names: dict[str, str]
  directions: tuple[str, ...] = ()  # a multilingual run's trained directions, e.g. ("en-de",)
  zero_shot: tuple[str, ...] = ()  # directions scored on the test set only

  def _key(self, split: str, direction: str | None) -> str:
    key = split if direction is None else f"{split}/{direction}"
    if key not in self._pairs:
      known = sorted(self._pairs)
      raise ValueError(f"Unknown evaluation set {key!r}; choose one of {known}.")
    return key

  def eval_batches(self, split: str, direction: str | None = None) -> Iterator[Batch]:
    """'dev' or 'test' batches (of `direction`, in a multilingual run) in order, nothing
    dropped (dev loss uses these); sources start with their tags, as in training."""
    return streams.eval_batches(
      self._eval[self._key(split, direction)],
      self.eval_rows,
      self.max_len,
      self.process_index,
      self.process_count,
    )

  def pairs(self, split: str, direction: str | None = None) -> list[tuple[str, str]]:
    """Raw (source, reference) text of 'dev' or 'test' (of `direction`) in file order."""
    return self._pairs[self._key(split, direction)]

  def split_name(self, split: str, direction: str | None = None) -> str:
    """What 'dev' or 'test' is called in its source, e.g. `newstest2014` (for reports)."""
    return self._names[self._key(split, direction)]


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
  if dc.source == "none":  # an imported model's (importing/imported_run.py)
    raise errors.ConfigError(
      "config.data.source='none': an imported model has no data of its own; name yours: "
      "--config.data.source=files --config.data.dir=DIR --config.data.test_prefix=NAME "
      "(DIR/NAME.<src> and .<tgt>; docs/pretrained.md)."
    )
  if num_devices is None:
    import jax  # pylint: disable=g-import-not-at-top  # keep the data side importable without jax

    num_devices = jax.device_count()
  if accumulate_steps is None:
    accumulate_steps = int(config.optim.accumulate_steps) if "optim" in config else 1
  process_index, process_count = _process_defaults(process_index, process_count)
  if num_devices % process_count:
    raise ValueError(f"{num_devices} devices do not split over process_count={process_count}.")
  make = _make_multilingual if directions_lib.is_multilingual(dc) else _make_bilingual
  return make(
    config,
    workdir,
    tokenizer,
    need_train=need_train,
    eval_splits=eval_splits,
    global_rows=_global_rows(dc, num_devices, accumulate_steps),
    accumulate_steps=accumulate_steps,
    num_devices=num_devices,
    process_index=process_index,
    process_count=process_count,
  )


def _global_rows(dc: ml_collections.ConfigDict, num_devices: int, accumulate_steps: int) -> int:
  """The rows of one step's batch over every device (data.tokens_per_batch's), said in a line."""
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
  return global_rows


def _make_bilingual(
  config: ml_collections.ConfigDict,
  workdir: RunFolder,
  tokenizer: tokenizer_lib.Tokenizer | None,
  *,
  need_train: bool,
  eval_splits: Sequence[str],
  global_rows: int,
  accumulate_steps: int,
  num_devices: int,
  process_index: int,
  process_count: int,
) -> Data:
  """make_data for one language pair: its source's splits, the vocabulary, this process's
  training streams."""
  dc = config.data
  num_local = num_devices // process_count
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
  # A many-to-many model's language tokens (none for any other model).
  src_prefix, tgt_prefix = tokenizer_lib.pair_prefixes(tokenizer, dc)
  if need_train:
    # This process's devices' streams: pairs i with (i // num_local) % process_count == index.
    train_split = tokenized.load_or_tokenize(
      source,
      "train",
      tokenizer,
      workdir.data_cache,
      shard=tokenized.Shard(process_index, process_count, block=num_local),
      src_prefix=src_prefix,
      tgt_prefix=tgt_prefix,
    )
    train = _train_streams(
      config, train_split, None, global_rows, num_devices, num_local, process_index
    )
  return Data(
    tokenizer=tokenizer,
    train=train,
    global_rows=global_rows,
    eval_rows=global_rows // accumulate_steps,
    num_devices=num_devices,
    max_len=dc.max_len,
    process_index=process_index,
    process_count=process_count,
    _eval={
      s: tokenized.tokenize_pairs(
        p, tokenizer, name=s, src_prefix=src_prefix, tgt_prefix=tgt_prefix
      )
      for s, p in pairs.items()
    },
    _pairs=pairs,
    _names={split: source.split_name(split) for split in pairs},
  )


def _train_streams(
  config: ml_collections.ConfigDict,
  split: tokenized.TokenizedSplit,
  groups: streams.Groups | None,
  global_rows: int,
  num_devices: int,
  num_local: int,
  process_index: int,
) -> streams.DeviceStreams | prefetch.Prefetcher:
  """This process's training streams (one per local device) over its shard `split` of the train
  split, packed ahead unless data.prefetch_batches is 0."""
  train: streams.DeviceStreams | prefetch.Prefetcher = streams.DeviceStreams(
    split,
    num_local=num_local,
    first_stream=process_index * num_local,
    rows_per_device=global_rows // num_devices,
    max_len=config.data.max_len,
    seed=config.seed,
    groups=groups,
  )
  if config.data.prefetch_batches:
    train = prefetch.Prefetcher(train, config.data.prefetch_batches)
  return train


def _make_multilingual(
  config: ml_collections.ConfigDict,
  workdir: RunFolder,
  tokenizer: tokenizer_lib.Tokenizer | None,
  *,
  need_train: bool,
  eval_splits: Sequence[str],
  global_rows: int,
  accumulate_steps: int,
  num_devices: int,
  process_index: int,
  process_count: int,
) -> Data:
  """make_data for `data.directions`: each direction's corpora and evaluation sets
  (data/multilingual.py), a vocabulary holding the tags, one training split with groups."""
  dc = config.data
  multilingual.check(dc, need_train, eval_splits)
  names: dict[str, str] = {}
  pairs: dict[str, list[tuple[str, str]]] = {}
  targets: dict[str, str] = {}
  for split in eval_splits:
    for direction, source in multilingual.eval_sources(dc, split).items():
      key = f"{split}/{direction}"
      pairs[key] = list(source.iter_pairs(split))
      names[key] = source.split_name(split)
      targets[key] = direction.split("-", 1)[1]
      logging.info("%s %s: %d pairs.", split, direction, len(pairs[key]))
  symbols = directions_lib.user_symbols(dc)
  if tokenizer is None:
    tokenizer = tokenizer_lib.load_or_train_tokenizer(
      dc,
      workdir.vocabulary(config),
      lambda: iter(()),
      process_index=process_index,
      sentences_fn=lambda: multilingual.vocabulary_sample(dc, _VOCAB_SEED),
      user_symbols=symbols,
    )
  else:
    tokenizer_lib.check_symbols(tokenizer, symbols)
  num_local = num_devices // process_count
  train = None
  if need_train:
    split, groups = multilingual.train_split(
      dc,
      tokenizer,
      workdir.data_cache,
      tokenized.Shard(process_index, process_count, block=num_local),
    )
    train = _train_streams(
      config, split, groups, global_rows, num_devices, num_local, process_index
    )
  evals = {
    key: tokenized.tokenize_pairs(
      p,
      tokenizer,
      name=key,
      src_prefix=tokenizer_lib.source_prefix(tokenizer, targets[key], data_config=dc),
    )
    for key, p in pairs.items()
  }
  return Data(
    tokenizer=tokenizer,
    train=train,
    global_rows=global_rows,
    eval_rows=global_rows // accumulate_steps,
    num_devices=num_devices,
    max_len=dc.max_len,
    process_index=process_index,
    process_count=process_count,
    _eval=evals,
    _pairs=pairs,
    _names=names,
    directions=tuple(d.name for d in directions_lib.trained(dc)),
    zero_shot=tuple(d.name for d in directions_lib.zero_shot(dc)),
  )
