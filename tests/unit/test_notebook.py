"""notebooks/colab.ipynb read, not run: committed without outputs, naming no repository, and its
first cell stopping in one line without one. tests/e2e/test_notebook.py runs it in a kernel."""

from __future__ import annotations

import nbformat
import pytest

import helpers

NOTEBOOK = helpers.REPO / "notebooks" / "colab.ipynb"


def test_notebook_is_committed_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_the_notebook_names_no_repository_and_stops_in_one_line_without_one(monkeypatch):
  """No invented URL: the user gives their copy's URL (or a Drive folder). In Colab, with neither,
  the first code cell stops with one line (IPython shows `_render_traceback_`'s lines only)."""
  import re  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top

  nb = nbformat.read(NOTEBOOK, as_version=4)
  text = "\n".join("".join(c.source) for c in nb.cells)
  assert not re.search(r"github\.com/(?!<you>)", text), "a repository URL in the notebook"
  first = "".join(next(c for c in nb.cells if c.cell_type == "code").source)
  assert 'REPO_URL = ""' in first and 'DRIVE_COPY = ""' in first
  monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
  namespace: dict = {}
  with pytest.raises(Exception, match="Set REPO_URL") as info:
    exec(compile(first, "cell1", "exec"), namespace)  # noqa: S102
  (line,) = info.value._render_traceback_()
  assert line.startswith("error: Set REPO_URL (the git URL of your copy")
  filled = first.replace('REPO_URL = ""', 'REPO_URL = "https://example.org/me/flaxformer_nmt"')
  exec(compile(filled, "cell1", "exec"), {})  # noqa: S102  (given a URL, it goes on)
