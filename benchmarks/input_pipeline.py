"""Throughput of the training input pipeline (packing + batch assembly) on local files.

    python benchmarks/input_pipeline.py --data_dir=../shared/data/multi30k

Trains (or reuses, with --workdir) the vocabulary and tokenizes the train split once (timed
separately: a restart loads both from the workdir), then times --num_batches training batches with
the paper's default budget (25,000 tokens per side) and max_len. The last line is one JSON object.
"""

from __future__ import annotations

import json
import tempfile
import time

import numpy as np
from absl import app, flags, logging

from flaxformer_nmt import config_lib
from flaxformer_nmt.data import pipeline

_DATA_DIR = flags.DEFINE_string(
  "data_dir", None, "Folder of <prefix>.<lang>[.gz] files.", required=True
)
_WORKDIR = flags.DEFINE_string("workdir", "", "Where the vocabulary and cache go; '' = a temp dir.")
_NUM_BATCHES = flags.DEFINE_integer("num_batches", 200, "Training batches to time.")
_TOKENS_PER_BATCH = flags.DEFINE_integer("tokens_per_batch", 25_000, "Global budget per side.")
_MAX_LEN = flags.DEFINE_integer("max_len", 256, "Row length (data.max_len).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8_000, "SentencePiece pieces.")
_NUM_DEVICES = flags.DEFINE_integer("num_devices", 8, "Global devices (rows divide by it).")
_TRAIN_PREFIX = flags.DEFINE_string("train_prefix", "train", "")
_DEV_PREFIX = flags.DEFINE_string("dev_prefix", "val", "")
_TEST_PREFIX = flags.DEFINE_string("test_prefix", "test_2016_flickr", "")


def main(argv: list[str]) -> None:
  del argv
  config = config_lib.base_config("tiny")
  config.data.update(
    dict(
      source="files",
      dir=_DATA_DIR.value,
      train_prefix=_TRAIN_PREFIX.value,
      dev_prefix=_DEV_PREFIX.value,
      test_prefix=_TEST_PREFIX.value,
      vocab_size=_VOCAB_SIZE.value,
      tokens_per_batch=_TOKENS_PER_BATCH.value,
      max_len=_MAX_LEN.value,
    )
  )
  with tempfile.TemporaryDirectory() as tmp:
    workdir = _WORKDIR.value or tmp
    start = time.perf_counter()
    data = pipeline.make_data(config, workdir, _NUM_DEVICES.value, process_index=0, process_count=1)
    setup_s = time.perf_counter() - start

    next(data.train)  # the first epoch's permutation is drawn on the first batch
    src_tokens = tgt_tokens = cells = 0
    start = time.perf_counter()
    for _ in range(_NUM_BATCHES.value):
      batch = next(data.train)
      src_tokens += int(np.count_nonzero(batch["inputs"]))
      tgt_tokens += int(np.count_nonzero(batch["targets"]))
      cells += batch["targets"].size
    elapsed = time.perf_counter() - start

  first = data.train.get_state()[0]  # the first device's stream: epochs done, with the fraction
  result = {
    "data_dir": _DATA_DIR.value,
    "rows": data.global_rows,
    "max_len": data.max_len,
    "tokens_per_batch": _TOKENS_PER_BATCH.value,
    "vocab_size": data.tokenizer.vocab_size,
    "setup_s": round(setup_s, 2),  # vocabulary + one-off tokenization (0 work on a restart)
    "num_batches": _NUM_BATCHES.value,
    "batches_per_s": round(_NUM_BATCHES.value / elapsed, 1),
    "target_tokens_per_s": round(tgt_tokens / elapsed),
    "source_tokens_per_s": round(src_tokens / elapsed),
    "target_non_padding": round(tgt_tokens / cells, 4),
    "source_non_padding": round(src_tokens / cells, 4),
    "epochs": round(first["epoch"] + first["index"] / first["size"], 2),
  }
  logging.info("Setup (vocabulary + tokenization): %.1fs.", setup_s)
  print(
    f"Pipeline: {result['target_tokens_per_s']:,} target and {result['source_tokens_per_s']:,} "
    f"source tokens/s; non-padding share {result['target_non_padding']:.1%} (targets), "
    f"{result['source_non_padding']:.1%} (sources)."
  )
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
