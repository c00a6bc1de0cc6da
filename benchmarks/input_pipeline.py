"""Throughput of the training input pipeline (packing + batch assembly) on local files.

    python benchmarks/input_pipeline.py --data_dir=../shared/data/multi30k

Trains (or reuses, with --workdir) the vocabulary and tokenizes the train split once (timed
separately: a restart loads both from the workdir), then times --num_batches training batches with
the paper's default budget (25,000 tokens per side) and max_len, packed in this thread: one core's
throughput (training packs in one background thread per process, data/prefetch.py).

With --processes=1,2,... it also runs that many packing processes side by side, each packing its
share of the devices' streams as the processes of a multi-host job do (process_index i of P), and
reports their summed target tokens/s: the scaling with workers, on as many cores as this host has.

It then says how many such cores keep 1, 8 and 32 chips fed when a chip consumes
--chip_tokens_per_s target tokens per second; the default is the base bf16 step's estimate on one
v5p chip (benchmarks/train_step.py --target=tpu:v5p, docs/performance.md). The last line is one
JSON object.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time

import ml_collections
import numpy as np
from absl import app, flags, logging

from flaxformer_nmt.benchmarking import record
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.data import pipeline
from flaxformer_nmt.run.folder import Workdir

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
_CHIP_TOKENS_PER_S = flags.DEFINE_float(
  "chip_tokens_per_s",
  443_841,
  "Target tokens per second one chip trains on (default: base bf16, v5p, the compiler's estimate "
  "from benchmarks/train_step.py --target=tpu:v5p).",
)

_PROCESSES = flags.DEFINE_list(
  "processes", [], "Also time this many packing processes side by side, e.g. 1,2 ('' = not)."
)


def _config() -> ml_collections.ConfigDict:
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
      prefetch_batches=0,  # packing timed in this thread
    )
  )
  return config


def _time_batches(train, num_batches: int) -> tuple[int, int, int, float]:
  """Packs `num_batches` batches; returns (source tokens, target tokens, cells, seconds)."""
  next(train)  # the first epoch's permutation is drawn on the first batch
  src_tokens = tgt_tokens = cells = 0
  start = time.perf_counter()
  for _ in range(num_batches):
    batch = next(train)
    src_tokens += int(np.count_nonzero(batch["inputs"]))
    tgt_tokens += int(np.count_nonzero(batch["targets"]))
    cells += batch["targets"].size
  return src_tokens, tgt_tokens, cells, time.perf_counter() - start


def _worker(args: tuple) -> tuple[int, float]:
  """One packing process of `count` (spawned): its target tokens and seconds."""
  flag_values, workdir, index, count = args
  flags.FLAGS(flag_values, known_only=True)
  logging.set_verbosity(logging.WARNING)
  data = pipeline.make_data(
    _config(), Workdir(workdir), _NUM_DEVICES.value, process_index=index, process_count=count
  )
  _, tgt_tokens, _, elapsed = _time_batches(data.train, _NUM_BATCHES.value)
  return tgt_tokens, elapsed


def _scaling(workdir: str, counts: list[int]) -> dict[str, dict]:
  """Summed target tokens/s of 1, 2, ... packing processes running at once (one per core)."""
  out = {}
  context = multiprocessing.get_context("spawn")
  argv = [a for a in sys.argv if not a.startswith("--processes")]
  for count in counts:
    with context.Pool(count) as pool:
      results = pool.map(_worker, [(argv, workdir, i, count) for i in range(count)])
    tokens = sum(t for t, _ in results)
    slowest = max(s for _, s in results)
    out[f"{count}_processes"] = {
      "target_tokens_per_s": round(tokens / slowest),
      "per_process": round(tokens / slowest / count),
    }
  return out


def main(argv: list[str]) -> None:
  del argv
  counts = [int(c) for c in _PROCESSES.value]
  if any(c < 1 for c in counts) or _NUM_DEVICES.value % max(counts, default=1):
    raise app.UsageError(
      f"--processes={','.join(_PROCESSES.value)}: each must be >= 1 and divide --num_devices."
    )
  config = _config()
  with tempfile.TemporaryDirectory() as tmp:
    workdir = _WORKDIR.value or tmp
    start = time.perf_counter()
    data = pipeline.make_data(
      config, Workdir(workdir), _NUM_DEVICES.value, process_index=0, process_count=1
    )
    setup_s = time.perf_counter() - start

    src_tokens, tgt_tokens, cells, elapsed = _time_batches(data.train, _NUM_BATCHES.value)
    scaling = _scaling(workdir, counts) if counts else None

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
    "chip_tokens_per_s": _CHIP_TOKENS_PER_S.value,
  }
  per_core = tgt_tokens / elapsed
  # Packing scales with the streams a process packs (one per local device); cores needed to keep
  # n chips fed at the chip's rate:
  result["cores_needed"] = {
    f"{n}_chips": round(n * _CHIP_TOKENS_PER_S.value / per_core, 2) for n in (1, 8, 32)
  }
  if scaling:
    result["scaling"] = scaling
    result["host_cores"] = os.cpu_count()
  logging.info("Setup (vocabulary + tokenization): %.1fs.", setup_s)
  print(
    f"Pipeline: {result['target_tokens_per_s']:,} target and {result['source_tokens_per_s']:,} "
    f"source tokens/s; non-padding share {result['target_non_padding']:.1%} (targets), "
    f"{result['source_non_padding']:.1%} (sources). Cores to feed 1 / 8 / 32 chips at "
    f"{_CHIP_TOKENS_PER_S.value:,.0f} tokens/s each: "
    + " / ".join(str(v) for v in result["cores_needed"].values())
  )
  if scaling:
    print(
      "Packing processes side by side: "
      + ", ".join(f"{k.split('_')[0]}: {v['target_tokens_per_s']:,}" for k, v in scaling.items())
      + " target tokens/s"
    )
  record.report(result)


if __name__ == "__main__":
  app.run(main)
