"""What a run was trained on, by content: the fingerprint a resume is checked against.

A run's config names its training data by where it is (a folder, a TFDS name), and a place can
hold other data tomorrow: a relative path read from another folder, a corpus replaced in place.
So when training starts, the run records what it reads in `<workdir>/run.json`:

  files  each training file's name, size and SHA-256 (and, as a hint only, its path and mtime);
  tfds   the dataset's name, version and split, and the languages;
  demo   the generator's settings (its version, the training size, the seed).

A resume computes the same of what it would read now and is refused, before any work, if they
differ (`difference`): another corpus of the same size or line count is caught by the hash. A
file whose path, size and mtime are those recorded is not hashed again (a resume of WMT14 reads
gigabytes otherwise); a moved or touched one is. A changed `data.dir` is therefore allowed when
the content matches: that is how a moved run is pointed at its data again.
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from flaxformer_nmt.config import directions
from flaxformer_nmt.runtime import files

VERSION = 1


def _file(path: str, known: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """One file's entry; its hash reused from `known` (by path) when size and mtime agree."""
  path = os.path.abspath(path)
  st = os.stat(path)
  entry = {"name": os.path.basename(path), "bytes": st.st_size, "path": path}
  entry["mtime_ns"] = st.st_mtime_ns
  old = known.get(path)
  if old and old.get("bytes") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns:
    entry["sha256"] = old["sha256"]
  else:
    entry["sha256"] = files.sha256(path)
  return entry


def _train_files(dc: ml_collections.ConfigDict) -> list[str]:
  # The sources are the training side's: imported when a run's data is fingerprinted (train, a
  # resume's check), so a decoding command does not load them.
  from flaxformer_nmt.data import multilingual, sources  # pylint: disable=g-import-not-at-top

  if directions.is_multilingual(dc):
    return [p for c in multilingual.train_corpora(dc) for p in c.source.files("train")]
  return list(sources.FilesSource(dc).files("train"))


def _tfds_version(dc: ml_collections.ConfigDict) -> str:
  """The prepared dataset's version, or "" when TFDS cannot say (not prepared yet)."""
  from flaxformer_nmt.data import sources  # pylint: disable=g-import-not-at-top (as above)

  try:
    tfds = sources.import_tfds()
    return str(tfds.builder(dc.tfds_name, data_dir=dc.tfds_data_dir or None).version)
  except Exception:  # pylint: disable=broad-except  # unknown or unprepared: the name stands
    return ""


def training_data(
  config: ml_collections.ConfigDict, recorded: dict[str, Any] | None = None
) -> dict[str, Any]:
  """The identity of the training data `config` names (module docstring). `recorded` (a
  previous identity) lends the hashes of files unchanged since."""
  dc = config.data
  out: dict[str, Any] = {"version": VERSION, "source": dc.source}
  if dc.source == "demo":
    out["generator"] = {
      "name": "demo-v1",
      "train_size": int(dc.demo_train_size),
      "seed": int(dc.get("demo_seed", 0)),
    }
  elif dc.source == "tfds":
    out["tfds"] = {
      "name": dc.tfds_name,
      "version": _tfds_version(dc),
      "split": dc.train_split,
      "languages": [dc.src_lang, dc.tgt_lang],
    }
  else:
    known = {f["path"]: f for f in (recorded or {}).get("files", []) if "path" in f}
    out["files"] = [_file(p, known) for p in _train_files(dc)]
    out["directions"] = [d.name for d in directions.trained(dc)] or [f"{dc.src_lang}-{dc.tgt_lang}"]
  return out


def difference(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
  """What differs between two identities, in a few words naming the first difference; None
  when they are the same data (paths and mtimes are hints, not identity)."""
  if recorded.get("source") != current.get("source"):
    return f"data.source is {current.get('source')!r}, the run's {recorded.get('source')!r}"
  old_tfds, new_tfds = dict(recorded.get("tfds") or {}), dict(current.get("tfds") or {})
  if not old_tfds.get("version") or not new_tfds.get("version"):  # TFDS could not say: unknown
    old_tfds.pop("version", None)
    new_tfds.pop("version", None)
  if old_tfds != new_tfds:
    return f"the TFDS dataset {new_tfds} differs from the run's {old_tfds}"
  for key in ("generator", "directions"):
    if recorded.get(key) != current.get(key):
      return f"{key} {current.get(key)} differ from the run's {recorded.get(key)}"
  ours, theirs = current.get("files", []), recorded.get("files", [])
  if [f["name"] for f in ours] != [f["name"] for f in theirs]:
    return (
      f"the training files are {[f['name'] for f in ours]}, the run's {[f['name'] for f in theirs]}"
    )
  for new, old in zip(ours, theirs, strict=True):
    if (new["bytes"], new["sha256"]) != (old["bytes"], old["sha256"]):
      return (
        f"{new['path']} ({new['bytes']} bytes, sha256 {new['sha256'][:12]}) is not the "
        f"{old['name']} the run trained on ({old['bytes']} bytes, sha256 {old['sha256'][:12]}, "
        f"read from {old.get('path', '?')})"
      )
  return None
