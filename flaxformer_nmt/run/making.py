"""The folder a new run is made in: what may already be there.

Train and import make runs (config.json, written last, marks a folder as one). Each accepts a
missing or empty folder, takes up again a folder holding only what a killed start of the same
command left there (LEFTOVERS), and refuses anything else in one line before writing a byte: a
user's folder is never written into, nor its files replaced (--mode=import once replaced a
vocabulary/ holding a user's glossary, and a run.json). `new_run` makes the folder, and removes
what it made if the writing fails (import's; a training run keeps what it wrote, and a refused
start removes the empty folders it made: modes.train).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
from collections.abc import Iterator

from flaxformer_nmt import errors
from flaxformer_nmt.data import fairseq_vocabulary, pair_vocabulary
from flaxformer_nmt.run import folder as folder_lib
from flaxformer_nmt.run.folder import Workdir

# What may be in a folder before a run-making command writes its config.json (written last: a
# folder with config.json is a run), so that it may start there: for train, what --mode=prepare
# leaves for it (vocabulary, tokenized data, its result) and what a start killed before
# config.json leaves (lock, vocabulary trained, copied or adopted, TensorBoard events, scratch
# copies); for import, a killed import's vocabulary, records and parameters.
LEFTOVERS = {
  "train": (
    "prepare_result.json",
    "results.jsonl",
    "train.lock",
    folder_lib.VOCABULARY,
    "spm.vocab",
    folder_lib.PAIR_VOCABULARY,
    "data_cache",
    "init_from.json",
    "events.out.tfevents.*",
    "*.tmp-*",
  ),
  "import": (
    folder_lib.PAIR_VOCABULARY,
    folder_lib.IMPORT_RECORD,
    "run.json",
    "averaged",
    "*.tmp-*",
  ),
}


def check_new_run(folder: Workdir, kind: str) -> None:
  """ConfigError, one line, before anything is written, when a command that makes a run
  (`kind`: "train" or "import") would make it in a folder holding anything but what a killed
  start of the same kind leaves (LEFTOVERS). A missing or empty folder is fine; so is one that
  holds a run (`Workdir.holds_run`: the command's own rules decide; import refuses it)."""
  if not os.path.isdir(folder.path) or folder.holds_run():
    return
  allowed = LEFTOVERS[kind]
  pair = folder.pair_vocabulary_dir
  try:
    foreign = sorted(
      name
      for name in os.listdir(folder.path)
      if not any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed)
    )
    if os.path.isdir(pair):
      foreign += sorted(
        f"{folder_lib.PAIR_VOCABULARY}/{name}"
        for name in os.listdir(pair)
        if name not in pair_vocabulary.FILES + fairseq_vocabulary.FILES
      )
  except OSError as e:
    raise errors.ConfigError(
      f"--workdir={folder.path}: cannot be read ({e.strerror or e}: {e.filename})."
    ) from None
  record = os.path.basename(folder.run_record_path)
  if os.path.isfile(folder.run_record_path) and record not in foreign:
    made_by = (folder.training_data() or {}).get("kind")
    if (made_by == "imported") != (kind == "import"):
      foreign.append(record)
  if foreign:
    more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    raise errors.ConfigError(
      f"--workdir={folder.path} is not empty and holds no run ({', '.join(foreign[:3])}{more}); "
      f"--mode={kind} makes a run only in a new or empty folder: choose another --workdir."
    )


@contextlib.contextmanager
def new_run(folder: Workdir) -> Iterator[Workdir]:
  """Makes `folder` (and its missing parents) for a run checked by `check_new_run`, and yields
  it; if the body raises, nothing half-made is left to be taken for a run: a folder this call
  made goes whole (and the parents it made), and in a folder that existed (empty, or a killed
  start's leftovers) the entries the body added go."""
  existed = os.path.isdir(folder.path)
  before = set(os.listdir(folder.path)) if existed else set()
  made = folder.first_missing()
  folder.create()
  try:
    yield folder
  except BaseException:
    if not existed:
      shutil.rmtree(folder.path, ignore_errors=True)
      folder.remove_if_empty(made)
    else:
      folder.remove_entries(set(os.listdir(folder.path)) - before)
    raise
