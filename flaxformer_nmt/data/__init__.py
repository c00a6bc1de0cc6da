"""The input side: sources -> tokenized arrays -> packed batches with a restorable position.

Most callers need only `make_data` (see pipeline.py).
"""

from flaxformer_nmt.data.pipeline import (
  Data,
  DeviceStreams,
  TrainIterator,
  eval_batches,
  make_data,
  resume_positions,
)
from flaxformer_nmt.data.sources import DataError, make_source

__all__ = [
  "Data",
  "DataError",
  "DeviceStreams",
  "TrainIterator",
  "eval_batches",
  "make_data",
  "make_source",
  "resume_positions",
]
