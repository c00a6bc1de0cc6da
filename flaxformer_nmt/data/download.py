"""`--mode=prepare` for Multi30k: the raw task-1 files, downloaded into `data.dir` and verified.

Multi30k (Elliott et al., 2016) publishes its task-1 text as gzipped, line-aligned files,
`<set>.<lang>.gz`, in its repository's `data/task1/raw/` folder; `data.url` points there by default
(configs/multi30k.py). Each file is checked against the size and SHA-256 recorded below (from the
official repository), so a truncated or altered download never reaches training. A file is written
under a temporary name beside its place and renamed only once verified; a failed or unverified
download leaves nothing behind, and a file already verified is not fetched again.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Iterable

import ml_collections
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions
from flaxformer_nmt.runtime import files

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# Test sets beyond test_2016_flickr, fetched on request (`data.extra_test_sets`).
MULTI30K_EXTRA_TEST_SETS = ("test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")
# (bytes, sha256) of every file of Multi30k's data/task1/raw/ folder.
MULTI30K_FILES: dict[str, tuple[int, str]] = {
  "test_2016_flickr.cs.gz": (
    22572,
    "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
  ),
  "test_2016_flickr.de.gz": (
    22890,
    "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
  ),
  "test_2016_flickr.en.gz": (
    21077,
    "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
  ),
  "test_2016_flickr.fr.gz": (
    22310,
    "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
  ),
  "test_2017_flickr.de.gz": (
    21471,
    "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
  ),
  "test_2017_flickr.en.gz": (
    19138,
    "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
  ),
  "test_2017_flickr.fr.gz": (
    20434,
    "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
  ),
  "test_2017_mscoco.de.gz": (
    10230,
    "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
  ),
  "test_2017_mscoco.en.gz": (
    8844,
    "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
  ),
  "test_2017_mscoco.fr.gz": (
    9751,
    "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
  ),
  "test_2018_flickr.cs.gz": (
    25181,
    "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2",
  ),
  "test_2018_flickr.de.gz": (
    26461,
    "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
  ),
  "test_2018_flickr.en.gz": (
    23514,
    "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
  ),
  "test_2018_flickr.fr.gz": (
    25321,
    "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
  ),
  "train.cs.gz": (593827, "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077"),
  "train.de.gz": (637044, "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
  "train.en.gz": (568929, "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
  "train.fr.gz": (604242, "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c"),
  "val.cs.gz": (22096, "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc"),
  "val.de.gz": (24681, "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
  "val.en.gz": (21650, "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
  "val.fr.gz": (23001, "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9"),
}
TIMEOUT_S = 60.0
CHUNK = 1 << 16


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(CHUNK), b""):
      digest.update(block)
  return digest.hexdigest()


def verified(path: str, size: int, sha256: str) -> bool:
  """Whether `path` exists with exactly this size and SHA-256."""
  return os.path.isfile(path) and os.path.getsize(path) == size and _sha256(path) == sha256


def wanted_files(data: ml_collections.ConfigDict) -> list[str]:
  """The file names `--mode=prepare` fetches: train, dev and test for both languages (every
  language of a multilingual config's directions), and the
  extra test sets asked for (`data.extra_test_sets`: comma-separated names, or "all")."""
  extra = [s.strip() for s in data.extra_test_sets.split(",") if s.strip()]
  if extra == ["all"]:
    extra = list(MULTI30K_EXTRA_TEST_SETS)
  for name in extra:
    if name not in MULTI30K_EXTRA_TEST_SETS:
      raise errors.ConfigError(
        f"config.data.extra_test_sets names {name!r}; choose from "
        f"{', '.join(MULTI30K_EXTRA_TEST_SETS)} (or 'all')."
      )
  sets = [data.train_prefix, data.dev_prefix, data.test_prefix, *extra]
  langs = (
    directions.languages(data)
    if directions.is_multilingual(data)
    else [data.src_lang, data.tgt_lang]
  )
  names = [f"{s}.{lang}.gz" for s in dict.fromkeys(sets) for lang in langs]
  unknown = [n for n in names if n not in MULTI30K_FILES]
  if unknown:
    raise errors.ConfigError(
      f"config.data.url is set, but Multi30k has no file {unknown[0]} with a recorded checksum "
      "(check config.data.src_lang, tgt_lang and the *_prefix fields; Multi30k task 1 has "
      "en, de, fr and cs)."
    )
  return names


def _fetch(url: str, path: str, size: int, sha256: str) -> None:
  """Downloads `url` to `path` through a temporary file; DataError (one line) on any failure."""
  try:
    with files.atomic_path(path) as tmp:
      with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(tmp, "wb") as out:
        while block := response.read(CHUNK):
          out.write(block)
      if not verified(tmp, size, sha256):
        got = os.path.getsize(tmp)
        raise errors.DataError(
          f"{os.path.basename(path)} from {url} does not verify ({got} bytes, expected {size} "
          f"with SHA-256 {sha256[:12]}...): not saved. Check config.data.url, then rerun "
          "--mode=prepare."
        )
  except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
    reason = getattr(e, "reason", None) or e
    raise errors.DataError(
      f"Downloading {os.path.basename(path)} from {url} failed: {' '.join(str(reason).split())}. "
      "Nothing was saved; check the network and config.data.url, then rerun --mode=prepare."
    ) from None


def make_folder(path: str) -> None:
  """Creates config.data.dir, or says in one line why it cannot be (a file is in the way)."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise errors.DataError(f"config.data.dir={path}: is a file, not a folder for the corpus.")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:  # a file somewhere above it, no permission, a full disk
    raise errors.DataError(
      f"config.data.dir={path}: cannot create the folder ({e.strerror or e})."
    ) from None


def download(data: ml_collections.ConfigDict, names: Iterable[str] | None = None) -> dict[str, int]:
  """Fetches Multi30k's files into `data.dir` from `data.url`; returns how many were downloaded
  and how many were already there, verified."""
  names = list(names) if names is not None else wanted_files(data)
  base = data.url if data.url.endswith("/") else data.url + "/"
  make_folder(data.dir)
  fetched = kept = 0
  for i, name in enumerate(names, 1):
    path = os.path.join(data.dir, name)
    size, sha256 = MULTI30K_FILES[name]
    if verified(path, size, sha256):
      kept += 1
      continue
    logging.info(
      "[%d/%d] Downloading %s%s (%d bytes) to %s.", i, len(names), base, name, size, path
    )
    _fetch(base + name, path, size, sha256)
    fetched += 1
  logging.info("Multi30k in %s: %d file(s) downloaded, %d already there.", data.dir, fetched, kept)
  return {"downloaded": fetched, "verified_present": kept}
