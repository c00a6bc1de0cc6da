"""The input side: sources -> tokenized arrays -> packed batches with a restorable position.

Most callers need only `make_data` (see pipeline.py); the training streams and their positions
are in streams.py.
"""

from flaxformer_nmt.data.pipeline import Data, make_data
from flaxformer_nmt.data.sources import DataError, make_source
from flaxformer_nmt.data.streams import (
  DeviceStreams,
  TrainIterator,
  eval_batches,
  resume_positions,
)

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
