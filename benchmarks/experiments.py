r"""The training runs behind the BLEU figures of the README and docs/, recorded.

  python benchmarks/experiments.py --experiment=demo                # the quick start: record `demo`
  python benchmarks/experiments.py --experiment=demo_precisions   # float32, bfloat16, float16
  python benchmarks/experiments.py --experiment=fine_tune_demo      # docs/fine-tuning.md
  python benchmarks/experiments.py --experiment=finetune_imported   # docs/pretrained.md
  python benchmarks/experiments.py --experiment=fine_tune_lora      # docs/fine-tuning.md
  python benchmarks/experiments.py --experiment=multi30k --data_dir=data/multi30k --minutes=60
  python benchmarks/experiments.py --experiment=multi30k_seeds --data_dir=data/multi30k --minutes=20
  python benchmarks/experiments.py --experiment=multi30k_best --data_dir=data/multi30k
  python benchmarks/experiments.py --experiment=multi30k_multilingual --data_dir=data/multi30k \
      --minutes=60
  python benchmarks/experiments.py --experiment=multi30k_constraints --data_dir=data/multi30k \
      --minutes=30

The experiments are written in experiments_finetune.py (the demo and its fine-tuning) and
experiments_multi30k.py; experiment_common.py holds the flags they share and the command runner.

Each experiment is the sequence of commands a user would type (`python main.py ...`, run as
subprocesses from the checkout, so what is measured is the command line itself), and its figures
are read from what those commands print and write into their workdirs. The result goes into
`benchmarks/results/<record>.json` (flaxformer_nmt/benchmarking/record.py), then to stdout as the
last line. Rerunning an experiment resumes its training runs and returns their saved figures,
then evaluates again; nothing already trained is lost to an interruption.

- `demo`: configs/demo.py trained to its end (600 steps); its dev and test BLEU.
- `demo_precisions`: the demo in float32, bfloat16 and float16 (benchmarks/precisions.py): test
  BLEU, steps per second, float16's loss scale.
- `fine_tune_demo`: the demo model (trained first if --source is missing) fine-tuned on a shifted
  domain of 5-6 digit numbers (docs/fine-tuning.md's recipe), its best and EMA parameters, and a
  run fine-tuned on a mix of the shifted and the original domain; each scored on both test sets.
- `finetune_imported`: the demo run exported to transformers' format, imported again
  (--mode=import), then fine-tuned on the shifted domain as `fine_tune_demo`'s best/EMA run is
  (no --config model fields: they come from the import), its best and EMA parameters scored on
  both test sets: beside fine_tune_demo.json.
- `fine_tune_lora`: the demo model fine-tuned on fine_tune_demo's shifted domain three ways, the
  same steps and data, best dev BLEU kept: every parameter (fine_tune_demo's rate, no EMA), LoRA
  rank 8 on q, k, v, o at that rate, and at ten times it; each scored on both test sets, with its
  trained parameters and steps per second.
- `multi30k`: configs/multi30k.py within a training budget of --minutes (evaluation not counted),
  the last --average checkpoints averaged; test_2016_flickr scored for the average (both beam
  styles) and the last checkpoint; the dev BLEU curve (PNG beside the workdir's records).
- `multi30k_best`: configs/multi30k_tiny.py (Wu et al. 2021's transformer_tiny recipe) within
  --minutes (120 unless given) or its 8,000 updates, the last --average (10 unless given)
  averaged; test_2016_flickr by the Multi30k papers' protocol (lowercased, normalized,
  Moses-tokenized BLEU4), sacreBLEU and chrF, for the average and the last checkpoint, beside Wu et
  al.'s 41.02; the curve of the protocol's dev BLEU. Ablations: --set=FIELD=VALUE --minutes=30
  --workdir=... --record=multi30k_best_<what>.
- `multi30k_seeds`: one Multi30k run per --seeds, each --minutes, with an EMA of the parameters and
  the best dev checkpoint kept; each seed's last, EMA, best and averaged parameters scored, then the
  seeds' ensembles (--ensemble) of their last checkpoints and of their averages.
- `multi30k_multilingual`: configs/multi30k_multilingual.py (en from and into de, fr, cs) for
  --minutes, its last --average checkpoints averaged and scored in every direction and zero-shot
  (de-fr, fr-de, with off-target rates); beside it a bilingual en-fr run of the same minutes
  (configs/multi30k.py into French), and the bilingual en-de record (`multi30k`) if there is one;
  then `--mode=translate --target_lang=X` of the English test set into each language, with the
  off-target rate of what comes out and of the references.
- `multi30k_constraints`: configs/multi30k.py (en-de) trained for --minutes (the workdir of
  `multi30k` at the same minutes: resumed, not trained again), its last --average averaged; the
  standard protocol for terminology constraints: for each test sentence 1-3 words of its reference
  that the unconstrained beam's output lacks (seeded, --terms_seed). Test BLEU and chrF without
  and with them (--mode=eval [--constraints]), the share of terms that appear, and the time of
  --mode=translate of the sentences with terms, constrained, against the same sentences without
  their terms, each at the beam its terms widened the search to (one run per beam); twice, in
  turns: the second round's programs come from the compilation cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import experiments_finetune as finetune
import experiments_multi30k as multi30k_runs
from absl import app, flags

from flaxformer_nmt.benchmarking import record

_EXPERIMENT = flags.DEFINE_enum(
  "experiment",
  None,
  [
    "demo",
    "demo_precisions",
    "fine_tune_demo",
    "finetune_imported",
    "fine_tune_lora",
    "multi30k",
    "multi30k_best",
    "multi30k_seeds",
    "multi30k_multilingual",
    "multi30k_constraints",
  ],
  "What to run.",
)

EXPERIMENTS: dict[str, Callable[[], dict[str, Any]]] = {
  "demo": finetune.demo,
  "demo_precisions": finetune.demo_precisions,
  "fine_tune_demo": finetune.fine_tune_demo,
  "finetune_imported": finetune.finetune_imported,
  "fine_tune_lora": finetune.fine_tune_lora,
  "multi30k": multi30k_runs.multi30k,
  "multi30k_best": multi30k_runs.multi30k_best,
  "multi30k_seeds": multi30k_runs.multi30k_seeds,
  "multi30k_multilingual": multi30k_runs.multi30k_multilingual,
  "multi30k_constraints": multi30k_runs.multi30k_constraints,
}


def main(argv: list[str]) -> None:
  del argv
  if not _EXPERIMENT.value:
    raise app.UsageError(f"--experiment: choose one of {sorted(EXPERIMENTS)}.")
  if not record.RECORD.value:
    flags.FLAGS.record = _EXPERIMENT.value
  start = time.perf_counter()
  result = {"experiment": _EXPERIMENT.value, **EXPERIMENTS[_EXPERIMENT.value]()}
  result["experiment_minutes"] = round((time.perf_counter() - start) / 60, 1)
  record.report(result)


if __name__ == "__main__":
  app.run(main)
