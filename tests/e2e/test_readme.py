"""Every command of the README and of docs/*.md runs, as written, in order, in a scratch folder.

`tests/readme.py` splits the pages into commands and each into a chain (commands sharing a
folder: the quick start trains `runs/demo`, which the next sections average, evaluate, export ...).
Each chain is one test; its `--mode=prepare` commands run first (the data the others read, as a
user prepares it before running the results table's commands). What changes from a user's
machine, and nothing else:

- size: `main.py`, the `flaxformer-nmt` command and the benchmark scripts in the scratch folder
  are stand-ins that run the real ones with small overrides appended (model size, vocabulary,
  steps), and WMT14's TFDS configs read a mock WMT14 (`tests/mock_wmt14_main.py`);
  `benchmarks/memory.py`'s TPU target is compiled for the host (no libtpu here);
- Multi30k is downloaded from a server on 127.0.0.1 serving the real files beside the checkout
  (`--config.data.url` appended), and absolute workdirs (`/shared/runs/big`) are placed inside the
  scratch folder;
- `srun` and `gcloud` are stand-ins that start 2 processes x 4 CPU devices on this machine (SLURM's
  variables; for TPU metadata, JAX's coordinator variables); `sacrebleu -t wmt14` reads a small
  newstest2014 from a local cache instead of downloading;
- `pip install` lines run with `--dry-run` (resolving every extra, installing nothing); the test
  command of the quick start is `.ci/run`'s, which runs it verbatim.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys

import pytest
import readme_checks

import helpers
import http_server
import readme
import readme_sandbox
from readme_sandbox import run_chain


def readme_run(test):
  """A test of README commands: left out of a plain run (pyproject's addopts), run by .ci/run."""
  return pytest.mark.readme(test)


REPO = helpers.REPO


_RECIPE = ["--config.num_train_steps=50", "--config.checkpoint_every_steps=10"]


_SHORT = ["--config.num_train_steps=20", "--config.checkpoint_every_steps=4"]


_BENCHMARKS = {
  # --target=host: the docs' TPU estimates need libtpu, which the tests' machines lack.
  "train_step": ["--size=tiny", "--vocab_size=300", "--max_len=32", "--tokens_per_step=512"]
  + ["--steps=1", "--peak_n=256", "--target=host"],
  "decode": ["--size=tiny", "--vocab_size=300", "--batch_size=4", "--src_len=8"]
  + ["--max_len_offset=4", "--repeats=1", "--target=host"],
  "memory": ["--sizes=tiny", "--dtypes=float32", "--tokens_per_device=512", "--max_len=64"]
  + ["--vocab_size=300", "--target=host"],
  "estimate_variants": ["--size=tiny", "--vocab_size=300", "--max_len=32", "--tokens_per_step=512"]
  + ["--steps=1", "--peak_n=256", "--target=host"],
  "recipe_cost": ["--notpu_estimate"],
  "input_pipeline": ["--num_batches=3", "--tokens_per_batch=2048", "--max_len=32"]
  + ["--vocab_size=300"],
  # Two small files, one of them compiling JAX programs (its compile profile is checked).
  "test_times": [
    "--tiers=unit",
    "--paths=tests/unit/test_junit_summary.py,tests/unit/test_averaging.py",
  ],
  # The server against translate on 16 demo lines, 1 and 2 clients, small batches and buckets.
  "serve": ["--num_lines=16", "--clients=1,2", "--latency_lines=2"]
  + ["--set=decode.batch_size=4", "--set=data.max_len=24"],
}


@readme_run
def test_install_commands_resolve_and_ci_runs_the_test_command(tmp_path):
  """`.ci/run` takes the quick start's test command verbatim; every `pip install` line resolves
  (with --dry-run: what it would install, nothing installed)."""
  ci = (REPO / ".ci" / "run").read_text()
  extract = re.search(r"<<'PY'\n(.*?)\nPY\n", ci, re.S).group(1)
  ci_cmd = subprocess.run(
    [sys.executable, "-c", extract], cwd=REPO, capture_output=True, text=True, check=True
  ).stdout.strip()
  compat = (REPO / "tools" / "compat.sh").read_text()  # .ci/run's last lines: colab, newest
  assert all(f"bash tools/compat.sh {leg}" in ci for leg in ("colab", "newest"))
  for command in readme.in_chain("ci"):
    text = command.text.replace(' -m "not slow"', "")  # leaves out tests of what CI runs whole
    ran = text == ci_cmd or any(text in t for t in (ci, compat))
    assert ran, f".ci/run does not run {command.text}"
  assert ci_cmd in [c.text for c in readme.in_chain("ci")]
  installs = {
    part.split("#")[0].strip()
    for c in readme.commands()
    if c.kind == "bash"
    for part in c.text.split("&&")
    if part.strip().startswith("pip install")
  }
  extras = {'pip install -e ".[prepare]"', 'pip install -e ".[export]"', "pip install -e ."}
  extras |= {'pip install -e ".[cuda12]"', 'pip install -e ".[tpu]"', "pip install ."}
  assert extras <= installs
  for i, install in enumerate(sorted(installs)):
    report = tmp_path / f"report{i}.json"
    argv = shlex.split(install)[2:]
    proc = subprocess.run(
      [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", f"--report={report}", *argv],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert proc.returncode == 0, f"{install}:\n{proc.stderr[-3000:]}"
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "flaxformer_nmt" in names or "flaxformer-nmt" in names, (install, names)
    if "prepare" in install:
      assert "tensorflow" in names or _installed("tensorflow"), names


def _installed(name: str) -> bool:
  import importlib.util  # pylint: disable=g-import-not-at-top

  return importlib.util.find_spec(name) is not None


def _check_demo_command(command, proc, box, trained: list[dict]) -> None:
  """The checks of one command of the demo's chains (the README's, docs/decoding.md's and
  docs/fine-tuning.md's)."""
  work = box.repo / "runs" / "demo"
  if readme_checks.research_decoding(command.text, proc, box):
    return  # docs/decoding.md's commands, checked there
  if "--checkpoint=best" in command.text:  # docs/fine-tuning.md: the fine-tuned run's best
    result = readme_checks.last_json(proc)
    assert result["checkpoint"].startswith("best params (")
    readme_checks.rescored(box, command.text, result, "beam4")
  elif "--mode=eval" in command.text:
    result = readme_checks.last_json(proc)
    if "--config.data.source=files" not in command.text:
      assert result["checkpoint"].startswith("averaged params of 3 checkpoints")
    readme_checks.rescored(box, command.text, result, "beam4")
  elif "--mode=translate" in command.text and "--output=out.txt" not in command.text:
    assert proc.stdout.count("\n") == 1  # one line in, one out (30 steps: maybe empty)
  elif "--output=out.txt" in command.text:
    assert len((box.repo / "out.txt").read_text().splitlines()) == 2
  elif "--mode=attention" in command.text:
    assert (work / "attention" / "cross_attention.png").stat().st_size > 0
  elif "--mode=export" in command.text:
    out = re.search(r"--output=(\S+)", command.text).group(1)
    if "--format=peft" in command.text:  # docs/fine-tuning.md: the LoRA run's adapters
      assert json.loads((box.repo / out / "adapter_config.json").read_text())["r"] == 8
      assert (box.repo / out / "adapter_model.safetensors").is_file()
    elif "--format=huggingface" in command.text:  # docs/pretrained.md
      assert (box.repo / out / "model.safetensors").is_file()
      assert (box.repo / out / "README.md").is_file()
    else:
      assert (box.repo / out / "model.bin").is_file()
  elif "--mode=import" in command.text:
    result = readme_checks.last_json(proc)
    assert result["mode"] == "import" and result["target_languages"] == ["de"]
  elif command.kind == "python":
    printed = ast.literal_eval(proc.stdout.strip().splitlines()[-1])  # a list of strings
    assert len(printed) == 2 and all(isinstance(t, str) and t for t in printed)
  elif "--mode" not in command.text and ("main.py" in command.text or "nmt --" in command.text):
    result = readme_checks.last_json(proc)
    assert result["step"] == 30 and "test_sacrebleu_beam4" in result
    if "--config.optim.lora_rank" in command.text:  # docs/fine-tuning.md's LoRA run
      assert 0 < result["trained_parameters"] < result["parameters"] / 10
      assert result["best_step"] == 30
    elif "--config.best_metric=dev_bleu" in command.text:  # docs/fine-tuning.md's run
      assert result["best_step"] == 30 and "ema_dev_bleu" in result
      assert result["best_parameters"] in ("params", "ema")
    if "--workdir=runs/demo " in command.text + " ":
      # The quick start's command on the results table's finished runs/demo: the same figures,
      # read back from the workdir, with nothing trained or decoded again.
      trained.append(result)
      assert result == trained[0]
      assert ("already trained to step 30" in proc.stderr) == (len(trained) > 1)


@readme_run
def test_demo_chain(tmp_path):
  """Quick start, using a trained model, translating and exporting, the demo's results."""
  seen, trained = [], []
  for command, proc, box in run_chain("demo", tmp_path, {"demo": readme.DEMO}):
    seen.append(command.text)
    _check_demo_command(command, proc, box, trained)
  assert len(seen) >= 10
  assert "flaxformer-nmt --config=demo --workdir=runs/demo" in seen  # the quick start's
  assert len(trained) == 2


@readme_run
@pytest.mark.parametrize("chain", ["decoding", "fine-tuning", "pretrained"])
def test_docs_demo_chain(chain, tmp_path):
  """docs/decoding.md (n-best, sampling, ensembles, alignments, back-translation),
  docs/fine-tuning.md (a shifted domain) and docs/pretrained.md (export, import, translate and
  fine-tune the import), each from the quick start's trained runs/demo."""
  seen, trained = [], []
  start = readme.quick_start_training()
  for command, proc, box in run_chain(chain, tmp_path, {"demo": readme.DEMO}, first=[start]):
    seen.append(command.text)
    _check_demo_command(command, proc, box, trained)
  least = {"decoding": 10, "fine-tuning": 5, "pretrained": 5}[chain]
  assert seen[0] == start.text and len(seen) >= least


@readme_run
def test_wmt14_chain(tmp_path):
  """Table 2's recipe on the mock WMT14 (prepare, train, average, eval), the override example and
  the filtered newstest2014 through sacreBLEU's echo and the `:files` variant."""
  overrides = {"wmt14": readme.SMALL_MODEL + _RECIPE}
  pairs = readme_sandbox.fake_sacrebleu_wmt14(tmp_path / "sacrebleu", lines=30)
  evals = 0
  for command, proc, box in run_chain("wmt14", tmp_path, overrides):
    text = command.text
    if "--mode=prepare" in text:
      prepared = readme_checks.last_json(proc)
      assert (prepared["dev_set"], prepared["test_set"]) == ("newstest2013", "newstest2014")
      assert (prepared["dev_sentences"], prepared["test_sentences"]) == (32, 48)
    elif "--echo src" in text:
      written = (box.repo / "wmt14_text" / "newstest2014-filtered.en").read_text().splitlines()
      assert written == [p[0] for p in pairs]
    elif "--mode=eval" in text and ":files" not in text:
      result = readme_checks.last_json(proc)
      assert result["test_set"] == "newstest2014" and result["test_sentences"] == 48
      assert result["checkpoint"].startswith("averaged params of 5 checkpoints")
      assert result["beam_style"] == "t2t"
      assert result["tokenized_bleu_method"] == "moses-de+##AT##"
      assert 5.0 < result["test_sacrebleu_beam4"] < 90.0  # 50 steps: the frames, not the numbers
      assert "newstest2014 (test), beam4: sacreBLEU" in proc.stderr
      evals += 1
    elif "--mode=eval" in text:
      result = readme_checks.last_json(proc)
      assert result["test_set"] == "newstest2014-filtered" and result["test_sentences"] == 30
      evals += 1
    elif "main.py" in text and "--mode" not in text:
      assert readme_checks.last_json(proc)["step"] == 50
  assert evals == 2


@readme_run
def test_files_chain(tmp_path):
  """Multi30k's download (from 127.0.0.1) and training, your own files (Multi30k's), the Multi30k
  script and its results rows, the input pipeline benchmark on the same files."""
  server = http_server.Server(helpers.multi30k())
  small = readme.SMALL_MODEL + _SHORT
  overrides = {
    "files": small,
    "wmt14": small,
    "multi30k": [*small, f"--config.data.url={server.url}"],
    # Three directions and one zero-shot, of the six and two: each is a test set to decode.
    "multi30k_multilingual": [*small, f"--config.data.url={server.url}"]
    + ["--config.data.directions=en-de,de-en,en-fr", "--config.data.zero_shot=de-fr"],
  }
  overrides.update(_BENCHMARKS)
  # 20 steps keep 5 checkpoints; multi30k_best averages 10 unless told (the others' default is 5).
  overrides["experiments"] = ["--average=5"]
  ran_script = prepared = False
  try:
    for command, proc, box in run_chain("files", tmp_path, overrides):
      if "--mode=prepare" in command.text and "multilingual" in command.text:
        # After the bilingual prepare: French is new (the overrides keep three directions: en,
        # de and fr).
        result = readme_checks.last_json(proc)
        assert result["downloaded"] == 3 and result["verified_present"] == 6
        assert result["dev_sentences"] == {"en-de": 1014, "de-en": 1014, "en-fr": 1014}
        assert result["test_sentences"]["de-fr"] == 1000
      elif "--mode=prepare" in command.text:
        result = readme_checks.last_json(proc)
        assert (result["downloaded"], result["dev_sentences"]) == (6, 1014)
        assert len(list((box.repo / "data" / "multi30k").iterdir())) == 6
        prepared = True
      elif "--experiment=multi30k_multilingual" in command.text:
        last = readme_checks.last_json(proc)
        record = json.loads(
          (box.repo / "benchmarks/results/multi30k_multilingual.json").read_text()
        )
        assert record["result"] == last
        multi = last["multilingual"]
        assert multi["step"] == 20 and sorted(multi["directions"]) == ["de-en", "en-de", "en-fr"]
        assert list(multi["zero_shot"]) == ["de-fr"] and last["bilingual_en_fr"]["step"] == 20
        assert sorted(last["target_lang_translate"]) == ["de", "fr", "source"]
      elif "--target_lang" in command.text:
        assert len(proc.stdout.strip().splitlines()) == 5  # five German captions, in French
      elif "--experiment=multi30k_seeds" in command.text:
        last = readme_checks.last_json(proc)
        record = json.loads((box.repo / "benchmarks/results/multi30k_seeds.json").read_text())
        assert record["result"] == last
        assert [run["step"] for run in last["seeds"].values()] == [20, 20]
        assert "test_sacrebleu_beam4" in last["ensemble_averaged"]
      elif "--experiment=multi30k_constraints" in command.text:
        last = readme_checks.last_json(proc)
        record = json.loads((box.repo / "benchmarks/results/multi30k_constraints.json").read_text())
        assert record["result"] == last and last["step"] == 20
        # Even a 20-step model meets every term: the search guarantees them, not the model.
        assert last["terms"]["met"]["term_rate"] == 1.0 and last["terms"]["terms"] > 0
        assert last["timing"]["ratio"] > 0 and last["with_terms"]["test_sentences"] == 1000
      elif "--experiment=multi30k_best" in command.text:
        last = readme_checks.last_json(proc)
        record = json.loads((box.repo / "benchmarks/results/multi30k_best.json").read_text())
        assert record["result"] == last and last["workdir"] == "runs/multi30k_tiny_120m"
        assert last["step"] == 20 and len(last["averaged_steps"]) == 5
        assert "test_multi30k_bleu_beam5" in last["averaged"]
        assert last["curve"] and (box.repo / last["workdir"] / "learning_curve.png").is_file()
      elif "--experiment=multi30k" in command.text:
        work = box.repo / "runs" / "multi30k_60m"  # the script's default: runs/ did not exist
        last = readme_checks.last_json(proc)
        record = json.loads((box.repo / "benchmarks/results/multi30k.json").read_text())
        assert record["result"] == last and record["machine"]["cores"]
        assert last["step"] == 20 and len(last["averaged_steps"]) == 5
        assert (work / "learning_curve.png").stat().st_size > 0
        ran_script = True
      elif "--mode=eval" in command.text:
        assert ran_script
        assert readme_checks.last_json(proc)["test_sentences"] == 1000
      else:
        readme_checks.last_json(proc)  # training results, the benchmark's JSON
  finally:
    server.close()
  assert ran_script and prepared and len(server.requests) == 9


@readme_run
def test_benchmark_commands(tmp_path):
  """The benchmark scripts, the demo experiments made small, and the server benchmark on the
  demo model they trained."""
  overrides = {**_BENCHMARKS, "demo": readme.DEMO}
  ran_precisions = ran_test_times = False
  for command, proc, box in run_chain("benchmarks", tmp_path, overrides):
    result = readme_checks.last_json(proc)
    assert result, command.text
    if "--experiment=demo_precisions" in command.text:  # the results table's demo per dtype
      record = json.loads((box.repo / "benchmarks/results/demo_precisions.json").read_text())
      assert record["result"] == result
      for dtype, run in result["runs"].items():
        saved = json.loads((box.repo / f"runs/demo_{dtype}/config.json").read_text())
        assert saved["model"]["dtype"] == dtype and run["steps_per_s"] > 0
      assert result["runs"]["float16"]["loss_scale_first"] == 2.0**15
      ran_precisions = True
    if "benchmarks/test_times.py" in command.text:  # JAX's compile events, from both workers
      cold, warm = result["unit"]["cold"]["jax"], result["unit"]["warm"]["jax"]
      assert cold["files"]["tests/unit/test_averaging.py"]["programs"] > 0, cold
      assert cold["total"]["cache_misses"] > 0 and warm["total"]["cache_hits"] > 0, warm
      ran_test_times = True
    if "benchmarks/serve.py" in command.text:
      assert all(c["answers_equal_translate"] for c in result["clients"].values()), result
      assert result["server_exit_status"] == 0
  assert ran_precisions and ran_test_times


@readme_run
def test_python_api_block(tmp_path):
  """The README's API example, with `api.load_config` given the demo's small overrides."""
  small = {
    flag.split("=")[0][len("--config.") :]: ast.literal_eval(flag.split("=")[1])
    for flag in readme.DEMO
  }
  box = readme_sandbox.Sandbox(tmp_path, {})
  (command,) = readme.in_chain("api")
  prelude = (
    "from flaxformer_nmt import api as _api\n"
    "_load = _api.load_config\n"
    "_api.load_config = lambda name, overrides=None: "
    f"_load(name, {{**(overrides or {{}}), **{small!r}}})\n"
  )
  proc = box.run(readme.Command(prelude + command.text, "python", command.section))
  assert "test_sacrebleu_beam4" in proc.stdout and "cross_attention.png" in proc.stdout
  assert (box.repo / "ct2_model_api" / "model.bin").is_file()
