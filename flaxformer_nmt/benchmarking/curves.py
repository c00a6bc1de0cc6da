"""Learning curves from a workdir's dev_metrics.jsonl (written at every evaluation)."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from flaxformer_nmt import errors  # noqa: E402
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import files


def read_dev_metrics(workdir: str) -> list[dict[str, float]]:
  path = Workdir(workdir).metrics_path("dev")
  if not os.path.exists(path):
    raise errors.DataError(f"{path} does not exist: no evaluation has run in {workdir}.")
  return files.read_jsonl(path)


# What each dev BLEU figure a run records is called on a plot's axis.
_BLEU_LABELS = {"dev_bleu": "dev sacreBLEU", "dev_multi30k_bleu": "dev BLEU4 (Multi30k protocol)"}


def plot_learning_curve(
  workdir: str, out_path: str, title: str = "", metric: str = "dev_bleu"
) -> list[dict[str, float]]:
  """Dev BLEU (`metric`: dev_bleu, or a protocol's, e.g. dev_multi30k_bleu) and dev loss
  against minutes of training; returns the points plotted."""
  records = [r for r in read_dev_metrics(workdir) if metric in r]
  if not records:
    raise errors.DataError(f"{workdir}: no evaluation recorded {metric} (dev_metrics.jsonl).")
  minutes = [r["train_minutes"] for r in records]
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(minutes, [r[metric] for r in records], "o-", color="tab:blue")
  ax.set_xlabel("minutes of training")
  ax.set_ylabel(_BLEU_LABELS.get(metric, metric), color="tab:blue")
  ax.grid(alpha=0.3)
  loss_ax = ax.twinx()
  loss_ax.plot(minutes, [r["dev_loss"] for r in records], "s--", color="tab:red", alpha=0.6)
  loss_ax.set_ylabel("dev loss (label-smoothed)", color="tab:red")
  ax.set_title(title or os.path.basename(os.path.normpath(workdir)))
  fig.tight_layout()
  fig.savefig(out_path, dpi=120)
  plt.close(fig)
  return [
    {
      "minutes": round(r["train_minutes"], 2),
      "step": r["step"],
      "dev_bleu": round(r["dev_bleu"], 2),
      **({metric: round(r[metric], 2)} if metric != "dev_bleu" else {}),
    }
    for r in records
  ]
