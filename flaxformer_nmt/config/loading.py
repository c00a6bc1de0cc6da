"""Finding and loading experiment config files: by name (`demo`) or by path (`configs/demo.py`).

The configs are written once, in the repository's top-level `configs/`, and installed with the
package as `flaxformer_nmt.configs` (pyproject.toml maps the folder), so a name resolves after an
editable, a plain or a git-URL install, from any working directory. A `path:argument` spec passes
`argument` to `get_config` (`wmt14_ende_base:files`, `wmt14_table3.py:A1`).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import pathlib
import sys

import ml_collections

from flaxformer_nmt import errors


def _configs_dir() -> pathlib.Path:
  """The installed `flaxformer_nmt.configs`, or a clone's `configs/` beside the package when the
  project is used without an install (`PYTHONPATH=.`), where the mapping does not exist."""
  try:
    from flaxformer_nmt import configs  # pylint: disable=g-import-not-at-top
  except ImportError:
    return pathlib.Path(__file__).resolve().parent.parent / "configs"
  return pathlib.Path(configs.__file__).resolve().parent


CONFIGS_DIR = _configs_dir()


def names() -> list[str]:
  """The installed configs' names, for messages and `--helpfull`."""
  return sorted(p.stem for p in CONFIGS_DIR.glob("*.py") if not p.stem.startswith("_"))


def resolve(spec: str) -> str:
  """`spec` (`name`, `name:arg`, `path.py` or `path.py:arg`) as `absolute/path.py[:arg]`.

  A path that exists is taken as it is. A bare name, or a `configs/<name>.py` typed in a folder
  that has no such file (the console script run outside a clone), is the installed config of that
  name. Anything else is a ConfigError naming the spec and the installed names.
  """
  path, sep, argument = spec.partition(":")
  if os.path.isfile(path):
    return os.path.abspath(path) + sep + argument
  name = path[: -len(".py")] if path.endswith(".py") else path
  installed = CONFIGS_DIR / f"{os.path.basename(name)}.py"
  if os.path.dirname(name) in ("", "configs") and installed.is_file():
    return str(installed) + sep + argument
  raise errors.ConfigError(
    f"--config={spec}: no such file, and no installed config of that name "
    f"(installed: {', '.join(names())})."
  )


def load(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of `spec` (see `resolve`), not yet validated or overridden."""
  path, _, argument = resolve(spec).partition(":")
  name = f"_flaxformer_nmt_config_{abs(hash(path))}"
  module_spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(module_spec)
  # Registered while it runs, as a normal import is: a dataclass defined in the file (under
  # `from __future__ import annotations`) looks its module up there.
  sys.modules[name] = module
  try:
    module_spec.loader.exec_module(module)
  finally:
    sys.modules.pop(name, None)
  get_config = module.get_config
  if argument and not inspect.signature(get_config).parameters:
    raise errors.ConfigError(
      f"--config={spec}: {os.path.basename(path)} takes no argument after ':'."
    )
  return get_config(argument) if argument else get_config()
