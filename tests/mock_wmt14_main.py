"""`main.py` with TFDS's WMT14 replaced by a small offline mock (`tfds.testing.mock_data`).

The WMT14 configs, the TFDS source and `--mode=prepare` run end to end as a user runs them; only
the data differ: `wmt14_translate/<xx>-en` serves the demo corpus (English number expressions and
their German), keyed by the builder's own language pair, with TFDS's real split names (train,
validation = newstest2013, test = newstest2014). TFDS's mock makes `download_and_prepare` a no-op,
so prepare's TensorFlow check is lifted here; `tests/e2e/test_wmt14.py` checks that check itself.
"""

import os
import runpy
import sys

import tensorflow_datasets as tfds

from flaxformer_nmt.data import demo, prepare

# Sentence pairs per split; MOCK_WMT14_SIZES="train,validation,test" changes them.
_SIZES = os.environ.get("MOCK_WMT14_SIZES", "3000,32,48").split(",")
SIZES = dict(zip(("train", "validation", "test"), map(int, _SIZES), strict=True))
_DEMO_SPLIT = {"train": "train", "validation": "dev", "test": "test"}


def as_data_source(builder, split, **kwargs):
  del kwargs
  split = str(split)
  other, english = builder.builder_config.language_pair  # ("de", "en") or ("fr", "en")
  pairs = demo.make_demo_split(_DEMO_SPLIT[split], SIZES[split], 0)
  return [{other: tgt.encode(), english: src.encode()} for src, tgt in pairs]


prepare.require_tensorflow = lambda dataset: None
main = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "main.py")
sys.argv[0] = main
with tfds.testing.mock_data(as_data_source_fn=as_data_source):
  runpy.run_path(main, run_name="__main__")
