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


def _run(tmp_path: pathlib.Path) -> str:
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(
    nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
  )
  client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
  images = [
    out
    for cell in nb.cells
    if cell.cell_type == "code"
    for out in cell.outputs
    if "image/png" in out.get("data", {})
  ]
  assert len(images) == 4  # three attention grids and the positional encoding
  return "\n".join(
    out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
  )


@pytest.mark.slow
def test_notebook_runs_headless_top_to_bottom_twice(tmp_path: pathlib.Path, monkeypatch) -> None:
  """Run all, then Run all again in the same folder (a runtime reset with the workdirs on Drive):
  the second run completes too, and its training cell returns the first run's saved figures
  without training or decoding again."""
  monkeypatch.setenv("FLAXFORMER_NMT_NOTEBOOK_TINY", "1")
  text = _run(tmp_path)
  assert "Workdirs under" in text and "(local: lost with the runtime)" in text
  trained = [line for line in text.splitlines() if line.startswith(("step 30:", "test sacreBLEU"))]
  assert len(trained) == 2 and trained[0].startswith("step 30: dev loss ")
  assert "WMT14 skipped" in text and "TensorBoard: tensorboard --logdir" in text
  assert text.count("  ->  ") == 3  # three translations
  assert "sacreBLEU" in text and "tokenized BLEU" in text and "demo test" in text
  workdir = tmp_path / "runs" / "demo"
  for name in ("train", "attention", "average", "eval", "export"):
    assert (workdir / f"{name}_result.json").is_file(), name
  assert (tmp_path / "runs" / "demo_ct2" / "model.bin").is_file()
  trained_files = helpers.snapshot(workdir / "checkpoints")
  trained_files.update(helpers.snapshot(workdir / "eval"))
  train_log = (workdir / "train_metrics.jsonl").read_text()

  again = _run(tmp_path)
  assert [line for line in again.splitlines() if line.startswith(("step 30:", "test sac"))] == (
    trained
  )
  assert "Already exported:" in again
  after = helpers.snapshot(workdir / "checkpoints")
  after.update(helpers.snapshot(workdir / "eval"))
  # No checkpoint written and no test-set decoding of the trained step redone; the eval cell's
  # own files (the averaged model's) are rewritten, as its mode always does.
  changed = {k for k in trained_files if after.get(k) != trained_files[k]}
  assert all("averaged" in k for k in changed), changed
  assert any("step30" in k for k in trained_files)
  assert (workdir / "train_metrics.jsonl").read_text() == train_log
