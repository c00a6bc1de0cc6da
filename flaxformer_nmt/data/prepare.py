"""`--mode=prepare`: build the data once, before any training, and say what was built.

For `data.source=files` with a `data.url` (configs/multi30k.py) this downloads the corpus's files
into `data.dir` and verifies each against its recorded checksum (data/download.py).

For `data.source=tfds` this runs the TFDS build of the dataset (`wmt14_translate/de-en` or
`fr-en`: about 4.5M / 40M sentence pairs downloaded from statmt.org and elsewhere) and writes it as
array_record, which training then reads without TensorFlow. The build itself does need TensorFlow:
TFDS 4.9's archive extraction and its WMT readers call `tf.io.gfile`. So TensorFlow is the
optional extra `[prepare]`, checked first, and nothing else here needs it.

Then, for every source, the dev and test sets are read (their sizes and names reported: TFDS's
WMT14 test split is newstest2014, all 3,003 lines for EN-DE) and the shared SentencePiece
vocabulary is trained into the workdir if it has none, so the training job starts on data that
is known to be readable.
"""

from __future__ import annotations

from typing import Any

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.data import download, pipeline, sources

INSTALL_HINT = 'pip install -e ".[prepare]"'


def require_tensorflow(dataset: str) -> None:
  """A one-line ConfigError naming the extra when TensorFlow is missing (before any download)."""
  try:
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  except ImportError:
    raise errors.ConfigError(
      f"--mode=prepare builds the TFDS dataset {dataset}, and TFDS's build needs TensorFlow, "
      f"which is not installed: {INSTALL_HINT} (reading the prepared data does not need it)."
    ) from None


def build_tfds(data_config: ml_collections.ConfigDict) -> str:
  """Downloads and prepares `data.tfds_name` as array_record in `data.tfds_data_dir` (or TFDS's
  default directory); returns the dataset's directory. A prepared dataset is left as it is."""
  source = sources.TfdsSource(data_config)
  source.check()  # the name, the config and the languages: before TensorFlow and downloads
  require_tensorflow(data_config.tfds_name)
  tfds = sources.import_tfds()
  builder = tfds.builder(data_config.tfds_name, data_dir=data_config.tfds_data_dir or None)
  if builder.is_prepared():
    logging.info("%s is already prepared in %s.", data_config.tfds_name, builder.data_dir)
  else:
    logging.info(
      "Building %s as array_record in %s (downloads several GB; hours for fr-en).",
      data_config.tfds_name,
      builder.data_dir,
    )
    try:
      builder.download_and_prepare(file_format="array_record")
    except OSError as e:  # requests' ConnectionError and HTTPError are OSErrors, as a full disk is
      reason = " ".join(str(e).split())[:300] or type(e).__name__
      raise errors.DataError(
        f"Building {data_config.tfds_name} in {builder.data_dir} failed: {reason}. Rerun "
        "--mode=prepare once it is fixed (finished downloads are kept)."
      ) from None
  return str(builder.data_dir)


def prepare(
  config: ml_collections.ConfigDict, workdir: pipeline.RunFolder, process_count: int
) -> dict[str, Any]:
  """Builds the dataset (TFDS), checks dev and test, trains the vocabulary; returns the figures.

  Run it once, on one host: the build writes one shared dataset directory.
  """
  if process_count > 1:
    raise errors.ConfigError(
      f"--mode=prepare runs in {process_count} processes; run it once, on one host (it writes "
      "one dataset directory that every host then reads)."
    )
  dc = config.data
  result: dict[str, Any] = {"mode": "prepare", "source": dc.source}
  if dc.source == "tfds":
    result["dataset"] = dc.tfds_name
    result["tfds_dir"] = build_tfds(dc)
  if dc.source == "files" and dc.url:
    result.update(download.download(dc))
    result["dir"] = dc.dir
  # Reads dev and test, trains (or loads) <workdir>/spm.model from the train split.
  data = pipeline.make_data(config, workdir, num_devices=1, need_train=False)
  if data.directions:  # a multilingual config: each direction's sets
    for split, names in (("dev", data.directions), ("test", data.directions + data.zero_shot)):
      result[f"{split}_set"] = data.split_name(split, names[0])
      result[f"{split}_sentences"] = {d: len(data.pairs(split, d)) for d in names}
  else:
    for split in ("dev", "test"):
      result[f"{split}_set"] = data.split_name(split)
      result[f"{split}_sentences"] = len(data.pairs(split))
  result["vocab_path"] = workdir.vocabulary(config)
  result["vocab_size"] = data.tokenizer.vocab_size
  return result
