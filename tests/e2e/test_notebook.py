"""notebooks/colab.ipynb runs headless, top to bottom, on CPU with tiny demo settings.

The notebook is executed by a real Jupyter kernel (nbclient + ipykernel), as Colab would run it,
except that outside Colab its install cell only prints the devices and `TINY` cuts the demo.
"""

from __future__ import annotations

import pathlib

import nbformat
from nbclient import NotebookClient

import helpers

NOTEBOOK = helpers.REPO / "notebooks" / "colab.ipynb"


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
  # The precision cell and the run's record of it (a CPU: float32, no loss scale).
  assert "model.dtype='auto' trains in float32\n" in text and "trained in float32 (" in text
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
