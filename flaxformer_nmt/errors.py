"""The errors a user can cause and fix, and nothing else.

`main.py` prints a `UserError` as one line (`error: ...`) and exits with status 2; every other
exception is a bug and keeps its traceback. So raise a `UserError` only for something the user can
change (a file, a config value, a checkpoint, a flag) and name the culprit in the message, and never
catch broad exception types to turn them into one.
"""

from __future__ import annotations


class UserError(Exception):
  """A mistake the user can fix; the message is one line naming the culprit."""


class ConfigError(UserError):
  """A config value (named `config.x.y`), a command-line flag or an environment variable."""


class DataError(UserError):
  """The user's data: a file, a line, a dataset name, a split."""


class CheckpointError(UserError):
  """A checkpoint or workdir that cannot be used as asked."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint's shapes or parameter names differ from the model's (another configuration)."""


class WorkdirLockedError(CheckpointError):
  """Another training job holds the workdir."""


class NonFiniteLossError(UserError):
  """Training produced a NaN/Inf loss or gradient (the learning rate, the data): nothing saved."""
