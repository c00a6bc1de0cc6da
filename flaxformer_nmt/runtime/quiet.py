"""The libraries' chatter, dropped so our progress lines, and a one-line error, stand alone.

orbax logs about 20 INFO lines per checkpoint, a warning that a checkpoint folder opened to be read
is "read only" (every inference command opens it so), and error lines for each attempt to parse a
damaged step's metadata (checkpoints/reader.py names the step once, and reads the one before);
JAX logs that no TPU backend is found at every start on a CPU or GPU. The command line installs
the filter unless `--verbosity=1` or `--alsologtostderr`; the API (`api.load`) installs it too.
"""

from __future__ import annotations

import logging as pylogging
import os

from absl import logging


class QuietLibraries(pylogging.Filter):
  """Passes every record but orbax's INFO lines, its "read only" warnings and its metadata
  parse errors, and JAX's "Unable to initialize backend" INFO line (module docstring)."""

  def filter(self, record: pylogging.LogRecord) -> bool:
    if "/orbax/" in record.pathname.replace(os.sep, "/"):
      message = str(record.msg)
      if "Failed to json parse" in message:
        return False  # a damaged step: checkpoints/reader.py says so in one line, and falls back
      return record.levelno >= pylogging.WARNING and "is read only" not in message
    if record.name == "jax._src.xla_bridge" and record.levelno < pylogging.WARNING:
      return not str(record.msg).startswith("Unable to initialize backend")
    return True


_FILTER = QuietLibraries()


def install() -> None:
  """Filters absl's handler (the command line's stderr) and the "absl" logger itself (what a
  notebook sees: orbax logs through absl, whatever handler prints it). Idempotent."""
  for target in (logging.get_absl_handler(), pylogging.getLogger("absl")):
    if _FILTER not in target.filters:
      target.addFilter(_FILTER)
