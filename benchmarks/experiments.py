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

import json
import os
import string
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import precisions
from absl import app, flags, logging

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
_WORKDIR = flags.DEFINE_string("workdir", "", "The (first) run's workdir ('' = runs/<experiment>).")
_SET = flags.DEFINE_multi_string("set", [], "A config override for every command: path=value.")
_DATA_DIR = flags.DEFINE_string("data_dir", "data/multi30k", "Multi30k's files (multi30k*).")
_MINUTES = flags.DEFINE_float("minutes", 60.0, "Training budget per run (multi30k*).")
_AVERAGE = flags.DEFINE_integer("average", 5, "Checkpoints averaged (multi30k*).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "One run per seed (multi30k_seeds).")
_EMA = flags.DEFINE_float("ema_decay", 0.995, "config.optim.ema_decay (multi30k_seeds).")
_SOURCE = flags.DEFINE_string("source", "runs/demo", "The demo run to fine-tune (fine_tune_demo).")
_TERMS_SEED = flags.DEFINE_integer(
  "terms_seed", 0, "Which words are picked (multi30k_constraints)."
)
_FT_STEPS = flags.DEFINE_integer("fine_tune_steps", 200, "Fine-tuning steps (fine_tune_demo).")

# The figures kept from an evaluation's result: every test_* score and nothing about the run.
_SCORE_PREFIX = "test_"


def _checkout() -> str:
  """Where `main.py` is: the current folder if it has one, else this script's checkout."""
  return os.getcwd() if os.path.isfile("main.py") else os.path.dirname(os.path.dirname(__file__))


def main_py(*args: str) -> dict[str, Any]:
  """`python main.py ARGS` (the user's command); its last line's JSON. Fails loudly, with the end
  of the command's log, if the command does."""
  command = [sys.executable, "main.py", *args, *(f"--config.{s}" for s in _SET.value)]
  logging.info("Running: %s", " ".join(command[1:]))
  start = time.perf_counter()
  proc = subprocess.run(command, cwd=_checkout(), capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(command[1:])} failed:\n{proc.stderr[-4000:]}")
  logging.info("... %.0f s.", time.perf_counter() - start)
  return json.loads(proc.stdout.strip().splitlines()[-1])


def scores(result: dict[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in result.items() if k.startswith(_SCORE_PREFIX)}


def signatures(result: dict[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in result.items() if k.endswith("_signature")}


def _trained(result: dict[str, Any]) -> dict[str, Any]:
  """What a training run's result says of the run itself."""
  keep = ("step", "train_minutes", "dev_bleu", "dev_multi30k_bleu", "dev_loss", "preempted")
  keep += ("stopped_early",)
  return {k: result[k] for k in keep if k in result}


def demo() -> dict[str, Any]:
  workdir = _WORKDIR.value or "runs/demo"
  trained = main_py("--config=configs/demo.py", f"--workdir={workdir}")
  return {"workdir": workdir, **_trained(trained), **scores(trained), **signatures(trained)}


def demo_precisions() -> dict[str, Any]:
  root = _WORKDIR.value or "runs/demo"  # runs/demo_float32, runs/demo_bfloat16, ...
  return precisions.demo_precisions(
    main_py, root, lambda trained: {**_trained(trained), **scores(trained)}
  )


def fine_tune_demo() -> dict[str, Any]:
  source, workdir = _SOURCE.value, _WORKDIR.value or "runs/demo_ft"
  demo_args = ["--config=configs/demo.py"]
  shifted = [*demo_args, "--config.data.source=files", "--config.data.dir=data/demo_large"]
  original = [*demo_args, "--config.data.source=demo"]
  main_py(*demo_args, f"--workdir={source}")  # trains the quick start's model, or returns it
  _demo_text("data/demo_large", "--variant=large")
  _demo_text("data/demo_std")
  _concatenate("data/demo_mixed", ("data/demo_large", "data/demo_std"), "data/demo_large")
  tune = [
    f"--config.init_from={source}",
    "--config.optim.schedule=constant",
    "--config.optim.lr_scale=0.1",
    f"--config.num_train_steps={_FT_STEPS.value}",
    "--config.eval_every_steps=50",
    "--config.checkpoint_every_steps=50",
  ]
  mixed_dir = f"{workdir}_mixed"
  mixed = [*demo_args, "--config.data.source=files", "--config.data.dir=data/demo_mixed"]
  trained = main_py(
    *shifted,
    f"--workdir={workdir}",
    *tune,
    "--config.best_metric=dev_bleu",
    "--config.optim.ema_decay=0.99",
  )
  trained_mixed = main_py(*mixed, f"--workdir={mixed_dir}", *tune)

  def score(args: list[str], run: str, which: str) -> dict[str, Any]:
    return scores(main_py(*args, f"--workdir={run}", "--mode=eval", f"--checkpoint={which}"))

  return {
    "source": source,
    "fine_tuned": _trained(trained),
    "mixed": _trained(trained_mixed),
    "before": {
      "shifted": score(shifted, source, "auto"),
      "original": score(original, source, "auto"),
    },
    "best": {
      "shifted": score(shifted, workdir, "best"),
      "original": score(original, workdir, "best"),
    },
    "ema": {"shifted": score(shifted, workdir, "ema"), "original": score(original, workdir, "ema")},
    "mixed_last": {
      "shifted": score(shifted, mixed_dir, "latest"),
      "original": score(original, mixed_dir, "latest"),
    },
  }


def fine_tune_lora() -> dict[str, Any]:
  source, root = _SOURCE.value, _WORKDIR.value or "runs/demo_lora"
  demo_args = ["--config=configs/demo.py"]
  shifted = [*demo_args, "--config.data.source=files", "--config.data.dir=data/demo_large"]
  original = [*demo_args, "--config.data.source=demo"]
  main_py(*demo_args, f"--workdir={source}")  # trains the quick start's model, or returns it
  _demo_text("data/demo_large", "--variant=large")
  tune = [
    f"--config.init_from={source}",
    "--config.optim.schedule=constant",
    f"--config.num_train_steps={_FT_STEPS.value}",
    "--config.eval_every_steps=50",
    "--config.checkpoint_every_steps=50",
    "--config.best_metric=dev_bleu",
  ]
  lora = [
    "--config.optim.lora_rank=8",
    "--config.optim.lora_alpha=16",
    "--config.optim.lora_targets=q,k,v,o",
  ]
  variants = {
    "full": ["--config.optim.lr_scale=0.1"],
    "lora": [*lora, "--config.optim.lr_scale=0.1"],
    "lora_lr10x": [*lora, "--config.optim.lr_scale=1.0"],
  }

  def score(args: list[str], run: str, which: str) -> dict[str, Any]:
    return scores(main_py(*args, f"--workdir={run}", "--mode=eval", f"--checkpoint={which}"))

  out: dict[str, Any] = {
    "source": source,
    "before": {
      "shifted": score(shifted, source, "auto"),
      "original": score(original, source, "auto"),
    },
  }
  for name, extra in variants.items():
    workdir = f"{root}_{name}"
    trained = main_py(*shifted, f"--workdir={workdir}", *tune, *extra)
    out[name] = {
      "workdir": workdir,
      "settings": extra,
      **_trained(trained),
      "parameters": trained["parameters"],
      "trained_parameters": trained["trained_parameters"],
      "steps_per_s": trained["step"] / max(trained["train_minutes"] * 60.0, 1e-9),
      "best": {
        "shifted": score(shifted, workdir, "best"),
        "original": score(original, workdir, "best"),
      },
    }
  return out


def finetune_imported() -> dict[str, Any]:
  source, workdir = _SOURCE.value, _WORKDIR.value or "runs/finetune_imported"
  exported, imported = f"{workdir}_hf", f"{workdir}_imported"
  demo_args = ["--config=configs/demo.py"]
  shifted = ["--config.data.source=files", "--config.data.dir=data/demo_large"]
  original = ["--config.data.source=demo"]  # the run's own config (its model is the import's)
  main_py(*demo_args, f"--workdir={source}")  # trains the quick start's model, or returns it
  _demo_text("data/demo_large", "--variant=large")
  if not os.path.isdir(os.path.join(_checkout(), exported)):
    main_py(f"--workdir={source}", "--mode=export", "--format=huggingface", f"--output={exported}")
  if not os.path.isdir(os.path.join(_checkout(), imported)):
    main_py("--mode=import", f"--input={exported}", f"--workdir={imported}")
  trained = main_py(
    *demo_args,
    *shifted,
    f"--workdir={workdir}",
    f"--config.init_from={imported}",
    "--config.optim.schedule=constant",
    "--config.optim.lr_scale=0.1",
    f"--config.num_train_steps={_FT_STEPS.value}",
    "--config.eval_every_steps=50",
    "--config.checkpoint_every_steps=50",
    "--config.best_metric=dev_bleu",
    "--config.optim.ema_decay=0.99",
  )

  def score(args: list[str], run: str, which: str) -> dict[str, Any]:
    return scores(main_py(*args, f"--workdir={run}", "--mode=eval", f"--checkpoint={which}"))

  return {
    "source": source,
    "imported": imported,
    "fine_tuned": _trained(trained),
    "best": {
      "shifted": score(shifted, workdir, "best"),
      "original": score(original, workdir, "best"),
    },
    "ema": {"shifted": score(shifted, workdir, "ema"), "original": score(original, workdir, "ema")},
  }


def _demo_text(folder: str, *args: str) -> None:
  """`python -m flaxformer_nmt.data.demo_text` (docs/fine-tuning.md's data), unless written."""
  if os.path.isfile(os.path.join(_checkout(), folder, "test.de")):
    return
  command = [sys.executable, "-m", "flaxformer_nmt.data.demo_text", f"--output_dir={folder}"]
  command += ["--train_size=2000", "--eval_size=200", "--mono_size=0", *args]
  subprocess.run(command, cwd=_checkout(), check=True, capture_output=True)


def _concatenate(folder: str, train_from: tuple[str, ...], eval_from: str) -> None:
  """A files corpus of the train files of `train_from` one after another, and `eval_from`'s val
  and test files (docs/fine-tuning.md's mixed fine-tuning set)."""
  root = _checkout()
  os.makedirs(os.path.join(root, folder), exist_ok=True)
  for lang in ("en", "de"):
    text = "".join(_read(root, source, f"train.{lang}") for source in train_from)
    _write(root, folder, f"train.{lang}", text)
    for split in ("val", "test"):
      _write(root, folder, f"{split}.{lang}", _read(root, eval_from, f"{split}.{lang}"))


def _read(root: str, folder: str, name: str) -> str:
  with open(os.path.join(root, folder, name), encoding="utf-8") as f:
    return f.read()


def _write(root: str, folder: str, name: str, text: str) -> None:
  with open(os.path.join(root, folder, name), "w", encoding="utf-8") as f:
    f.write(text)


def _multi30k_args(workdir: str, *more: str) -> list[str]:
  return [
    "--config=configs/multi30k.py",
    f"--workdir={workdir}",
    f"--config.data.dir={_DATA_DIR.value}",
    *more,
  ]


def _train_for_minutes(args: list[str]) -> dict[str, Any]:
  budget = [f"--config.max_train_minutes={_MINUTES.value:g}", "--config.num_train_steps=10000000"]
  return main_py(*args, *budget)


def multi30k() -> dict[str, Any]:
  workdir = _WORKDIR.value or f"runs/multi30k_{_MINUTES.value:g}m"
  args = _multi30k_args(workdir)
  trained = _train_for_minutes(args)
  average = main_py(*args, "--mode=average", f"--num_checkpoints={_AVERAGE.value}")
  averaged = main_py(*args, "--mode=eval", "--checkpoint=averaged")
  averaged_t2t = main_py(
    *args, "--mode=eval", "--checkpoint=averaged", "--config.decode.beam_style=t2t"
  )
  last = main_py(*args, "--mode=eval", "--checkpoint=latest")
  curve = _curve(workdir, f"Multi30k EN-DE, {_MINUTES.value:g} min")
  return {
    "workdir": workdir,
    "budget_minutes": _MINUTES.value,
    **_trained(trained),
    "averaged_steps": average["steps"],
    "averaged": scores(averaged),
    "averaged_t2t": scores(averaged_t2t),
    "last": scores(last),
    **signatures(averaged),
    "curve": curve,
  }


def _curve(workdir: str, title: str, metric: str = "dev_bleu") -> list[Any]:
  """benchmarks/plot_curve.py's points (dev BLEU against minutes), its PNG in the workdir."""
  script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_curve.py")
  proc = subprocess.run(
    [sys.executable, script, f"--workdir={workdir}", f"--title={title}", f"--metric={metric}"],
    cwd=_checkout(),
    capture_output=True,
    text=True,
    check=True,
  )
  return json.loads(proc.stdout.strip().splitlines()[-1])["curve"]


# Wu et al. (ACL 2021), transformer_tiny on Multi30k en-de test2016 (LividWo/Revisit-MMT,
# README-baseline.md): BLEU4 by the Multi30k protocol, and its n-gram precisions.
WU_2021 = {"test2016_bleu4": 41.02, "precisions": [71.0, 47.5, 34.3, 24.5]}


def multi30k_best() -> dict[str, Any]:
  """configs/multi30k_tiny.py (Wu et al. 2021's recipe) within --minutes (120 unless given) or
  its 8,000 updates, the last --average (10 unless given) checkpoints averaged, scored by the
  Multi30k papers' protocol beside sacreBLEU and chrF; the curve is the protocol's dev BLEU."""
  minutes = _MINUTES.value if flags.FLAGS["minutes"].present else 120.0
  average_k = _AVERAGE.value if flags.FLAGS["average"].present else 10
  workdir = _WORKDIR.value or f"runs/multi30k_tiny_{minutes:g}m"
  args = [
    "--config=configs/multi30k_tiny.py",
    f"--workdir={workdir}",
    f"--config.data.dir={_DATA_DIR.value}",
  ]
  trained = main_py(*args, f"--config.max_train_minutes={minutes:g}")
  average = main_py(*args, "--mode=average", f"--num_checkpoints={average_k}")
  averaged = main_py(*args, "--mode=eval", "--checkpoint=averaged")
  last = main_py(*args, "--mode=eval", "--checkpoint=latest")
  curve = _curve(workdir, "Multi30k EN-DE, transformer_tiny recipe", "dev_multi30k_bleu")
  return {
    "workdir": workdir,
    "budget_minutes": minutes,
    "published": {"wu_2021": WU_2021},
    **_trained(trained),
    "averaged_steps": average["steps"],
    "averaged": scores(averaged),
    "last": scores(last),
    **signatures(averaged),
    "curve": curve,
  }


def multi30k_seeds() -> dict[str, Any]:
  base = _WORKDIR.value or f"runs/multi30k_{_MINUTES.value:g}m_seed"
  workdirs = [f"{base}{seed}" for seed in _SEEDS.value]
  shared = [f"--config.optim.ema_decay={_EMA.value:g}", "--config.best_metric=dev_bleu"]
  # One vocabulary for all (an ensemble's members must share it): the first run's.
  vocabulary = f"--config.data.vocab_path={workdirs[0]}/spm.model"
  out: dict[str, Any] = {"budget_minutes": _MINUTES.value, "ema_decay": _EMA.value, "seeds": {}}
  for i, (seed, workdir) in enumerate(zip(_SEEDS.value, workdirs, strict=True)):
    args = _multi30k_args(workdir, *shared, f"--config.seed={seed}", *([vocabulary] if i else []))
    trained = _train_for_minutes(args)
    main_py(*args, "--mode=average", f"--num_checkpoints={_AVERAGE.value}")
    run = {"workdir": workdir, **_trained(trained)}
    for which in ("latest", "ema", "best", "averaged"):
      run[which] = scores(main_py(*args, "--mode=eval", f"--checkpoint={which}"))
    out["seeds"][seed] = run
  args = _multi30k_args(workdirs[0], *shared, f"--ensemble={','.join(workdirs[1:])}")
  for which in ("latest", "averaged"):
    evaluated = main_py(*args, "--mode=eval", f"--checkpoint={which}")
    out[f"ensemble_{which}"] = scores(evaluated)
  return {**out, **signatures(evaluated)}


def _averaged_scores(args: list[str], trained: dict[str, Any]) -> dict[str, Any]:
  """Average the last checkpoints, then evaluate the average: (steps averaged, eval result)."""
  average = main_py(*args, "--mode=average", f"--num_checkpoints={_AVERAGE.value}")
  evaluated = main_py(*args, "--mode=eval", "--checkpoint=averaged")
  return {"run": _trained(trained), "averaged_steps": average["steps"], "eval": evaluated}


def _direction_table(result: dict[str, Any]) -> dict[str, Any]:
  """Each direction's beam figures and off-target rates, from a multilingual eval result."""
  keep = (
    "test_sacrebleu_beam4",
    "test_chrf_beam4",
    "test_tokenized_bleu_beam4",
    "tokenized_bleu_method",
    "off_target_rate_beam4",
    "reference_off_target_rate",
    "test_sacrebleu_greedy",
  )
  return {d: {k: f[k] for k in keep if k in f} for d, f in result.items()}


def multi30k_multilingual() -> dict[str, Any]:
  from flaxformer_nmt.decoding import language_id  # pylint: disable=g-import-not-at-top

  minutes = f"{_MINUTES.value:g}m"
  workdir = _WORKDIR.value or f"runs/multi30k_multilingual_{minutes}"
  args = [
    "--config=configs/multi30k_multilingual.py",
    f"--workdir={workdir}",
    f"--config.data.dir={_DATA_DIR.value}",
  ]
  multi = _averaged_scores(args, _train_for_minutes(args))
  fr_args = _multi30k_args(f"runs/multi30k_enfr_{minutes}", "--config.data.tgt_lang=fr")
  fr = _averaged_scores(fr_args, _train_for_minutes(fr_args))
  out: dict[str, Any] = {
    "workdir": workdir,
    "budget_minutes": _MINUTES.value,
    "multilingual": {
      **multi["run"],
      "averaged_steps": multi["averaged_steps"],
      "directions": _direction_table(multi["eval"]["directions"]),
      "zero_shot": _direction_table(multi["eval"]["zero_shot"]),
      "mean": multi["eval"]["mean"],
    },
    "bilingual_en_fr": {**fr["run"], "averaged_steps": fr["averaged_steps"], **scores(fr["eval"])},
  }
  de_record = os.path.join(_checkout(), "benchmarks", "results", "multi30k.json")
  if os.path.isfile(de_record):
    with open(de_record, encoding="utf-8") as f:
      de = json.load(f).get("result", {})
    out["bilingual_en_de_record"] = {
      "record": "benchmarks/results/multi30k.json",
      "budget_minutes": de.get("budget_minutes"),
      "step": de.get("step"),
      **de.get("averaged", {}),
    }
  # --target_lang on the command line: the English test set into each language it trained.
  with open(os.path.join(_checkout(), workdir, "config.json"), encoding="utf-8") as f:
    data = json.load(f)["data"]
  trained = [d.split("-") for d in data["directions"].split(",")]
  languages = list(dict.fromkeys(lang for pair in trained for lang in pair))
  source = os.path.join(_DATA_DIR.value, data["test_prefix"])
  english = _lines(f"{source}.en")
  picks: dict[str, Any] = {}
  for target in dict.fromkeys(t for s, t in trained if s == "en"):
    path = os.path.join(workdir, f"target_lang_{target}.txt")
    main_py(
      *args,
      "--mode=translate",
      "--checkpoint=averaged",
      f"--target_lang={target}",
      f"--input={source}.en.gz" if not os.path.exists(f"{source}.en") else f"--input={source}.en",
      f"--output={path}",
    )
    outputs = _lines(path)
    picks[target] = {
      "lines": len(outputs),
      "off_target_rate": language_id.off_target_rate(outputs, target, languages),
      "reference_off_target_rate": language_id.off_target_rate(
        _lines(f"{source}.{target}"), target, languages
      ),
    }
  out["target_lang_translate"] = {"source": f"{source}.en ({len(english)} lines)", **picks}
  return {**out, **signatures(multi["eval"]["directions"]["en-de"])}


# What is stripped from a reference word before it is a term: punctuation, German quotes.
_STRIP = string.punctuation + "„“”‚‘’«»…"


def reference_terms(references: list[str], outputs: list[str], seed: int) -> list[list[str]]:
  """The standard protocol's terms: per sentence 1-3 (uniformly) distinct words of its reference
  that are no substring of the unconstrained output, in the reference's order; none where every
  word is there already."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  out = []
  for reference, output in zip(references, outputs, strict=True):
    words = [w.strip(_STRIP) for w in reference.split()]
    missing = list(dict.fromkeys(w for w in words if w and w not in output))
    k = min(int(rng.integers(1, 4)), len(missing))
    picked = sorted(rng.choice(len(missing), size=k, replace=False)) if k else []
    out.append([missing[i] for i in picked])
  return out


def multi30k_constraints() -> dict[str, Any]:
  from flaxformer_nmt.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.decoding import constraints  # pylint: disable=g-import-not-at-top

  workdir = _WORKDIR.value or f"runs/multi30k_{_MINUTES.value:g}m"
  args = _multi30k_args(workdir)
  trained = _train_for_minutes(args)
  average = main_py(*args, "--mode=average", f"--num_checkpoints={_AVERAGE.value}")
  folder = os.path.join(workdir, "constraints")
  os.makedirs(os.path.join(_checkout(), folder), exist_ok=True)
  prefix = os.path.join(_DATA_DIR.value, "test_2016_flickr")
  source = f"{prefix}.en" if os.path.exists(f"{prefix}.en") else f"{prefix}.en.gz"
  sources, references = _lines(f"{prefix}.en"), _lines(f"{prefix}.de")  # .gz read too

  def translate(name: str, src: str, *more: str) -> tuple[dict[str, Any], list[str]]:
    path = os.path.join(folder, f"{name}.txt")
    result = main_py(
      *args,
      "--mode=translate",
      "--checkpoint=averaged",
      f"--input={src}",
      f"--output={path}",
      *more,
    )
    return result, _lines(path)

  # The unconstrained beam's output; the words of each reference it lacks; BLEU without and with.
  _, plain = translate("plain", source)
  terms = reference_terms(references, plain, _TERMS_SEED.value)
  terms_path = os.path.join(folder, f"terms_seed{_TERMS_SEED.value}.txt")
  _write(_checkout(), "", terms_path, "".join("\t".join(t) + "\n" for t in terms))
  evaluated = main_py(*args, "--mode=eval", "--checkpoint=averaged")
  with_terms = main_py(*args, "--mode=eval", "--checkpoint=averaged", f"--constraints={terms_path}")

  # Time: the sentences with terms, constrained, against the same sentences unconstrained, each
  # at the beam its terms widened it to (constraints.beam_for: one translate run per beam).
  tokenizer = tokenizer_lib.Tokenizer(os.path.join(_checkout(), workdir, "spm.model"))
  with open(os.path.join(_checkout(), workdir, "config.json"), encoding="utf-8") as f:
    beam = int(json.load(f)["decode"]["beam_size"])
  rows = [i for i, t in enumerate(terms) if t]
  groups: dict[int, list[int]] = {}
  for i in rows:
    pieces = sum(len(tokenizer.encode(t)) for t in terms[i])
    groups.setdefault(constraints.beam_for(pieces, beam), []).append(i)
  _write(
    _checkout(),
    "",
    os.path.join(folder, "timing_src.txt"),
    "".join(sources[i] + "\n" for i in rows),
  )
  timing_terms = os.path.join(folder, "timing_terms.txt")
  _write(_checkout(), "", timing_terms, "".join("\t".join(terms[i]) + "\n" for i in rows))
  for b, lines in groups.items():
    text = "".join(sources[i] + "\n" for i in lines)
    _write(_checkout(), "", os.path.join(folder, f"timing_src_beam{b}.txt"), text)
  rounds, by_beam = [], {}
  for _ in range(2):  # the second round's programs come from the compilation cache
    plain_seconds = 0.0
    for b in sorted(groups):
      src = os.path.join(folder, f"timing_src_beam{b}.txt")
      result, _ = translate(f"timing_plain_beam{b}", src, f"--config.decode.beam_size={b}")
      plain_seconds += result["seconds"]
    result, _ = translate(
      "timing_constrained", os.path.join(folder, "timing_src.txt"), f"--constraints={timing_terms}"
    )
    by_beam = result["constraints"]["lines_by_beam"]
    rounds.append({"plain": plain_seconds, "constrained": result["seconds"]})
  if by_beam != {str(b): len(lines) for b, lines in sorted(groups.items())}:
    raise RuntimeError(f"The translator's beams {by_beam} are not the groups timed: {groups}")
  given = [t for row in terms for t in row]
  return {
    "workdir": workdir,
    "budget_minutes": _MINUTES.value,
    **_trained(trained),
    "averaged_steps": average["steps"],
    "test_set": f"{source} ({len(references)} sentences)",
    "terms": {
      "file": terms_path,
      "seed": _TERMS_SEED.value,
      "sentences_with_terms": len(rows),
      "terms": len(given),
      "terms_per_sentence": {str(k): sum(1 for t in terms if len(t) == k) for k in range(4)},
      "met": with_terms["constraints"],
    },
    "without": scores(evaluated),
    "with_terms": scores(with_terms),
    "timing": {
      "sentences": len(rows),
      "lines_by_beam": by_beam,
      "translate_seconds": rounds,
      "ratio": rounds[-1]["constrained"] / rounds[-1]["plain"],
    },
    **signatures(evaluated),
  }


def _lines(path: str) -> list[str]:
  """A text file's lines (or its .gz's), relative to the checkout."""
  import gzip  # pylint: disable=g-import-not-at-top

  full = os.path.join(_checkout(), path)
  if not os.path.exists(full) and os.path.exists(full + ".gz"):
    with gzip.open(full + ".gz", "rt", encoding="utf-8") as f:
      return f.read().splitlines()
  with open(full, encoding="utf-8") as f:
    return f.read().splitlines()


EXPERIMENTS: dict[str, Callable[[], dict[str, Any]]] = {
  "demo": demo,
  "demo_precisions": demo_precisions,
  "fine_tune_demo": fine_tune_demo,
  "finetune_imported": finetune_imported,
  "fine_tune_lora": fine_tune_lora,
  "multi30k": multi30k,
  "multi30k_best": multi30k_best,
  "multi30k_seeds": multi30k_seeds,
  "multi30k_multilingual": multi30k_multilingual,
  "multi30k_constraints": multi30k_constraints,
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
