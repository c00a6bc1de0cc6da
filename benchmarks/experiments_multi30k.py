"""benchmarks/experiments.py's Multi30k experiments: the one-hour recipe, the papers' best
small Transformer (multi30k_best), seeds and ensembles, many languages, terminology constraints."""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys
from typing import Any

from absl import flags
from experiment_common import (
  AVERAGE,
  DATA_DIR,
  EMA,
  MINUTES,
  SEEDS,
  TERMS_SEED,
  WORKDIR,
  checkout,
  main_py,
  read_lines,
  run_figures,
  scores,
  signatures,
  write_file,
)


def _multi30k_args(workdir: str, *more: str) -> list[str]:
  return [
    "--config=configs/multi30k.py",
    f"--workdir={workdir}",
    f"--config.data.dir={DATA_DIR.value}",
    *more,
  ]


def _train_for_minutes(args: list[str]) -> dict[str, Any]:
  budget = [f"--config.max_train_minutes={MINUTES.value:g}", "--config.num_train_steps=10000000"]
  return main_py(*args, *budget)


def multi30k() -> dict[str, Any]:
  workdir = WORKDIR.value or f"runs/multi30k_{MINUTES.value:g}m"
  args = _multi30k_args(workdir)
  trained = _train_for_minutes(args)
  average = main_py(*args, "--mode=average", f"--num_checkpoints={AVERAGE.value}")
  averaged = main_py(*args, "--mode=eval", "--checkpoint=averaged")
  averaged_t2t = main_py(
    *args, "--mode=eval", "--checkpoint=averaged", "--config.decode.beam_style=t2t"
  )
  last = main_py(*args, "--mode=eval", "--checkpoint=latest")
  curve = _curve(workdir, f"Multi30k EN-DE, {MINUTES.value:g} min")
  return {
    "workdir": workdir,
    "budget_minutes": MINUTES.value,
    **run_figures(trained),
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
    cwd=checkout(),
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
  minutes = MINUTES.value if flags.FLAGS["minutes"].present else 120.0
  average_k = AVERAGE.value if flags.FLAGS["average"].present else 10
  workdir = WORKDIR.value or f"runs/multi30k_tiny_{minutes:g}m"
  args = [
    "--config=configs/multi30k_tiny.py",
    f"--workdir={workdir}",
    f"--config.data.dir={DATA_DIR.value}",
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
    **run_figures(trained),
    "averaged_steps": average["steps"],
    "averaged": scores(averaged),
    "last": scores(last),
    **signatures(averaged),
    "curve": curve,
  }


def multi30k_seeds() -> dict[str, Any]:
  base = WORKDIR.value or f"runs/multi30k_{MINUTES.value:g}m_seed"
  workdirs = [f"{base}{seed}" for seed in SEEDS.value]
  shared = [f"--config.optim.ema_decay={EMA.value:g}", "--config.best_metric=dev_bleu"]
  # One vocabulary for all (an ensemble's members must share it): the first run's.
  vocabulary = f"--config.data.vocab_path={workdirs[0]}/spm.model"
  out: dict[str, Any] = {"budget_minutes": MINUTES.value, "ema_decay": EMA.value, "seeds": {}}
  for i, (seed, workdir) in enumerate(zip(SEEDS.value, workdirs, strict=True)):
    args = _multi30k_args(workdir, *shared, f"--config.seed={seed}", *([vocabulary] if i else []))
    trained = _train_for_minutes(args)
    main_py(*args, "--mode=average", f"--num_checkpoints={AVERAGE.value}")
    run = {"workdir": workdir, **run_figures(trained)}
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
  average = main_py(*args, "--mode=average", f"--num_checkpoints={AVERAGE.value}")
  evaluated = main_py(*args, "--mode=eval", "--checkpoint=averaged")
  return {"run": run_figures(trained), "averaged_steps": average["steps"], "eval": evaluated}


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

  minutes = f"{MINUTES.value:g}m"
  workdir = WORKDIR.value or f"runs/multi30k_multilingual_{minutes}"
  args = [
    "--config=configs/multi30k_multilingual.py",
    f"--workdir={workdir}",
    f"--config.data.dir={DATA_DIR.value}",
  ]
  multi = _averaged_scores(args, _train_for_minutes(args))
  fr_args = _multi30k_args(f"runs/multi30k_enfr_{minutes}", "--config.data.tgt_lang=fr")
  fr = _averaged_scores(fr_args, _train_for_minutes(fr_args))
  out: dict[str, Any] = {
    "workdir": workdir,
    "budget_minutes": MINUTES.value,
    "multilingual": {
      **multi["run"],
      "averaged_steps": multi["averaged_steps"],
      "directions": _direction_table(multi["eval"]["directions"]),
      "zero_shot": _direction_table(multi["eval"]["zero_shot"]),
      "mean": multi["eval"]["mean"],
    },
    "bilingual_en_fr": {**fr["run"], "averaged_steps": fr["averaged_steps"], **scores(fr["eval"])},
  }
  de_record = os.path.join(checkout(), "benchmarks", "results", "multi30k.json")
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
  with open(os.path.join(checkout(), workdir, "config.json"), encoding="utf-8") as f:
    data = json.load(f)["data"]
  trained = [d.split("-") for d in data["directions"].split(",")]
  languages = list(dict.fromkeys(lang for pair in trained for lang in pair))
  source = os.path.join(DATA_DIR.value, data["test_prefix"])
  english = read_lines(f"{source}.en")
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
    outputs = read_lines(path)
    picks[target] = {
      "lines": len(outputs),
      "off_target_rate": language_id.off_target_rate(outputs, target, languages),
      "reference_off_target_rate": language_id.off_target_rate(
        read_lines(f"{source}.{target}"), target, languages
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

  workdir = WORKDIR.value or f"runs/multi30k_{MINUTES.value:g}m"
  args = _multi30k_args(workdir)
  trained = _train_for_minutes(args)
  average = main_py(*args, "--mode=average", f"--num_checkpoints={AVERAGE.value}")
  folder = os.path.join(workdir, "constraints")
  os.makedirs(os.path.join(checkout(), folder), exist_ok=True)
  prefix = os.path.join(DATA_DIR.value, "test_2016_flickr")
  source = f"{prefix}.en" if os.path.exists(f"{prefix}.en") else f"{prefix}.en.gz"
  sources, references = read_lines(f"{prefix}.en"), read_lines(f"{prefix}.de")  # .gz read too

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
    return result, read_lines(path)

  # The unconstrained beam's output; the words of each reference it lacks; BLEU without and with.
  _, plain = translate("plain", source)
  terms = reference_terms(references, plain, TERMS_SEED.value)
  terms_path = os.path.join(folder, f"terms_seed{TERMS_SEED.value}.txt")
  write_file(checkout(), "", terms_path, "".join("\t".join(t) + "\n" for t in terms))
  evaluated = main_py(*args, "--mode=eval", "--checkpoint=averaged")
  with_terms = main_py(*args, "--mode=eval", "--checkpoint=averaged", f"--constraints={terms_path}")

  # Time: the sentences with terms, constrained, against the same sentences unconstrained, each
  # at the beam its terms widened it to (constraints.beam_for: one translate run per beam).
  tokenizer = tokenizer_lib.Tokenizer(os.path.join(checkout(), workdir, "spm.model"))
  with open(os.path.join(checkout(), workdir, "config.json"), encoding="utf-8") as f:
    beam = int(json.load(f)["decode"]["beam_size"])
  rows = [i for i, t in enumerate(terms) if t]
  groups: dict[int, list[int]] = {}
  for i in rows:
    pieces = sum(len(tokenizer.encode(t)) for t in terms[i])
    groups.setdefault(constraints.beam_for(pieces, beam), []).append(i)
  write_file(
    checkout(),
    "",
    os.path.join(folder, "timing_src.txt"),
    "".join(sources[i] + "\n" for i in rows),
  )
  timing_terms = os.path.join(folder, "timing_terms.txt")
  write_file(checkout(), "", timing_terms, "".join("\t".join(terms[i]) + "\n" for i in rows))
  for b, lines in groups.items():
    text = "".join(sources[i] + "\n" for i in lines)
    write_file(checkout(), "", os.path.join(folder, f"timing_src_beam{b}.txt"), text)
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
    "budget_minutes": MINUTES.value,
    **run_figures(trained),
    "averaged_steps": average["steps"],
    "test_set": f"{source} ({len(references)} sentences)",
    "terms": {
      "file": terms_path,
      "seed": TERMS_SEED.value,
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
