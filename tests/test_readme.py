"""Every command of the README runs, as written, in README order, in a scratch folder.

`tests/readme.py` splits the README into commands and each into a chain (commands sharing a
folder: the quick start trains `runs/demo`, which the next sections average, evaluate, export ...).
Each chain is one test. What changes from a user's machine, and nothing else:

- size: `main.py` and the benchmark scripts in the scratch folder are stand-ins that run the real
  ones with small overrides appended (model size, vocabulary, steps), and WMT14's TFDS configs
  read a mock WMT14 (`tests/mock_wmt14_main.py`); `benchmarks/memory.py`'s TPU target is compiled
  for the host (no libtpu here);
- `../shared/data/multi30k` is a small corpus under Multi30k's file names (the demo's sentences),
  and absolute workdirs (`/shared/runs/big`) are placed inside the scratch folder;
- `srun` and `gcloud` are stand-ins that start 2 processes x 4 CPU devices on this machine (SLURM's
  variables; for TPU metadata, JAX's coordinator variables); `sacrebleu -t wmt14` reads a small
  newstest2014 from a local cache instead of downloading;
- `pip install` lines run with `--dry-run` (resolving every extra, installing nothing); the test
  command of the quick start is `.ci/run`'s, which runs it verbatim.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

import helpers
import readme
from cluster import free_port


def readme_run(test):
  """A test that runs README commands: left out of a plain `pytest` run (pyproject's addopts);
  `.ci/run` runs them with `-m readme`, as the README's "Developing" says."""
  return pytest.mark.slow(pytest.mark.readme(test))


REPO = helpers.REPO
_TIMEOUT = 600

# Appended to every main.py command of a chain, by the config it names.
_DEMO = [
  "--config.num_train_steps=30",
  "--config.checkpoint_every_steps=10",
  "--config.eval_every_steps=30",
  "--config.log_every_steps=10",
  "--config.data.demo_train_size=2000",
  "--config.data.demo_dev_size=20",
  "--config.data.demo_test_size=20",
  "--config.eval.dev_bleu_sentences=10",
  "--config.decode.max_len_offset=8",  # an untrained model stops at the length limit
]
_SMALL_MODEL = helpers.SMALL_MODEL_FLAGS + ["--config.decode.max_len_offset=8"]
# 50 steps with a checkpoint every 10: five to average (enough to learn the frames of the mock
# WMT14's sentences); 20 and every 4 where BLEU is not looked at.
_RECIPE = ["--config.num_train_steps=50", "--config.checkpoint_every_steps=10"]
_SHORT = ["--config.num_train_steps=20", "--config.checkpoint_every_steps=4"]
_BENCHMARKS = {
  "train_step": ["--size=tiny", "--vocab_size=300", "--max_len=32", "--tokens_per_step=512"]
  + ["--steps=1", "--peak_n=256"],
  "decode": ["--size=tiny", "--vocab_size=300", "--batch_size=4", "--src_len=8"]
  + ["--max_len_offset=4", "--repeats=1"],
  "memory": ["--sizes=tiny", "--dtypes=float32", "--tokens_per_device=512", "--max_len=64"]
  + ["--vocab_size=300", "--target=host"],
  "input_pipeline": ["--num_batches=3", "--tokens_per_batch=2048", "--max_len=32"]
  + ["--vocab_size=300"],
}

_MAIN_SHIM = """\
# README test stand-in for main.py: the real one (or, for WMT14's TFDS configs, the mock-WMT14
# one), with the chain's overrides appended; absolute workdirs moved into the scratch folder.
import json, os, runpy, sys
repo, root = os.environ["README_TEST_REPO"], os.environ["README_TEST_ROOT"]
overrides = json.loads(os.environ["README_TEST_OVERRIDES"])
args = [f"--workdir={root}{a[10:]}" if a.startswith("--workdir=/") else a for a in sys.argv[1:]]
config = next((a[9:] for a in args if a.startswith("--config=")), "")
kind = "wmt14" if "wmt14" in config else "demo" if "demo" in config else "files"
script = "tests/mock_wmt14_main.py" if kind == "wmt14" and ":files" not in config else "main.py"
sys.argv = [os.path.join(repo, script)] + args + overrides[kind]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

_BENCHMARK_SHIM = """\
# README test stand-in for a benchmark script: the real one with small overrides appended.
import json, os, runpy, sys
name = os.path.splitext(os.path.basename(__file__))[0]
path = os.path.join(os.environ["README_TEST_REPO"], "benchmarks", name + ".py")
overrides = json.loads(os.environ["README_TEST_OVERRIDES"]).get(name, [])
sys.argv = [path] + sys.argv[1:] + overrides
runpy.run_path(path, run_name="__main__")
"""

# Stand-ins for the cluster launchers: 2 processes x 4 CPU devices on 127.0.0.1.
_SRUN = """\
#!/usr/bin/env python3
# README test stand-in for SLURM's srun: 2 tasks on this machine, with SLURM's variables.
import os, subprocess, sys
job = int(os.environ["README_TEST_SLURM_PORT"]) - 61440  # JAX's SLURM port: 61440 + job id % 4096
base = dict(os.environ, SLURM_JOB_ID=str(job), SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2",
            SLURM_STEP_NUM_NODES="1", JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=4")
procs = [subprocess.Popen(sys.argv[1:], env=dict(base, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)))
         for i in range(2)]
sys.exit(max(p.wait() for p in procs))
"""

_GCLOUD = """\
#!/usr/bin/env python3
# README test stand-in for `gcloud compute tpus tpu-vm ssh POD --worker=all --command=CMD`: CMD on
# 2 local "workers" in the home folder; JAX's coordinator variables stand in for TPU metadata.
import os, subprocess, sys
args = sys.argv[1:]
assert args[:4] == ["compute", "tpus", "tpu-vm", "ssh"] and "--worker=all" in args, args
command = next(a[10:] for a in args if a.startswith("--command="))
base = dict(os.environ, JAX_COORDINATOR_ADDRESS="127.0.0.1:" + os.environ["README_TEST_PORT"],
            JAX_NUM_PROCESSES="2", JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=4")
procs = [subprocess.Popen(["bash", "-c", command], cwd=os.environ["README_TEST_HOME"],
                          env=dict(base, JAX_PROCESS_ID=str(i))) for i in range(2)]
sys.exit(max(p.wait() for p in procs))
"""


def _write_corpus(directory: pathlib.Path, prefixes: dict[str, tuple[str, int]]) -> None:
  from flaxformer_nmt.data import demo  # pylint: disable=g-import-not-at-top

  directory.mkdir(parents=True, exist_ok=True)
  for prefix, (split, size) in prefixes.items():
    pairs = demo.make_demo_split(split, size, 0)
    for lang, column in (("en", 0), ("de", 1)):
      text = "".join(pair[column] + "\n" for pair in pairs)
      (directory / f"{prefix}.{lang}").write_text(text, encoding="utf-8")


def _fake_sacrebleu_wmt14(cache: pathlib.Path, lines: int) -> list[tuple[str, str]]:
  """sacreBLEU's wmt14 (the filtered newstest2014) as its download would leave it: the tarball
  present (so nothing is fetched) and its SGML files extracted, with demo sentences."""
  from sacrebleu.dataset import DATASETS  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.data import demo  # pylint: disable=g-import-not-at-top

  dataset = DATASETS["wmt14"]
  raw = cache / "wmt14" / "raw"
  (raw / "test").mkdir(parents=True)
  (raw / dataset._get_tarball_filename(dataset.data[0])).write_bytes(b"stand-in")  # pylint: disable=protected-access
  pairs = demo.make_demo_split("test", lines, 0)
  src_file, ref_file = dataset.langpairs["en-de"]
  for name, column, lang in ((src_file, 0, "en"), (ref_file, 1, "de")):
    segs = "".join(f'<seg id="{i + 1}">{p[column]}</seg>\n' for i, p in enumerate(pairs))
    doc = (
      '<srcset setid="newstest2014" srclang="any">\n<doc docid="d1" origlang="en">\n'
      f"{segs}</doc>\n</srcset>\n"
    )
    (raw / name).write_text(doc if lang == "en" else doc.replace("srcset", "refset"), "utf-8")
  return pairs


def _free_port_in(low: int, high: int) -> int:
  """A free port in [low, high): JAX derives a SLURM job's coordinator port from its id, in the
  top 4,096 ports, so the srun stand-in picks the job id from a free one."""
  import random  # pylint: disable=g-import-not-at-top
  import socket  # pylint: disable=g-import-not-at-top

  for port in random.sample(range(low, high), 200):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
      return port
  raise AssertionError(f"no free port in [{low}, {high})")


def _compile_cache(root: pathlib.Path) -> pathlib.Path:
  """A JAX compilation cache beside the session's test folders (shared by xdist workers)."""
  base = root.parent.parent if os.environ.get("PYTEST_XDIST_WORKER") else root.parent
  return base / "readme_jax_cache"


class Sandbox:
  """A scratch folder laid out like a user's checkout, with the stand-ins of the module doc."""

  def __init__(self, root: pathlib.Path, overrides: dict[str, list[str]]) -> None:
    self.root = root
    self.repo = root / "flaxformer_nmt"  # the clone (gcloud's command does `cd flaxformer_nmt`)
    self.repo.mkdir()
    (self.repo / "configs").symlink_to(REPO / "configs")
    (self.repo / "main.py").write_text(_MAIN_SHIM)
    bench = self.repo / "benchmarks"
    bench.mkdir()
    for path in (REPO / "benchmarks").iterdir():
      if path.suffix == ".py" and path.stem != "flops":
        (bench / path.name).write_text(_BENCHMARK_SHIM)
      elif path.is_file():
        (bench / path.name).symlink_to(path)
    _write_corpus(
      root / "shared" / "data" / "multi30k",
      {"train": ("train", 1000), "val": ("dev", 16), "test_2016_flickr": ("test", 16)},
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", _SRUN), ("gcloud", _GCLOUD)):
      (bin_dir / name).write_text(text)
      (bin_dir / name).chmod(0o755)
    self.env = dict(
      os.environ,
      PATH=f"{bin_dir}:{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
      README_TEST_REPO=str(REPO),
      README_TEST_ROOT=str(root / "abs"),
      README_TEST_HOME=str(root),
      README_TEST_OVERRIDES=json.dumps(overrides),
      README_TEST_PORT=str(free_port()),
      README_TEST_SLURM_PORT=str(_free_port_in(61440, 65536)),
      # Two virtual devices, as two cores; the launchers give each process 4, the loop sets its own.
      XLA_FLAGS="--xla_force_host_platform_device_count=2",
      MOCK_WMT14_SIZES="3000,32,48",
      # One compilation cache for the session's chains: the commands of a chain compile the same
      # steps again and again (training, then eval, translate, attention ... each a new process).
      JAX_COMPILATION_CACHE_DIR=str(_compile_cache(root)),
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.2",
      SACREBLEU=str(root / "sacrebleu"),
      PYTHONPATH=str(REPO),
    )

  def run(self, command: readme.Command) -> subprocess.CompletedProcess:
    if command.kind == "python":
      argv = [sys.executable, "-c", command.text]
    else:
      argv = ["bash", "-c", f"set -euo pipefail\n{command.text}"]
    proc = subprocess.run(
      argv,
      cwd=self.repo,
      env=self.env,
      capture_output=True,
      text=True,
      timeout=_TIMEOUT,
    )
    assert proc.returncode == 0, (
      f"README command failed ({proc.returncode}):\n{command.text}\n{proc.stderr[-4000:]}"
    )
    return proc


def _last_json(proc: subprocess.CompletedProcess) -> dict:
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_readme_command_belongs_to_a_chain_that_runs_it():
  commands = readme.commands()
  assert len(commands) >= 40
  orphans = [c.text for c in commands if c.chain not in readme.CHAINS]
  assert not orphans, f"README commands no test runs: {orphans}"
  for chain in readme.CHAINS:
    assert readme.in_chain(chain), f"chain {chain} has no README command"


@readme_run
def test_install_commands_resolve_and_ci_runs_the_test_command(tmp_path):
  """`.ci/run` takes the quick start's test command verbatim; every `pip install` line resolves
  (with --dry-run: what it would install, nothing installed)."""
  ci = (REPO / ".ci" / "run").read_text()
  extract = re.search(r"<<'PY'\n(.*?)\nPY\n", ci, re.S).group(1)
  ci_cmd = subprocess.run(
    [sys.executable, "-c", extract], cwd=REPO, capture_output=True, text=True, check=True
  ).stdout.strip()
  for command in readme.in_chain("ci"):
    assert command.text == ci_cmd or command.text in ci, f".ci/run does not run {command.text}"
  assert ci_cmd in [c.text for c in readme.in_chain("ci")]
  installs = {
    part.split("#")[0].strip()
    for c in readme.commands()
    if c.kind == "bash"
    for part in c.text.split("&&")
    if part.strip().startswith("pip install")
  }
  extras = {'pip install -e ".[prepare]"', 'pip install -e ".[export]"', "pip install -e ."}
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


def _run_chain(chain: str, tmp_path: pathlib.Path, overrides: dict[str, list[str]], **env: str):
  """Runs the chain's commands in README order; yields (command, process, sandbox) to check."""
  box = Sandbox(tmp_path, overrides)
  box.env.update(env)
  for command in readme.in_chain(chain):
    if command.text.startswith("pip install -e . && "):  # installed already: .ci/run, above
      command = readme.Command(command.text[len("pip install -e . && ") :], "bash", "")
    if command.text.startswith("pip install"):
      continue  # the install chain's
    yield command, box.run(command), box


@readme_run
def test_demo_chain(tmp_path):
  """Quick start, using a trained model, translating and exporting, the demo's results."""
  overrides = {"demo": _DEMO}
  seen = []
  for command, proc, box in _run_chain("demo", tmp_path, overrides):
    seen.append(command.text)
    work = box.repo / "runs" / "demo"
    if "--mode=eval" in command.text:
      result = _last_json(proc)
      assert result["checkpoint"].startswith("averaged params of 3 checkpoints")
      assert 0.0 <= result["test_sacrebleu_beam4"] <= 100.0
    elif "--mode=translate" in command.text and "--output=out.txt" not in command.text:
      assert proc.stdout.count("\n") == 1  # one line in, one out (30 steps: maybe empty)
    elif "--output=out.txt" in command.text:
      assert len((box.repo / "out.txt").read_text().splitlines()) == 2
    elif "--mode=attention" in command.text:
      assert (work / "attention" / "cross_attention.png").stat().st_size > 0
    elif "--mode=export" in command.text:
      out = re.search(r"--output=(\S+)", command.text).group(1)
      assert (box.repo / out / "model.bin").is_file()
    elif command.kind == "python":
      printed = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307  (a list of strings)
      assert len(printed) == 2 and all(isinstance(t, str) and t for t in printed)
    elif "--mode" not in command.text and "main.py" in command.text:
      result = _last_json(proc)
      assert result["step"] == 30 and "test_sacrebleu_beam4" in result
  assert any("demo_bf16" in s for s in seen) and len(seen) >= 10


@readme_run
def test_wmt14_chain(tmp_path):
  """Table 2's recipe on the mock WMT14 (prepare, train, average, eval), the override example and
  the filtered newstest2014 through sacreBLEU's echo and the `:files` variant."""
  overrides = {"wmt14": _SMALL_MODEL + _RECIPE}
  pairs = _fake_sacrebleu_wmt14(tmp_path / "sacrebleu", lines=30)
  evals = 0
  for command, proc, box in _run_chain("wmt14", tmp_path, overrides):
    text = command.text
    if "--mode=prepare" in text:
      prepared = _last_json(proc)
      assert (prepared["dev_set"], prepared["test_set"]) == ("newstest2013", "newstest2014")
      assert (prepared["dev_sentences"], prepared["test_sentences"]) == (32, 48)
    elif "--echo src" in text:
      written = (box.repo / "wmt14_text" / "newstest2014-filtered.en").read_text().splitlines()
      assert written == [p[0] for p in pairs]
    elif "--mode=eval" in text and ":files" not in text:
      result = _last_json(proc)
      assert result["test_set"] == "newstest2014" and result["test_sentences"] == 48
      assert result["checkpoint"].startswith("averaged params of 5 checkpoints")
      assert result["beam_style"] == "t2t"
      assert result["tokenized_bleu_method"] == "moses-de+##AT##"
      assert 5.0 < result["test_sacrebleu_beam4"] < 90.0  # 50 steps: the frames, not the numbers
      assert "newstest2014 (test), beam4: sacreBLEU" in proc.stderr
      evals += 1
    elif "--mode=eval" in text:
      result = _last_json(proc)
      assert result["test_set"] == "newstest2014-filtered" and result["test_sentences"] == 30
      evals += 1
    elif "main.py" in text and "--mode" not in text:
      assert _last_json(proc)["step"] == 50
  assert evals == 2


@readme_run
def test_files_chain(tmp_path):
  """Your own files (Multi30k's names), the Multi30k script and its results rows, the input
  pipeline benchmark on the same files."""
  overrides = {"files": _SMALL_MODEL + _SHORT, "wmt14": _SMALL_MODEL + _SHORT}
  overrides.update(_BENCHMARKS)
  ran_script = False
  for command, proc, box in _run_chain("files", tmp_path, overrides):
    if "multi30k.sh" in command.text:
      work = box.repo / "runs" / "multi30k_60m"  # the script's default: runs/ did not exist
      last = _last_json(proc)
      assert last == json.loads((work / "multi30k_result.json").read_text())
      assert last["steps"] == 20 and len(last["averaged_steps"]) == 5
      assert (work / "learning_curve.png").stat().st_size > 0
      ran_script = True
    elif "--mode=eval" in command.text:
      assert ran_script
      assert 0.0 <= _last_json(proc)["test_sacrebleu_greedy"] <= 100.0
    else:
      _last_json(proc)  # training results, the benchmark's JSON
  assert ran_script


@readme_run
def test_benchmark_commands(tmp_path):
  overrides = dict(_BENCHMARKS)
  for command, proc, _ in _run_chain("benchmarks", tmp_path, overrides):
    result = _last_json(proc)
    assert result, command.text


@readme_run
def test_python_api_block(tmp_path):
  """The README's API example, with `api.load_config` given the demo's small overrides."""
  small = {a.split("=")[0][len("--config.") :]: eval(a.split("=")[1]) for a in _DEMO}  # noqa: S307
  box = Sandbox(tmp_path, {})
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


@readme_run
@pytest.mark.parametrize("chain", ["local", "srun", "gcloud"])
def test_multi_host_launch(chain, tmp_path):
  """The README's launches of 2 processes x 4 devices, to the end of a short training run."""
  steps = ["--config.num_train_steps=4", "--config.checkpoint_every_steps=4"]
  small = ["--config.data.demo_dev_size=8", "--config.data.demo_test_size=8"]
  overrides = {"demo": _DEMO[2:] + small + steps, "wmt14": _SMALL_MODEL + steps}
  ((command, proc, box),) = list(
    _run_chain(chain, tmp_path, overrides, MOCK_WMT14_SIZES="1000,8,8")
  )
  workdir = re.search(r'--workdir=([^\s"]+)', command.text).group(1)
  workdir = box.root / "abs" / workdir[1:] if workdir.startswith("/") else box.repo / workdir
  result = json.loads((workdir / "train_result.json").read_text())
  assert result["step"] == 4, result
  # Process 0 logs for the job: 8 devices in all, from 2 processes.
  assert "Devices: 8 (2 processes x 4 local, cpu)" in proc.stderr, proc.stderr[-3000:]
  if chain == "srun":
    assert "Detected SlurmCluster with 2 processes" in proc.stderr
