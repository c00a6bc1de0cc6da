"""End-to-end resume: real training subprocesses killed, preempted and poisoned, then resumed.

Each run is the demo config shrunk to a few seconds (a 1-layer d_model 32 model on a 2000-pair
corpus, 2 CPU devices). Dropout is switched on, so the dropout key and the step it is folded with
must come back exactly too. The final state is read with orbax directly, not with the code under
test, so a bug shared by save and restore cannot hide itself.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

import jax_caches

# The tests share module fixtures: one worker runs them all (pyproject: --dist=loadgroup).
pytestmark = pytest.mark.xdist_group("resume")

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 240  # per subprocess; a run normally takes seconds
TOTAL = 24  # training steps of the reference and the interrupted run

TINY = [
  "--config.data.demo_train_size=2000",
  "--config.data.demo_dev_size=8",
  "--config.data.demo_test_size=8",
  "--config.data.vocab_size=120",
  "--config.data.vocab_sample_size=2000",
  "--config.data.max_len=32",
  "--config.data.tokens_per_batch=256",
  "--config.model.num_layers=1",
  "--config.model.d_model=32",
  "--config.model.d_ff=64",
  "--config.model.num_heads=2",
  "--config.model.max_len=64",
  "--config.model.dropout_rate=0.1",
  "--config.optim.warmup_steps=10",
  "--config.log_every_steps=1",
  "--config.eval_every_steps=100000",
  "--config.checkpoint_every_steps=2",
  "--config.keep_checkpoints=3",
  "--config.eval.dev_bleu_sentences=0",  # no decoding at the final eval: compiles cost seconds
  "--config.decode.beam_size=1",  # the final test decode is greedy only, for the same reason
  "--config.decode.max_len_offset=5",
  "--config.optim.ema_decay=0.9",  # the parameter average is part of the state that must resume
]

# float16 with a loss scale that moves both ways within the run: 2^20 overflows now and then
# (skipped steps, the scale halved) and doubles after 3 finite steps, so a resume must bring back
# the scale, its count of finite steps and the skipped-step count exactly.
FLOAT16 = [
  "--config.model.dtype=float16",
  "--config.optim.loss_scale_init=1048576",
  "--config.optim.loss_scale_period=3",
]


class Trainer:
  """Starts `main.py` training subprocesses; each workdir's output goes to `<workdir>.log`."""

  def __init__(
    self, base: pathlib.Path, session: pathlib.Path, extra: tuple[str, ...] = ()
  ) -> None:
    self.extra = list(extra)  # overrides of every run (FLOAT16)
    self.env = dict(os.environ)
    # Two devices: the pmapped path with (un)replication, at a fraction of eight's compile time.
    self.env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    self.env["JAX_PLATFORMS"] = "cpu"
    self.env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    # Runs load their programs instead of compiling them (most of a run's time): the two-device
    # stack's cache, kept between test runs (tests/jax_caches.py).
    self.env.update(jax_caches.environment(self.env["XLA_FLAGS"], session))
    self.vocab: list[str] = []  # set once the reference run has trained a vocabulary
    self.reference = base / "reference"  # the uninterrupted run

  def start(
    self,
    workdir: pathlib.Path,
    *overrides: str,
    config: str = "configs/demo.py",
    script: str = "main.py",
  ) -> subprocess.Popen:
    workdir.mkdir(exist_ok=True)
    with open(self._log_path(workdir), "ab") as log:
      log.write(f"\n=== {' '.join(overrides)}\n".encode())
      return subprocess.Popen(
        [
          sys.executable,
          script,
          f"--config={config}",
          f"--workdir={workdir}",
          *TINY,
          *self.extra,
          *self.vocab,
          *overrides,
        ],
        cwd=REPO,
        env=self.env,
        stdout=log,
        stderr=subprocess.STDOUT,
      )

  @staticmethod
  def _log_path(workdir: pathlib.Path) -> pathlib.Path:
    return workdir.parent / f"{workdir.name}.log"

  def log(self, workdir: pathlib.Path) -> str:
    path = self._log_path(workdir)
    return path.read_text(errors="replace") if path.exists() else ""

  def finish(self, proc: subprocess.Popen, workdir: pathlib.Path) -> int:
    try:
      return proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      pytest.fail(f"training timed out; log:\n{self.log(workdir)[-4000:]}")

  def wait_for_log(
    self, proc: subprocess.Popen, workdir: pathlib.Path, text: str, offset: int = 0
  ) -> None:
    """Waits until `text` appears in the log after character `offset` (this run's output)."""
    deadline = time.monotonic() + TIMEOUT_S
    while text not in self.log(workdir)[offset:]:
      if proc.poll() is not None:
        pytest.fail(
          f"training exited ({proc.returncode}) before {text!r}:\n{self.log(workdir)[-4000:]}"
        )
      if time.monotonic() > deadline:
        proc.kill()
        pytest.fail(f"no {text!r} after {TIMEOUT_S}s:\n{self.log(workdir)[-4000:]}")
      time.sleep(0.01)


def _steps(workdir: pathlib.Path) -> list[int]:
  """Committed checkpoint steps (orbax renames a step's directory into place when complete)."""
  ckpts = workdir / "checkpoints"
  return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []


def _partial(workdir: pathlib.Path) -> list[str]:
  """Checkpoint directories still being written (orbax's temporary names)."""
  ckpts = workdir / "checkpoints"
  if not ckpts.is_dir():
    return []
  return [p.name for p in ckpts.iterdir() if "orbax-checkpoint-tmp" in p.name]


def _read(workdir: pathlib.Path, step: int) -> tuple[dict, dict]:
  """(state, data position) of a checkpoint, read by orbax without the code under test."""
  path = workdir / "checkpoints" / str(step)
  with ocp.PyTreeCheckpointer() as reader:
    state = reader.restore(path / "state")
  data = json.loads((path / "data" / "metadata").read_text())
  data.pop("train_seconds")  # wall-clock time, the one thing a resumed run does not repeat
  return state, data


def _assert_bitwise(a: dict, b: dict, where: str = "") -> None:
  assert isinstance(a, dict) == isinstance(b, dict), where
  if isinstance(a, dict):
    assert sorted(a) == sorted(b), where
    for k in a:
      _assert_bitwise(a[k], b[k], f"{where}/{k}")
    return
  a, b = np.asarray(a), np.asarray(b)
  assert a.dtype == b.dtype and a.shape == b.shape, where
  assert a.tobytes() == b.tobytes(), f"{where} differs"


def _trainer_with_reference(tmp_path_factory, name: str, extra: tuple[str, ...] = ()) -> Trainer:
  base = tmp_path_factory.mktemp(name)
  trainer = Trainer(base, jax_caches.session_of(tmp_path_factory), extra)
  reference = trainer.reference
  proc = trainer.start(reference, f"--config.num_train_steps={TOTAL}")
  assert trainer.finish(proc, reference) == 0, trainer.log(reference)[-4000:]
  # Every later run reuses this vocabulary: nothing but the interruptions differs.
  trainer.vocab = [f"--config.data.vocab_path={reference / 'spm.model'}"]
  return trainer


@pytest.fixture(scope="module")
def trainer(tmp_path_factory) -> Trainer:
  """A Trainer whose uninterrupted reference run (`<base>/reference`) has finished."""
  return _trainer_with_reference(tmp_path_factory, "resume")


@pytest.fixture(scope="module")
def trainer_float16(tmp_path_factory) -> Trainer:
  """The same in float16 (FLOAT16)."""
  return _trainer_with_reference(tmp_path_factory, "resume16", tuple(FLOAT16))


@pytest.fixture(scope="module")
def trainer_lora(tmp_path_factory, trainer) -> Trainer:
  """LoRA fine-tuning of the float32 reference (rank 2 on q, k, v, o, with adapter dropout, whose
  masks must come back as the model's do; no EMA, which LoRA refuses; the vocabulary is the
  source's, adopted by init_from)."""
  base = tmp_path_factory.mktemp("resume_lora")
  extra = (
    f"--config.init_from={trainer.reference}",
    "--config.optim.lora_rank=2",
    "--config.optim.lora_dropout=0.1",
    "--config.optim.ema_decay=0.0",
  )
  lora = Trainer(base, jax_caches.session_of(tmp_path_factory), extra)
  proc = lora.start(lora.reference, f"--config.num_train_steps={TOTAL}")
  assert lora.finish(proc, lora.reference) == 0, lora.log(lora.reference)[-4000:]
  return lora


@pytest.mark.parametrize("dtype", ["float32", "float16", "lora"])
def test_kill9_at_random_steps_then_resume_is_bitwise_identical(request, dtype, tmp_path):
  fixture = {"float32": "trainer", "float16": "trainer_float16", "lora": "trainer_lora"}[dtype]
  trainer = request.getfixturevalue(fixture)
  workdir = tmp_path / "killed"
  rng = random.Random(int(os.environ.get("RESUME_TEST_SEED", "0")))
  # From step 5 on, checkpoint 2 is surely committed, so every segment after the first resumes.
  kill_steps = sorted(rng.sample(range(5, TOTAL - 1), 2))
  for i, kill_step in enumerate(kill_steps):
    offset = len(trainer.log(workdir))
    proc = trainer.start(workdir, f"--config.num_train_steps={TOTAL}")
    # The loop logs each step before deciding to save, so the kill lands just before, during or
    # after that step's (asynchronous) checkpoint write, or in the next step.
    trainer.wait_for_log(proc, workdir, f"step {kill_step}/{TOTAL} ", offset)
    if i == 1:  # one kill for sure in the middle of a checkpoint write
      while not _partial(workdir) and proc.poll() is None:
        time.sleep(0.002)
    else:
      time.sleep(rng.uniform(0.0, 0.05))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if i == 1:
      assert _partial(workdir), "the kill was meant to land during a checkpoint write"
  proc = trainer.start(workdir, f"--config.num_train_steps={TOTAL}")
  assert trainer.finish(proc, workdir) == 0, trainer.log(workdir)[-4000:]
  assert trainer.log(workdir).count("Resumed from step") == 2, kill_steps

  want_state, want_data = _read(trainer.reference, TOTAL)
  got_state, got_data = _read(workdir, TOTAL)
  assert got_data == want_data
  if dtype == "lora":  # the adapters, W0 and the adapters' moments are compared bit for bit
    assert set(want_state["lora"]) == {"base", "adapters"}
    assert "ema" not in want_state["opt_state"]["1"]
  else:
    assert "ema" in want_state["opt_state"]["1"]  # the EMA is compared bit for bit too
  if dtype == "float16":  # the loss scale too, after it moved both ways
    scales = [r["loss_scale"] for r in _metrics(trainer.reference)]
    assert any(b < a for a, b in zip(scales, scales[1:], strict=False))
    assert any(b > a for a, b in zip(scales, scales[1:], strict=False))
    assert int(want_state["loss_scale"]["skipped_steps"]) > 0
  else:
    assert "loss_scale" not in want_state  # float32 checkpoints keep their layout
  _assert_bitwise(got_state, want_state)
  assert not _partial(workdir)  # the half-written checkpoint was cleaned up on resuming


def test_sigterm_saves_then_a_nan_stops_with_nothing_saved_then_resume(trainer, tmp_path):
  """One workdir through three launches: a preemption (SIGTERM saves and exits 0), a resume whose
  loss turns NaN (tests/nan_main.py: one line, exit 2, nothing saved from the poisoned step on),
  and a normal resume from the last good checkpoint."""
  workdir = tmp_path / "preempted"
  proc = trainer.start(
    workdir, "--config.num_train_steps=100000", "--config.checkpoint_every_steps=1000"
  )
  trainer.wait_for_log(proc, workdir, "step 5/100000 ")
  proc.send_signal(signal.SIGTERM)
  assert trainer.finish(proc, workdir) == 0, trainer.log(workdir)[-4000:]
  log = trainer.log(workdir)
  assert "Rerun the same command to resume" in log
  (stopped,) = _steps(workdir)  # no periodic save was due: this is the preemption save
  assert stopped >= 5
  result = [line for line in log.splitlines() if line.startswith("{")][-1]
  assert json.loads(result)["step"] == stopped

  # Resumed at `stopped` with a loss that is NaN: step stopped + 1 is the first bad one.
  proc = trainer.start(
    workdir, f"--config.num_train_steps={stopped + 6}", script="tests/nan_main.py"
  )
  code = trainer.finish(proc, workdir)
  log = trainer.log(workdir)
  assert code == 2, log[-4000:]  # one line, a user error: lower the learning rate
  errors = [line for line in log.splitlines() if "Non-finite" in line]
  assert errors and f"step {stopped + 1}" in errors[-1], log[-4000:]
  assert _steps(workdir) == [stopped]  # nothing from the poisoned step on was saved
  state, _ = _read(workdir, stopped)
  assert int(state["step"]) == stopped
  assert all(np.isfinite(x).all() for x in _leaves(state["params"]))

  proc = trainer.start(workdir, f"--config.num_train_steps={stopped + 2}")  # no NaN now
  assert trainer.finish(proc, workdir) == 0, trainer.log(workdir)[-4000:]
  assert trainer.log(workdir).count(f"Resumed from step {stopped}") == 2
  assert _steps(workdir)[-1] == stopped + 2


def _metrics(workdir: pathlib.Path) -> list[dict]:
  lines = (workdir / "train_metrics.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines if line.strip()]


def _leaves(tree) -> list[np.ndarray]:
  if isinstance(tree, dict):
    return [x for v in tree.values() for x in _leaves(v)]
  return [np.asarray(tree)]
