"""Paths in a run's config are absolute: read from any folder, a run means the same files.

A relative `data.dir` or `data.vocab_path` was saved as typed, so a resume or a translate started
from another folder read whatever that relative path held there. Every command now makes the
path fields of the config it is given absolute against its current folder before anything reads
or saves them (`absolute`), and training saves them so.

A run saved before (a relative path in its config.json) is read as it always was, against the
current folder, and says so in one warning line (`absolute` of its saved config, `saved=True`):
its next training command saves the absolute path, and records its data's fingerprint
(run/identity.py) from then on.
"""

from __future__ import annotations

import os

import ml_collections
from absl import logging

# Fields that name a file or folder (init_from: a run or one of its checkpoints, when it is a
# path that exists; anything else there is left for init_from's own checks to name).
FIELDS = ("data.dir", "data.vocab_path", "data.tfds_data_dir", "init_from")


def _get(config: ml_collections.ConfigDict, path: str) -> object:
  node = config
  for part in path.split("."):
    if part not in node:
      return None
    node = node[part]
  return node


def _set(config: ml_collections.ConfigDict, path: str, value: str) -> None:
  *groups, name = path.split(".")
  node = config
  for group in groups:
    node = node[group]
  node[name] = value


def absolute(
  config: ml_collections.ConfigDict, *, saved: str = "", base: str | None = None
) -> dict[str, str]:
  """Makes `config`'s relative path fields absolute against `base` (default: the current
  folder), in place; returns {field: its absolute path}. `saved` names the config.json they
  were read from: then one warning line says how its relative paths are read."""
  base = os.path.abspath(base or os.getcwd())
  changed: dict[str, str] = {}
  for field in FIELDS:
    value = _get(config, field)
    if not isinstance(value, str) or not value or os.path.isabs(value):
      continue
    if field == "init_from" and not os.path.exists(os.path.join(base, value)):
      continue
    changed[field] = os.path.normpath(os.path.join(base, value))
    _set(config, field, changed[field])
  if saved and changed:
    logging.warning(
      "%s was saved with relative paths (before runs saved them absolute): reading %s from "
      "the current folder.",
      saved,
      ", ".join(f"{field}={path}" for field, path in changed.items()),
    )
  return changed
