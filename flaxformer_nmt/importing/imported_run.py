"""`--mode=import --input=DIR_OR_HUB_ID --workdir=W`: a transformers Marian or M2M100 model
(OPUS-MT; facebook/m2m100_418M, 1.2B) made into a run.

The run describes itself as a trained one does, so every later command needs no --config:
  config.json        the model's architecture as config.model fields (export/marian.py says how
                     each Marian option maps), its languages, the decoding settings of its
                     generation_config.json (beam size)
  vocabulary/        source.spm, target.spm, vocab.json (data/pair_vocabulary.py); an M2M100's
                     sentencepiece.bpe.model, vocab.json, tokenizer_config.json
                     (data/fairseq_vocabulary.py)
  averaged/imported/ one parameter checkpoint (--checkpoint=auto and averaged read it;
                     `config.init_from=W` fine-tunes from it)
  import.json        where it came from: the folder or Hub id, each file's SHA-256, and the
                     transformers config as given
  run.json           the run record (its training data: "imported")

It comes in by the door every run-making command uses (run/command.py open_new_run: a run
already there, or a folder holding anything but a killed import's leftovers, is refused in one
line), reads and checks the whole model (importing/marian_config.py) before the folder is made,
and writes in run/making.py's new_run, which removes what it made if writing fails. A Hub id
(`Helsinki-NLP/opus-mt-en-de`) is downloaded with huggingface_hub into its own cache. A
multi-target model's `>>xx<<` pieces become its target languages (`data.directions`,
`data.lang_tag_format=">>{}<<"`), so `--target_lang=xx` puts the tag in front as for our own
multilingual runs. An M2M100 model's languages are `data.languages` (importing/m2m100_config.py):
`--source_lang` and `--target_lang` choose among them.
"""

from __future__ import annotations

import json
import os
from typing import Any

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions as directions_lib
from flaxformer_nmt.importing import m2m100_config, marian_config, model_folder
from flaxformer_nmt.run import command, making, selection
from flaxformer_nmt.runtime import files


def _family(model_dir: str) -> str:
  """ "m2m100" or "marian", from config.json and tokenizer_config.json alone (a Hub model is
  checked so before its weights download); one line for any model --mode=import cannot read."""
  where = os.path.join(model_dir, "config.json")
  hf = model_folder.read_json(where)
  if hf.get("model_type") == "m2m_100":
    m2m100_config.check_tokenizer(model_dir)
    return "m2m100"
  if hf.get("model_type") in ("nllb-moe", "nllb_moe"):
    raise errors.ConfigError(
      f"{where}: model_type is {hf['model_type']!r} (mixture of experts); --mode=import reads "
      "Marian and M2M100 models (NLLB-200's dense ones are M2M100)."
    )
  if hf:
    marian_config.check_marian(hf, where)  # another model_type, or one of our runs: one line
  return "marian"


def _read(model_dir: str, source: str) -> Any:
  """The model in `model_dir` read and checked: Marian's or M2M100's."""
  if _family(model_dir) == "m2m100":
    return m2m100_config.read_m2m100(model_dir)
  return marian_config.read_marian(model_dir, source)


def import_run(source: str, workdir: str) -> dict[str, Any]:
  """Makes the run in `workdir` from the Marian model `source`; returns import's figures (also
  written to the run's import_result.json). Every check comes before the folder is made."""
  folder = command.open_new_run(workdir, "import")
  model_dir = model_folder.locate(source, _family)
  model = _read(model_dir, source)
  config = model.config
  with making.new_run(folder):
    folder.copy_vocabulary(model_dir)
    record = {
      "source": source,
      "folder": os.path.abspath(model_dir),
      "files_sha256": model_folder.digests(model_dir),
      "transformers_config": model.transformers_config,
    }
    files.write_text(folder.import_record, json.dumps(record, indent=2) + "\n")
    selection.save_imported(folder, model.params, source)
    folder.write_run_record("", {"kind": "imported", "source": source})
    folder.write_config(config)  # last: a folder with config.json is a complete run
  result = {
    "mode": "import",
    "source": source,
    "parameters": marian_config.parameter_count(model.params),
    "vocab_size": model.vocabulary.vocab_size,
    "encoder_layers": config.model.num_layers,
    "decoder_layers": config.model.num_decoder_layers or config.model.num_layers,
    "activation": config.model.activation,
    "target_languages": (
      directions_lib.many_to_many(config.data)
      or directions_lib.target_languages(config.data)
      or [config.data.tgt_lang]
    ),
  }
  folder.write_result(result)
  return result
