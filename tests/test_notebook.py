"""notebooks/colab.ipynb runs headless, top to bottom, on CPU with tiny demo settings.

The notebook is executed by a real Jupyter kernel (nbclient + ipykernel), as Colab would run it,
except that outside Colab its install cell only prints the devices and `TINY` cuts the demo.
"""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

import helpers

NOTEBOOK = helpers.REPO / "notebooks" / "colab.ipynb"


def test_notebook_is_committed_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_readme_colab_link_opens_the_notebook_of_the_repository_it_installs():
  """The README's "Open in Colab" link and the notebook's REPO_URL name the same GitHub
  repository, and the link's path is this notebook: one place to change if the project moves."""
  import re  # pylint: disable=g-import-not-at-top

  readme_text = (helpers.REPO / "README.md").read_text(encoding="utf-8")
  link = re.search(
    r"\(https://colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/main/([\w./-]+)\)",
    readme_text,
  )
  assert link, "no Open in Colab link in the README"
  source = "".join(nbformat.read(NOTEBOOK, as_version=4).cells[1].source)
  repo_url = re.search(r'"(https://github\.com/[\w.-]+/[\w.-]+)"', source).group(1)
  assert repo_url == f"https://github.com/{link.group(1)}"
  assert link.group(2) == "notebooks/colab.ipynb" and NOTEBOOK.is_file()


@pytest.mark.slow
def test_notebook_runs_headless_top_to_bottom(tmp_path: pathlib.Path, monkeypatch) -> None:
  monkeypatch.setenv("FLAXFORMER_NMT_NOTEBOOK_TINY", "1")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(
    nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
  )
  client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error

  text = "\n".join(
    out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
  )
  assert "Workdirs under" in text and "(local: lost with the runtime)" in text
  assert "step 30: dev loss" in text
  assert "WMT14 skipped" in text
  assert text.count("  ->  ") == 3  # three translations
  assert "sacreBLEU" in text and "tokenized BLEU" in text and "demo test" in text
  images = [
    out
    for cell in nb.cells
    if cell.cell_type == "code"
    for out in cell.outputs
    if "image/png" in out.get("data", {})
  ]
  assert len(images) == 4  # three attention grids and the positional encoding
  workdir = tmp_path / "runs" / "demo"
  for name in ("train", "attention", "average", "eval"):
    assert (workdir / f"{name}_result.json").is_file(), name
