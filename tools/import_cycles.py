"""Prints the package's module import graph and fails if it has a cycle.

  python tools/import_cycles.py            # last line: JSON {"modules": N, "cycles": [...]}

Every `import` and `from ... import` of a `flaxformer_nmt` module counts, wherever it stands (at
the top, inside a function, under TYPE_CHECKING): a cycle hidden in a function is still a cycle
for a reader.
"""

from __future__ import annotations

import ast
import json
import pathlib
import sys

PACKAGE = "flaxformer_nmt"
ROOT = pathlib.Path(__file__).resolve().parent.parent / PACKAGE


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path, modules: set[str]) -> set[str]:
  """The package modules `path` imports (a `from pkg import name` counts name if a module)."""
  found: set[str] = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name in modules}
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
      for alias in node.names:
        sub = f"{node.module}.{alias.name}"
        found.add(sub if sub in modules else node.module)
  me = module_name(path)
  return {m for m in found if m != me and m in modules and not me.startswith(m + ".")}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Every strongly connected component of more than one module (Tarjan)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  out: list[list[str]] = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def main() -> int:
  paths = sorted(ROOT.rglob("*.py"))
  modules = {module_name(p) for p in paths}
  graph = {module_name(p): imports(p, modules) for p in paths}
  for name in sorted(graph):
    print(f"{name} -> {', '.join(sorted(graph[name])) or '-'}")
  found = cycles(graph)
  print(json.dumps({"modules": len(graph), "cycles": found}))
  return 1 if found else 0


if __name__ == "__main__":
  sys.exit(main())
