"""What several test files share: paths, the tiny demo config, tree and file comparisons.

Importable as `helpers` (pytest puts tests/ on the path); the fixtures built on it are in
conftest.py.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import jax
import ml_collections
import numpy as np

from flaxformer_nmt.checkpoints import params as params_lib
from flaxformer_nmt.config import loading as config_files
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.run import selection
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.training import steps

REPO = pathlib.Path(__file__).resolve().parent.parent
# The real corpus beside the checkout (../shared/data/multi30k), or where FLAXFORMER_NMT_MULTI30K
# points: only end-to-end tests read it (`multi30k()`); the unit tier needs nothing outside the
# checkout.
MULTI30K = pathlib.Path(
  os.environ.get("FLAXFORMER_NMT_MULTI30K", REPO.parent / "shared" / "data" / "multi30k")
)
# Where `multi30k()` downloads the corpus (the project's own verified download) when neither
# place has it, as a user's clone with internet access would.
MULTI30K_CACHE = pathlib.Path(
  os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"), "flaxformer_nmt", "multi30k"
)


def multi30k() -> pathlib.Path:
  """The Multi30k corpus for a test: $FLAXFORMER_NMT_MULTI30K, else ../shared/data/multi30k, else
  downloaded (verified) into MULTI30K_CACHE. A test fails with one line naming all three ways
  when none gives it."""
  import pytest  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt import api, errors  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.data import download  # pylint: disable=g-import-not-at-top

  if (MULTI30K / "train.en.gz").is_file():
    return MULTI30K
  config = api.load_config("multi30k", {"data.dir": str(MULTI30K_CACHE)})
  try:
    download.download(config.data)
  except errors.UserError as e:
    pytest.fail(
      f"No Multi30k corpus: FLAXFORMER_NMT_MULTI30K is "
      f"{os.environ.get('FLAXFORMER_NMT_MULTI30K') or 'unset'}, {MULTI30K} has no train.en.gz, "
      f"and downloading it into {MULTI30K_CACHE} failed ({e})",
      pytrace=False,
    )
  return MULTI30K_CACHE


# A small trained workdir committed with the tests (tests/fixtures/make_workdir.py wrote it, at
# commit 97ad9e1): the unit tier's trained run (tests/unit/conftest.py), and the workdir whose
# compatibility tests/unit/test_compat.py checks.
SAVED_RUN = REPO / "tests" / "fixtures" / "workdir_97ad9e1"


def saved_run_overrides() -> dict[str, Any]:
  """The config overrides SAVED_RUN was trained with (make_workdir.OVERRIDES), for
  `api.load_config("demo", ...)`."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  path = SAVED_RUN.parent / "make_workdir.py"
  spec = importlib.util.spec_from_file_location("make_workdir", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return dict(module.OVERRIDES)


def saved_run_flags() -> list[str]:
  """The same overrides as `--config.<field>=<value>` flags (after --config=configs/demo.py)."""
  return [f"--config.{k}={v}" for k, v in saved_run_overrides().items()]


# A WMT14 (or any) config file made small from the command line: model size, vocabulary and
# schedule only; data, beam style, BLEU and checkpointing stay the config file's.
SMALL_MODEL_FLAGS = [
  "--config.model.num_layers=1",
  "--config.model.d_model=64",
  "--config.model.d_ff=128",
  "--config.model.num_heads=4",
  "--config.model.max_len=64",
  "--config.data.vocab_size=300",
  "--config.data.vocab_sample_size=3000",
  "--config.data.max_len=32",
  "--config.data.tokens_per_batch=2048",
  "--config.optim.warmup_steps=20",
  "--config.log_every_steps=10",
  "--config.eval.dev_bleu_sentences=16",
  "--config.decode.batch_size=8",
]


def demo_config(**overrides: Any) -> ml_collections.ConfigDict:
  """configs/demo.py made small enough for a test: 60 steps, 40-sentence dev and test sets.

  `overrides` are dotted field names with `__` for the dots: `model__dtype="float32"`.
  """
  c = config_files.load("demo")
  c.num_train_steps = 60
  c.log_every_steps = 10
  c.eval_every_steps = 60
  c.checkpoint_every_steps = 30
  c.data.demo_train_size = 5_000
  c.data.demo_dev_size = 40
  c.data.demo_test_size = 40
  c.eval.dev_bleu_sentences = 20
  c.decode.beam_size = 2
  for name, value in overrides.items():
    *groups, field = name.split("__")
    node = c
    for group in groups:
      node = node[group]
    node[field] = value
  return c


def best_ema_config() -> ml_collections.ConfigDict:
  """The tiny demo with config.best_metric (dev_bleu) and an EMA of 0.9, evaluated and saved every
  20 steps (tests/e2e/conftest.py's `trained_best_ema`)."""
  return demo_config(
    model__dtype="float32",
    eval_every_steps=20,
    checkpoint_every_steps=20,
    best_metric="dev_bleu",
    optim__ema_decay=0.9,
  )


def fine_tune_config(source: Any, **overrides: Any) -> ml_collections.ConfigDict:
  """10 steps fine-tuned from the workdir `source` (another demo data seed, the constant schedule
  at 0.1 of the peak): tests/e2e/conftest.py's `fine_tuned_demo`."""
  fields = dict(model__dtype="float32", init_from=str(source), data__demo_seed=7)
  fields.update(num_train_steps=10, checkpoint_every_steps=10, eval_every_steps=10)
  config = demo_config(**{**fields, **overrides})
  config.optim.schedule, config.optim.lr_scale = "constant", 0.1
  return config


def narrow(config: ml_collections.ConfigDict, layers: int = 1) -> ml_collections.ConfigDict:
  """`config` with the tiny model made narrower (d_model 32, d_ff 64, 4 heads) and `layers` deep:
  for unit tests of mechanisms (sharding, accumulation, search, masks), which a narrow model shows
  as well as a wide one, at a fraction of the compile and run time."""
  config.model.update(num_layers=layers, d_model=32, d_ff=64, num_heads=4)
  return config


def pmapped_train_step(model: Any, tx: Any, schedule: Any, devices: int = 1, **options: Any):
  """steps.train_step pmapped over the first `devices` local devices (axis "batch", label
  smoothing 0.1), with `options` (accumulate_steps, lora_scale, ...) as given."""
  step = functools.partial(
    steps.train_step,
    model=model,
    tx=tx,
    schedule=schedule,
    label_smoothing=0.1,
    axis_name="batch",
    **options,
  )
  return jax.pmap(step, axis_name="batch", devices=jax.local_devices()[:devices])


def assert_trees_equal(a: Any, b: Any) -> None:
  """Same structure, same leaf paths, and bitwise-equal leaves (dtype and shape included)."""
  flat_a = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(a)[0]}
  flat_b = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(b)[0]}
  assert sorted(flat_a) == sorted(flat_b), set(flat_a) ^ set(flat_b)
  for path, x in flat_a.items():
    x, y = np.asarray(x), np.asarray(flat_b[path])
    assert (x.dtype, x.shape) == (y.dtype, y.shape), (
      f"{path}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
    )
    assert x.tobytes() == y.tobytes(), f"{path} differs"


def snapshot(directory: pathlib.Path) -> dict[str, tuple[int, str]]:
  """{relative path: (mtime in ns, sha1)} of every file under `directory` ({} if absent)."""
  if not directory.exists():
    return {}
  out = {}
  for path in sorted(directory.rglob("*")):
    if path.is_file():
      out[str(path.relative_to(directory))] = (
        path.stat().st_mtime_ns,
        hashlib.sha1(path.read_bytes()).hexdigest(),
      )
  return out


def read_metrics(workdir: pathlib.Path, split: str) -> list[dict[str, Any]]:
  """The records of `<workdir>/<split>_metrics.jsonl` (train: one per log step; dev: per eval)."""
  path = workdir / f"{split}_metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_main(
  *args: str, stdin: str = "", env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
  """`python main.py ARGS` from the repository root, as a user runs it."""
  return subprocess.run(
    [sys.executable, "main.py", *args],
    cwd=REPO,
    input=stdin,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=None if env is None else {**os.environ, **env},
  )


def mode_on_a_copy(
  trained: pathlib.Path, folder: pathlib.Path, mode: str, *args: str
) -> tuple[dict, pathlib.Path, pathlib.Path]:
  """`main.py --mode=MODE ARGS --output=<folder>/out` on a copy of the trained demo workdir
  `trained` (float32), which stays as it was: (its last-line JSON result, the copy, the output)."""
  work, out = folder / "workdir", folder / "out"
  shutil.copytree(trained, work)
  proc = run_main(
    f"--workdir={work}",  # the run's own config (float32, recorded when it trained)
    f"--mode={mode}",
    *args,
    f"--output={out}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1]), work, out


def shared_once(tmp_path_factory: Any, name: str, build: Any) -> tuple[Any, pathlib.Path]:
  """(`build(folder)`'s JSON-able result, folder): built once per test session in
  `<session>/<name>` and shared by every xdist worker (the first to ask builds it; the others
  wait on a file lock). Read-only afterwards: a test that changes the folder copies it first.
  A build that failed fails every later request at once, with its error, instead of building
  again on top of what it left."""
  import fcntl  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the session's folder, shared by its workers
  folder, done, failed = root / name, root / f"{name}.json", root / f"{name}.failed"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if failed.exists():
      raise RuntimeError(f"building {name} failed earlier in this run: {failed.read_text()}")
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      try:
        result = build(folder)
      except BaseException as e:
        failed.write_text(f"{type(e).__name__}: {e}"[:4000])
        raise
      done.write_text(json.dumps(result))
  return json.loads(done.read_text()), folder


def load_params(config: ml_collections.ConfigDict, workdir: Any, which: str = "auto") -> Any:
  """(params, description) of `--checkpoint=which` in `workdir`, as the inference modes load
  them (the workdir's Components, the location it resolves)."""
  run = Workdir(str(workdir))
  components = Components.load(config, run)
  return params_lib.load(selection.resolve(run, which), components.abstract_params)


def fresh_trainer(config: ml_collections.ConfigDict, workdir: Any) -> Any:
  """A Trainer of `config` in `workdir`, set up as training/loop.py does (no lock)."""
  from flaxformer_nmt.data import pipeline as data_lib  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.training.state import TrainSetup  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.training.trainer import Trainer  # pylint: disable=g-import-not-at-top

  run = Workdir(str(workdir))
  run.create()
  data = data_lib.make_data(config, run, jax.device_count(), 0, 1)
  return Trainer(TrainSetup(Components(config, data.tokenizer)), data, run)


def translator(
  tokenizer: Any,
  model: Any,
  params: Any,
  decode: ml_collections.ConfigDict,
  max_src_len: int,
  data: ml_collections.ConfigDict | None = None,
  **request: Any,
) -> Any:
  """The Translator a decoding Session (the one owner) makes for `request` (requests.Request's
  fields: nbest, alignments, target_lang, beam_size), around a hand-built `model` and a stand-in
  `tokenizer` (Components.around)."""
  from flaxformer_nmt.decoding.requests import Request  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.decoding.session import Session  # pylint: disable=g-import-not-at-top

  components = Components.around(tokenizer, model, decode, max_src_len, data)
  return Session(components, params).translator(Request(**request))


class CharTokenizer:
  """One id per character, assigned on first sight (ids from 3: 0 PAD, 1 EOS, 2 UNK)."""

  def __init__(self, vocab_size: int | None = None) -> None:
    self.vocab_size = vocab_size
    self.ids: dict[str, int] = {}
    self.chars: dict[int, str] = {}

  def encode(self, text: str) -> list[int]:
    out = []
    for ch in text:
      if ch not in self.ids:
        i = 3 + len(self.ids)
        if self.vocab_size is not None:
          i = 3 + (len(self.ids) % (self.vocab_size - 3))
        self.ids[ch] = i
        self.chars.setdefault(i, ch)
      out.append(self.ids[ch])
    return out

  def encode_target(self, text: str) -> list[int]:
    return self.encode(text)  # one vocabulary for both sides, as data/tokenizer.Tokenizer

  def decode(self, ids) -> str:
    out = []
    for i in ids:
      if i == EOS_ID:
        break
      if i != PAD_ID:
        out.append(self.chars.get(int(i), "?"))
    return "".join(out)


def write_lock(workdir: Any, **holder: Any) -> str:
  """A `train.lock` in `workdir` naming `holder` (host, pid, ...): the path."""
  path = os.path.join(workdir, os.path.basename(Workdir("").lock_path))
  with open(path, "w") as f:
    json.dump(holder, f)
  return path


def write_dead_holders_lock(workdir: Any) -> str:
  """The lock a job on this host left when it was killed: its pid is no process's now (counted
  down from the kernel's largest), so no process is started to find one."""
  import socket  # pylint: disable=g-import-not-at-top

  with open("/proc/sys/kernel/pid_max") as f:
    pid = int(f.read()) - 1
  while os.path.exists(f"/proc/{pid}"):
    pid -= 1
  return write_lock(workdir, host=socket.gethostname(), pid=pid, process_start="1", started="then")
