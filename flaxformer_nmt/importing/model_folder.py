"""Reading a transformers model folder: finding it (a local folder, or a Hub id's snapshot), its
JSON files and its weights (model.safetensors without torch, or pytorch_model.bin with it).

What every pretrained family `--mode=import` reads shares (importing/marian_config.py is the
Marian family's reading of what these return).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from flaxformer_nmt import errors
from flaxformer_nmt.runtime import files

HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.spm", "*.model", "*.json"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def locate(source: str, check: Callable[[str], None] = lambda folder: None) -> str:
  """The local folder of `source`: itself, or a Hub id's snapshot (downloaded once into
  huggingface_hub's cache). ConfigError, one line, when it is neither. `check(folder)` sees the
  folder's config.json and tokenizer_config.json first: a Hub model it refuses is refused before
  its weights (gigabytes) are downloaded."""
  if os.path.isdir(source):
    check(source)
    return source
  if not _HUB_ID.match(source) or os.path.exists(source):
    raise errors.ConfigError(f"--input={source}: no such folder, nor a Hub id like org/name.")
  try:
    from huggingface_hub import snapshot_download  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.ConfigError(
      f"--input={source}: no such folder; read as a Hub id, it needs huggingface_hub "
      '(pip install -e ".[hf]").'
    ) from None
  try:
    configs = snapshot_download(source, allow_patterns=["config.json", "tokenizer_config.json"])
  except Exception as e:  # noqa: BLE001  # offline, unknown repo, no permission: all one line
    raise errors.ConfigError(
      f"--input={source}: could not download it from the Hub ({type(e).__name__}: "
      f"{str(e).splitlines()[0] if str(e) else 'no detail'})."
    ) from None
  check(configs)
  try:
    folder = snapshot_download(source, allow_patterns=HUB_FILES)
    if not os.path.isfile(os.path.join(folder, "model.safetensors")):  # an older repo
      folder = snapshot_download(source, allow_patterns=[*HUB_FILES, "pytorch_model.bin"])
    return folder
  except Exception as e:  # noqa: BLE001  # offline, unknown repo, no permission: all one line
    raise errors.ConfigError(
      f"--input={source}: could not download it from the Hub ({type(e).__name__}: "
      f"{str(e).splitlines()[0] if str(e) else 'no detail'})."
    ) from None


def read_json(path: str) -> dict[str, Any]:
  """A model folder's JSON file ({} if missing); DataError if it is not a JSON object."""
  return files.read_json_object(path, "a transformers model's config (an object)")


def state_dict(folder: str) -> dict[str, np.ndarray]:
  """The weights: model.safetensors (no torch needed), else pytorch_model.bin (torch)."""
  path = os.path.join(folder, "model.safetensors")
  if os.path.isfile(path):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

    try:
      sd = load_file(path)
    except Exception as e:  # noqa: BLE001  # a torn or foreign file
      raise errors.DataError(f"{path}: not a safetensors file ({e}).") from None
    return {k: np.asarray(v, np.float32) for k, v in sd.items()}
  path = os.path.join(folder, "pytorch_model.bin")
  if not os.path.isfile(path):
    raise errors.DataError(f"{folder}: has no model.safetensors or pytorch_model.bin.")
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.ConfigError(
      f'{path}: reading pytorch_model.bin needs torch (pip install -e ".[hf]"), or give a '
      "folder with model.safetensors."
    ) from None
  try:
    sd = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # noqa: BLE001  # a torn file, a git-LFS pointer, a pickle of code
    raise errors.DataError(f"{path}: not a torch state dict ({type(e).__name__}).") from None
  return {k: v.float().numpy() for k, v in sd.items()}


def digests(folder: str) -> dict[str, str]:
  """The SHA-256 of each file in `folder` (not its subfolders): what import.json records."""
  names = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)))
  return {name: files.sha256(os.path.join(folder, name)) for name in names}
