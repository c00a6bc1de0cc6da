"""The project's requirements as pip reads them, one per line: `dependencies` and the extras named.

  python tools/requirements.py test      # `pip install -e ".[test]"`, less the project itself
  python tools/requirements.py test hf

tools/compat.sh and tools/hf_tests.sh install these into a CI leg's venv ahead of time (`.ci/run`
prepares the legs' venvs in the background while the main leg runs). The project itself is left
out: its editable build writes into the checkout, where another install may be building it at the
same moment; the leg adds it when it runs.
"""

from __future__ import annotations

import pathlib
import sys
import tomllib


def requirements(extras: list[str]) -> list[str]:
  """`dependencies` then each extra's, in pyproject.toml's order; an unknown extra is an error."""
  pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
  project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
  optional = project.get("optional-dependencies", {})
  unknown = [extra for extra in extras if extra not in optional]
  if unknown:
    raise SystemExit(f"tools/requirements.py: no extra {unknown[0]!r} in {pyproject}")
  out = list(project["dependencies"])
  for extra in extras:
    out += optional[extra]
  return out


if __name__ == "__main__":
  print("\n".join(requirements(sys.argv[1:])))
