"""Every mistake a user can make is one line (`error: ...`), exit status 2, and touches nothing.

The table of mistakes runs in this process, through what `main.py` runs: flag mistakes through
`cli.parse_flags` (which prints the line and exits 2), the rest through the mode functions, which
must raise a `UserError` whose message is one line naming the culprit (`cli.main` prints exactly
that and exits 2). Where the workdir already holds a trained run, every file in it must be
byte-for-byte and timestamp-for-timestamp as it was. Two cases also run as `python main.py`
subprocesses, checking the wrapper itself end to end; an internal error, by contrast, keeps its
traceback.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from flaxformer_nmt import api, cli, errors, modes, parallel

import helpers

LINES = ["A man rides a bike .", "Two dogs play .", "A child smiles ."]
GERMAN = ["Ein Mann fährt Rad .", "Zwei Hunde spielen .", "Ein Kind lächelt ."]


def _corpus(root: pathlib.Path, **damage: bytes) -> pathlib.Path:
  """A tiny files-source corpus (train/val/test, .en and .de); `damage` replaces named files."""
  root.mkdir(parents=True)
  for prefix in ("train", "val", "test"):
    for lang, lines in (("en", LINES), ("de", GERMAN)):
      name = f"{prefix}.{lang}"
      content = damage.get(name.replace(".", "_"), ("\n".join(lines) + "\n").encode())
      if content is not None:
        (root / name).write_bytes(content)
  return root


def _files_config(corpus: pathlib.Path) -> list[str]:
  # The demo's model (that of the trained workdir) on the user's files: the data is the culprit.
  return [
    "--config=configs/demo.py",
    "--config.data.source=files",
    f"--config.data.dir={corpus}",
    "--config.data.train_prefix=train",
    "--config.data.dev_prefix=val",
    "--config.data.test_prefix=test",
  ]


@dataclasses.dataclass
class Case:
  """A bad input: how to set it up (given a fresh folder and a trained workdir) and the culprit."""

  name: str
  setup: Callable[[pathlib.Path, pathlib.Path], list[str]]  # -> main.py arguments
  culprit: str  # must appear in the one line
  trained: bool = True  # runs on a copy of a trained workdir, which must stay untouched


def _trained(base: pathlib.Path, trained: pathlib.Path) -> pathlib.Path:
  workdir = base / "workdir"
  shutil.copytree(trained, workdir)
  return workdir


def _in_trained(*args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    return [f"--workdir={_trained(base, trained)}", *[a.format(base=base) for a in args]]

  return setup


def _bad_corpus(**damage: bytes | None) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    return [f"--workdir={_trained(base, trained)}", *_files_config(_corpus(base / "c", **damage))]

  return setup


def _fine_tuning(init_from: str, *args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """A new workdir (nothing to resume) fine-tuning from `init_from` ({trained}: a copy of the
  trained demo)."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    (base / "not_a_run").mkdir()
    source = init_from.format(base=base, trained=_trained(base, trained))
    return [
      f"--workdir={base / 'fine'}",
      "--config=configs/demo.py",
      f"--config.init_from={source}",
      *args,
    ]

  return setup


def _translate_input(base: pathlib.Path) -> pathlib.Path:
  (base / "in.txt").write_text("three hundred\n", encoding="utf-8")
  return base / "in.txt"


def _workdir_is_a_file(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  (base / "notes.txt").write_text("my notes\n")
  return [f"--workdir={base / 'notes.txt'}", "--config=configs/demo.py"]


def _no_checkpoint(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  (base / "empty").mkdir()
  return [
    f"--workdir={base / 'empty'}",
    "--config=configs/demo.py",
    "--mode=translate",
    f"--input={_translate_input(base)}",
  ]


def _translate_bad_utf8(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  (base / "in.txt").write_bytes(b"three\n\xc3(\n")
  return [
    f"--workdir={_trained(base, trained)}",
    "--config=configs/demo.py",
    "--mode=translate",
    f"--input={base / 'in.txt'}",
  ]


def _translating(*args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """A translate command on a copy of the trained workdir, with a real input file."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    workdir = _trained(base, trained)
    formatted = [a.format(base=base) for a in args]
    return [
      f"--workdir={workdir}",
      "--config=configs/demo.py",
      "--mode=translate",
      f"--input={_translate_input(base)}",
      *formatted,
    ]

  return setup


def _member_with_other_vocabulary(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  other = base / "other"
  shutil.copytree(trained, other)
  (other / "spm.model").write_bytes(b"a vocabulary of another run")
  return _translating(f"--ensemble={other}")(base, trained)


def _member_with_other_heads(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  """Same parameter shapes, another architecture: only the saved config.json tells."""
  other = base / "other"
  shutil.copytree(trained, other)
  saved = json.loads((other / "config.json").read_text())
  saved["model"]["num_heads"] = 2
  (other / "config.json").write_text(json.dumps(saved))
  return _translating(f"--ensemble={other}")(base, trained)


TWO = ("\n".join(LINES[:2]) + "\n").encode()
CASES = [
  Case("mismatched files", _bad_corpus(train_de=TWO), "train.en has 3 lines but"),
  Case(
    "bad UTF-8",
    _bad_corpus(val_de=b"Ein Mann .\nZwei \xff Hunde .\nEin Kind .\n"),
    "val.de:2: invalid UTF-8 (byte 0xff at column 6)",
  ),
  Case("empty file", _bad_corpus(test_en=b""), "test.en: file is empty"),
  Case("missing file", _bad_corpus(val_de=None), "data.dev_prefix='val': missing"),
  Case(
    "over-long line",
    _bad_corpus(train_en=b"ok\n" + b"word " * 300_000 + b"\nok\n"),
    "train.en:2: line longer than 1,048,576 bytes",
  ),
  Case(
    "unknown TFDS name",
    _in_trained(
      "--config=configs/demo.py",
      "--config.data.source=tfds",
      "--config.data.tfds_name=wmt41_translate/de-en",
    ),
    "data.tfds_name='wmt41_translate/de-en': unknown TFDS dataset",
  ),
  Case(
    "mistyped config field",
    _in_trained("--config=configs/demo.py", "--config.modle.d_ff=8"),
    "--config.modle.d_ff: config has no field 'modle'; did you mean --config.model.d_ff?",
  ),
  Case(
    "impossible config value",
    _in_trained("--config=configs/demo.py", "--config.model.num_heads=3"),
    "config.model.d_model=128 is not divisible by config.model.num_heads=3",
  ),
  Case(
    "shape-mismatched checkpoint",
    _in_trained("--config=configs/demo.py", "--config.model.d_ff=256"),
    "params/decoder_0/ffn/wi/bias has shape (512,) in the checkpoint but (256,) in the model",
  ),
  Case(
    "eval of another model size",
    _in_trained("--config=configs/demo.py", "--mode=eval", "--config.model.num_layers=3"),
    "does not match the model",
  ),
  Case("translate without a checkpoint", _no_checkpoint, "No checkpoint in", trained=False),
  Case(
    "workdir is an existing file",
    _workdir_is_a_file,
    "notes.txt exists and is not a directory",
    trained=False,
  ),
  Case(
    "missing translate input",
    _in_trained("--config=configs/demo.py", "--mode=translate", "--input={base}/nothere.txt"),
    "nothere.txt: no such file",
  ),
  Case(
    "bad UTF-8 in translate input",
    _translate_bad_utf8,
    "in.txt:2: invalid UTF-8 (byte 0xc3 at column 1)",
  ),
  Case(
    "fine-tuning from a missing workdir",
    _fine_tuning("{base}/nothere"),
    "/nothere: not a trained workdir",
    trained=False,
  ),
  Case(
    "fine-tuning from a folder without checkpoints",
    _fine_tuning("{base}/not_a_run"),
    "/not_a_run: not a trained workdir",
    trained=False,
  ),
  Case(
    "fine-tuning with another architecture",
    _fine_tuning("{trained}", "--config.model.num_heads=2"),
    "trained with model.num_heads=4 where this config has 2",
    trained=False,
  ),
  Case(
    "unknown learning-rate schedule",
    _in_trained("--config=configs/demo.py", "--config.optim.schedule=cosine"),
    "config.optim.schedule must be one of ['paper', 'constant'], got 'cosine'",
  ),
  Case(
    "n-best above the beam",
    _translating("--config.decode.beam_size=2", "--nbest=3"),
    "--nbest=3 is more than config.decode.beam_size=2",
  ),
  Case(
    "missing ensemble member",
    _translating("--ensemble={base}/nothere"),
    "--ensemble member",
  ),
  Case(
    "ensemble member with another vocabulary",
    _member_with_other_vocabulary,
    "its vocabulary",
  ),
  Case(
    "ensemble member with another head count",
    _member_with_other_heads,
    "it was trained with model.num_heads=2 where this config has 4",
  ),
  Case(
    "ema_decay outside [0, 1)",
    _in_trained("--config=configs/demo.py", "--config.optim.ema_decay=1.0"),
    "config.optim.ema_decay must be in [0, 1), got 1.0",
  ),
  Case(
    "unknown best metric",
    _in_trained("--config=configs/demo.py", "--config.best_metric=bleu"),
    "config.best_metric must be one of ['', 'dev_bleu', 'dev_loss'], got 'bleu'",
  ),
  Case(
    "negative patience",
    _in_trained(
      "--config=configs/demo.py",
      "--config.best_metric=dev_loss",
      "--config.early_stopping_patience=-1",
    ),
    "config.early_stopping_patience must be >= 0, got -1",
  ),
  Case(
    "patience without a best metric",
    _in_trained("--config=configs/demo.py", "--config.early_stopping_patience=3"),
    "config.early_stopping_patience=3 needs config.best_metric",
  ),
  Case(
    "ema of a run that kept none",
    _translating("--checkpoint=ema"),
    "was not trained with config.optim.ema_decay > 0",
  ),
  Case(
    "best of a run that kept none",
    _translating("--checkpoint=best"),
    "--checkpoint=best: no best checkpoint in",
  ),
  Case(
    "negative sampling temperature",
    _translating("--config.decode.method=sample", "--config.decode.temperature=-0.5"),
    "config.decode.temperature must be > 0, got -0.5",
  ),
  Case(
    "top_p outside (0, 1]",
    _translating("--config.decode.method=sample", "--config.decode.top_p=1.5"),
    "config.decode.top_p must be in (0, 1], got 1.5",
  ),
  Case(
    "more checkpoints to average than saved",
    _in_trained("--config=configs/demo.py", "--mode=average", "--num_checkpoints=3"),
    "--num_checkpoints=3, but",
  ),
  Case(
    "missing config file",
    _in_trained("--config=configs/nothere.py"),
    "--config=configs/nothere.py: no such file",
  ),
  Case(
    "unknown flag",
    _in_trained("--config=configs/demo.py", "--modee=eval"),
    "Unknown command line flag 'modee'",
  ),
  Case(
    "config value of the wrong type",
    _in_trained("--config=configs/demo.py", "--config.model.d_ff=big"),
    "flag --config.model.d_ff=big",
  ),
  Case(
    "float16",
    _in_trained("--config=configs/demo.py", "--config.model.dtype=float16"),
    "config.model.dtype='float16' is not supported",
  ),
  Case(
    "missing data folder",
    _in_trained(
      "--config=configs/demo.py", "--config.data.source=files", "--config.data.dir={base}/m30k"
    ),
    "/m30k': no such folder",
  ),
  Case(
    "half-set multi-process variables",
    _in_trained("--config=configs/demo.py", "ENV:JAX_COORDINATOR_ADDRESS=127.0.0.1:1"),
    "JAX_COORDINATOR_ADDRESS is set but JAX_NUM_PROCESSES and JAX_PROCESS_ID not",
  ),
]


# Mistakes in the flags themselves: main.py's flag parsing prints the line and exits.
FLAG_CASES = {
  "mistyped config field",
  "missing config file",
  "unknown flag",
  "config value of the wrong type",
}


def _value(text: str) -> object:
  """A command-line override's value as the flag parser reads it (ints, floats, bools, strings)."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _run_mode(args: list[str]) -> None:
  """What `cli.main` runs for these arguments, in this process (overrides as the API takes them)."""
  flag = dict(a[2:].split("=", 1) for a in args)
  overrides = {k[len("config.") :]: _value(v) for k, v in flag.items() if k.startswith("config.")}
  parallel.maybe_initialize_distributed("auto")
  config = api.load_config(flag["config"], overrides)
  workdir, mode = flag["workdir"], flag.get("mode", "train")
  members = tuple(m for m in flag.get("ensemble", "").split(",") if m)
  which = flag.get("checkpoint", "auto")
  if mode == "train":
    modes.train(config, workdir)
  elif mode == "eval":
    modes.evaluate(config, workdir, which, members)
  elif mode == "translate":
    outputs = modes.Outputs(int(flag.get("nbest", 1)), "alignments" in flag, members)
    modes.translate(config, workdir, which, flag["input"], "-", outputs)
  elif mode == "average":
    modes.average(config, workdir, int(flag["num_checkpoints"]), which)
  else:
    raise AssertionError(f"no such mode in the table: {mode}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_one_line_exit_2_and_nothing_touched(case, trained_demo, tmp_path, monkeypatch, capsys):
  _, trained = trained_demo
  monkeypatch.chdir(helpers.REPO)  # the paths in the arguments are a clone's (configs/demo.py)
  args = case.setup(tmp_path, trained)
  for name, value in (a[4:].split("=", 1) for a in args if a.startswith("ENV:")):
    monkeypatch.setenv(name, value)
  args = [a for a in args if not a.startswith("ENV:")]
  workdir = pathlib.Path(args[0].split("=", 1)[1]) if case.trained else None
  before = helpers.snapshot(workdir) if workdir else {}
  if case.name in FLAG_CASES:
    argv, saved = ["main.py", *args], sys.argv[:]
    sys.argv[:] = argv  # ml_collections finds `--config.x=y` overrides in sys.argv itself
    try:
      with pytest.raises(SystemExit) as exit_info:
        cli.parse_flags(argv)
    finally:
      sys.argv[:] = saved
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    line = lines[0]
  else:
    with pytest.raises(errors.UserError) as error_info:
      _run_mode(args)
    line = f"error: {' '.join(str(error_info.value).split())}"  # exactly what cli.main prints
  assert case.culprit in line, line
  print(f"{case.name}: {line}")
  if workdir is not None:
    assert before and helpers.snapshot(workdir) == before
    assert (workdir / "checkpoints").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize(
  "name", ["shape-mismatched checkpoint", "unknown flag"], ids=["mode error", "flag error"]
)
def test_main_py_prints_one_line_exits_2_and_touches_nothing(name, trained_demo, tmp_path):
  """The wrapper end to end, as a user runs it: a mistake found deep in a mode and one in the
  flags, each the last line of stderr, exit status 2, no traceback."""
  (case,) = [c for c in CASES if c.name == name]
  _, trained = trained_demo
  args = case.setup(tmp_path, trained)
  workdir = pathlib.Path(args[0].split("=", 1)[1])
  before = helpers.snapshot(workdir)
  result = helpers.run_main(*args)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors_printed = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors_printed) == 1 and case.culprit in errors_printed[0], result.stderr[-3000:]
  assert errors_printed[0] == result.stderr.strip().splitlines()[-1]
  assert helpers.snapshot(workdir) == before


@pytest.mark.slow
def test_a_second_training_job_on_a_workdir_stops_at_once(tmp_path):
  """A real training job holds the workdir; a second one names it, and leaves it be."""
  workdir = tmp_path / "w"
  first = subprocess.Popen(
    [
      sys.executable,
      "main.py",
      "--config=configs/demo.py",
      f"--workdir={workdir}",
      "--config.num_train_steps=100000",
      "--config.data.demo_train_size=2000",
      "--config.checkpoint_every_steps=100000",
      "--config.log_every_steps=1",
    ],
    cwd=helpers.REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    lock, training = workdir / "train.lock", workdir / "train_metrics.jsonl"
    deadline = time.time() + 120
    while not training.exists() and first.poll() is None and time.time() < deadline:
      time.sleep(0.2)  # until the first job trains (and handles SIGTERM as a preemption)
    assert training.exists(), first.stderr.read() if first.poll() is not None else "not training"
    held = lock.read_text()
    second = helpers.run_main("--config=configs/demo.py", f"--workdir={workdir}")
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "another training job holds this workdir" in line
    assert f"pid {first.pid}" in line and "host " in line and "started " in line
    print(line)
    assert lock.read_text() == held and first.poll() is None  # the first job goes on
  finally:
    first.send_signal(signal.SIGTERM)  # a preemption: it saves and exits cleanly
    _, err = first.communicate(timeout=120)
  assert first.returncode == 0, err[-3000:]
  assert not lock.exists()


@pytest.mark.slow
def test_an_internal_error_keeps_its_traceback(tmp_path):
  """A bug (here: the train step raising) is not a user error: the traceback shows where."""
  script = tmp_path / "broken_main.py"
  script.write_text(
    "import runpy, sys\n"
    f"sys.path.insert(0, {str(helpers.REPO)!r})\n"
    "from flaxformer_nmt import steps\n"
    "def broken(*args, **kwargs):\n"
    "  raise KeyError('a bug inside the train step')\n"
    "steps.train_step = broken\n"
    f"sys.argv[0] = {str(helpers.REPO / 'main.py')!r}\n"
    f"runpy.run_path({str(helpers.REPO / 'main.py')!r}, run_name='__main__')\n"
  )
  result = subprocess.run(
    [
      sys.executable,
      str(script),
      "--config=configs/demo.py",
      f"--workdir={tmp_path / 'w'}",
      "--config.data.demo_train_size=500",
    ],
    cwd=helpers.REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback (most recent call last)" in result.stderr
  assert "in broken" in result.stderr and "KeyError: 'a bug inside the train step'" in (
    result.stderr
  )
  assert "error: " not in result.stderr
  assert not (tmp_path / "w" / "train.lock").exists()  # released on the way out
