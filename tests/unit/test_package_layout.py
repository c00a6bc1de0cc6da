"""The package's layout as docs/developing.md states it: each entry of its layer list imports only
entries above it (or itself), every module has its entry, and no library file is over 400 lines.
The list is read from the document, so the document and the code cannot drift apart."""

from __future__ import annotations

import ast
import pathlib
import re

import helpers

PACKAGE = helpers.REPO / "flaxformer_nmt"
MAX_LINES = 400


def _layers() -> list[list[str]]:
  """The layer list: each entry's names ("runtime", "modes", ...), top (lowest) first."""
  text = (helpers.REPO / "docs" / "developing.md").read_text(encoding="utf-8")
  block = text.split("## Layout", 1)[1].split("```", 2)[1]
  out = []
  for line in block.strip("\n").splitlines():
    if not line or line[0].isspace():  # a description's second line
      continue
    names = re.match(r"((?:\w+(?:/|\.py)(?:,\s*)?)+)", line)
    assert names, f"docs/developing.md's layer list: {line!r} names no folder/ or file.py"
    out.append(
      [n.strip().rstrip("/").removesuffix(".py") for n in names[1].split(",") if n.strip()]
    )
  return out


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    if parts:  # the package's own __init__ imports nothing
      out[".".join(parts)] = path
  return out


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
  """The package modules `path` imports, wherever the import stands (a function's included)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    names: list[str] = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    for name in names:
      if name.startswith("flaxformer_nmt."):
        rest = name.removeprefix("flaxformer_nmt.")
        if rest in modules:
          found.add(rest)
  return found


def _layer_of(module: str, layers: list[list[str]]) -> int | None:
  top = module.split(".")[0]
  hits = [i for i, names in enumerate(layers) if top in names]
  return hits[0] if hits else None


def test_every_module_has_a_place_in_the_documented_order():
  layers = _layers()
  assert [n for n in layers if "modes" in n] and [n for n in layers if "run" in n]
  unplaced = [m for m in _modules() if _layer_of(m, layers) is None]
  assert not unplaced, f"not in docs/developing.md's layer list: {unplaced}"


def test_every_import_goes_up_the_documented_order():
  layers, modules = _layers(), _modules()
  wrong = []
  for module, path in modules.items():
    mine = _layer_of(module, layers)
    for used in sorted(_imports(path, set(modules))):
      theirs = _layer_of(used, layers)
      if mine is not None and theirs is not None and theirs > mine:
        wrong.append(f"{module} ({'/'.join(layers[mine])}) imports {used}")
  assert not wrong, "imports below their layer (docs/developing.md, ## Layout):\n" + "\n".join(
    wrong
  )


def test_no_library_file_is_over_400_lines():
  sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
  over = {str(p.relative_to(helpers.REPO)): n for p, n in sorted(sizes.items()) if n > MAX_LINES}
  assert not over, f"over {MAX_LINES} lines: {over}"


def test_every_package_folder_is_installed():
  """pyproject.toml lists packages by hand: a folder left out is missing from a plain install."""
  import tomllib  # pylint: disable=g-import-not-at-top

  listed = set(
    tomllib.loads((helpers.REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
  )
  folders = {
    ".".join(p.parent.relative_to(helpers.REPO).parts) for p in PACKAGE.rglob("__init__.py")
  }
  assert folders <= listed, f"not in pyproject.toml's packages: {sorted(folders - listed)}"


# The names a workdir goes by in the library (a `Workdir`, or the --workdir string), and the
# Workdir's folders: a path joined onto one of them outside run/folder.py knows the run's layout.
_WORKDIR_NAMES = {"workdir", "run", "run_dir", "folder_of_run"}
_WORKDIR_HOLDERS = {"workdir", "run", "folder"}  # attributes holding one: self.workdir, run.folder
_WORKDIR_FOLDERS = {
  "path",
  "checkpoints",
  "averaged",
  "best",
  "eval_dir",
  "attention_dir",
  "data_cache",
  "tensorboard_dir",
  "best_incoming",
  "best_outgoing",
}


def _names_a_workdir(node: ast.AST) -> bool:
  """Whether `node` is a workdir (by its name) or one of a Workdir's folders."""
  if isinstance(node, ast.Name):
    return node.id in _WORKDIR_NAMES
  if isinstance(node, ast.Attribute):
    if node.attr in _WORKDIR_HOLDERS:
      return True
    return node.attr in _WORKDIR_FOLDERS and _names_a_workdir(node.value)
  return False


def workdir_joins(path: pathlib.Path) -> list[str]:
  """`file:line` of each path joined inside a workdir: `os.path.join(<a workdir or one of its
  folders>, ...)`, or a Workdir's own `.join` called from outside run/folder.py."""
  name = path.relative_to(helpers.REPO) if path.is_relative_to(helpers.REPO) else path.name
  found = []
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
      continue
    func = node.func
    is_os_join = (
      func.attr == "join"
      and isinstance(func.value, ast.Attribute)
      and func.value.attr == "path"
      and isinstance(func.value.value, ast.Name)
      and func.value.value.id == "os"
    )
    if is_os_join and node.args and _names_a_workdir(node.args[0]):
      found.append(f"{name}:{node.lineno}")
    elif func.attr == "join" and not is_os_join and _names_a_workdir(func.value):
      found.append(f"{name}:{node.lineno}")
  return found


def test_only_the_folder_owner_joins_paths_inside_a_workdir():
  """Issue 60: no module but run/folder.py joins a path inside a workdir (docs/developing.md):
  the layout has one owner, so a new file of the run is taught to one place. About 13 joins
  stood outside it at 57b01f1 (cli, run_config, api, importing, best, eight in selection)."""
  owner = PACKAGE / "run" / "folder.py"
  joins = [j for p in _modules().values() if p != owner for j in workdir_joins(p)]
  assert not joins, f"paths joined inside a workdir outside run/folder.py: {joins}"


def test_the_join_check_finds_what_it_is_for(tmp_path):
  """The check above, on the shapes it must catch and those it must leave."""
  sample = tmp_path / "sample.py"
  sample.write_text(
    "import os\n"
    "a = os.path.join(workdir, 'config.json')\n"
    "b = os.path.join(run.averaged, 'latest.json')\n"
    "c = run.join('import.json')\n"
    "d = os.path.join(self.workdir.best, '.incoming')\n"
    "e = os.path.join(folder, 'vocab.json')\n"
    "f = ', '.join(names)\n"
    "g = os.path.join(tmp, run_name)\n",
    encoding="utf-8",
  )
  assert workdir_joins(sample) == [f"sample.py:{n}" for n in (2, 3, 4, 5)]
