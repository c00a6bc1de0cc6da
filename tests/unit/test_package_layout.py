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
