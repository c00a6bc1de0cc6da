"""The table of user mistakes that tests/unit/test_errors.py runs (and tests/e2e/test_errors.py, two
of them, through main.py): how each is set up, and the culprit its one line must name; `run_mode`
runs a case's arguments as `cli.main` would, in this process."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import shutil
import socket
from collections.abc import Callable

from flaxformer_nmt import api, modes
from flaxformer_nmt.runtime import parallel

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


def _kept_none(what: str, *args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """A translate command on a copy of the trained workdir made to look like a run that kept no
  parameter average (its config.json says ema_decay 0) or no best/ folder."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    args_out = _translating(*args)(base, trained)
    workdir = base / "workdir"
    if what == "ema":
      saved = json.loads((workdir / "config.json").read_text())
      saved["optim"]["ema_decay"] = 0.0
      (workdir / "config.json").write_text(json.dumps(saved))
    else:
      shutil.rmtree(workdir / "best")
    return args_out

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
  saved["model"]["num_heads"] = 4
  (other / "config.json").write_text(json.dumps(saved))
  return _translating(f"--ensemble={other}")(base, trained)


def _data_dir_under_a_file(*args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """--mode=prepare whose config.data.dir ({notes}) names a file, or a path under one."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    (base / "notes.txt").write_text("my notes\n")
    workdir = _trained(base, trained)
    formatted = [a.format(notes=base / "notes.txt") for a in args]
    return [f"--workdir={workdir}", "--mode=prepare", *formatted]

  return setup


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
    "config.model.d_model=16 is not divisible by config.model.num_heads=3",
  ),
  Case(
    "narrow keys on the jax attention path",
    _in_trained("--config=configs/demo.py", "--config.model.d_k=2", "--config.model.attention=jax"),
    "config.model.attention='jax' needs keys as wide as values, but config.model.d_k=2",
  ),
  Case(
    "export of a model CTranslate2 cannot hold",
    _in_trained(
      "--config=configs/demo.py", "--mode=export", "--config.model.d_k=2", "--output={base}/ct2"
    ),
    "config.model.d_k=2: CTranslate2's attention splits queries, keys and values",
  ),
  Case(
    "shape-mismatched checkpoint",
    _in_trained("--config=configs/demo.py", "--config.model.d_ff=256"),
    "params/decoder_0/ffn/wi/bias has shape (32,) in the checkpoint but (256,) in the model",
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
    _fine_tuning("{trained}", "--config.model.num_heads=4"),
    "trained with model.num_heads=2 where this config has 4",
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
    "n-best list asked of eval",
    _in_trained("--config=configs/demo.py", "--mode=eval", "--nbest=2"),
    "--nbest is read by --mode=translate only, not by --mode=eval",
  ),
  Case(
    "a server flag given to another mode",
    _in_trained("--config=configs/demo.py", "--mode=eval", "--port=9000"),
    "--port is read by --mode=serve only, not by --mode=eval",
  ),
  Case(
    "serve on a port another program holds",
    lambda base, trained: [
      f"--workdir={_trained(base, trained)}",
      "--config=configs/demo.py",
      "--mode=serve",
      f"--port={_busy_port()}",
    ],
    "cannot listen there (Address already in use)",
  ),
  Case(
    "serve on a port that cannot be",
    _in_trained("--config=configs/demo.py", "--mode=serve", "--port=70000"),
    "--port=70000: give a port number in [1, 65535]",
  ),
  Case(
    "ensemble member with another vocabulary",
    _member_with_other_vocabulary,
    "its vocabulary",
  ),
  Case(
    "ensemble member with another head count",
    _member_with_other_heads,
    "it was trained with model.num_heads=4 where this config has 2",
  ),
  Case(
    "ema_decay outside [0, 1)",
    _in_trained("--config=configs/demo.py", "--config.optim.ema_decay=1.0"),
    "config.optim.ema_decay must be in [0, 1), got 1.0",
  ),
  Case(
    "EMA turned off in a run under way",
    _in_trained("--config=configs/demo.py", "--config.optim.ema_decay=0.0"),
    "config.optim.ema_decay=0, but the checkpoints in",
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
    _in_trained(
      "--config=configs/demo.py", "--config.best_metric=", "--config.early_stopping_patience=3"
    ),
    "config.early_stopping_patience=3 needs config.best_metric",
  ),
  Case(
    "ema of a run that kept none",
    _kept_none("ema", "--checkpoint=ema"),
    "was not trained with config.optim.ema_decay > 0",
  ),
  Case(
    "best of a run that kept none",
    _kept_none("best", "--checkpoint=best"),
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
    _in_trained("--config=configs/demo.py", "--mode=average", "--num_checkpoints=4"),
    "--num_checkpoints=4, but",
  ),
  Case(
    "missing config file",
    _in_trained("--config=configs/nothere.py"),
    "--config=configs/nothere.py: no such file",
  ),
  Case(
    "unknown config variant",
    _in_trained("--config=wmt14_table3:Z9"),
    "--config=wmt14_table3:Z9: Unknown Table 3 row 'Z9'",
  ),
  Case(
    "unknown WMT14 data variant",
    _in_trained("--config=wmt14_ende_base:bogus"),
    "--config=wmt14_ende_base:bogus: Unknown WMT14 data 'bogus'",
  ),
  Case(
    "a variant of a config that has none",
    _in_trained("--config=demo:foo"),
    "--config=demo:foo: demo.py takes no argument after ':'",
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
    "translate output is a folder",
    _translating("--output={base}"),
    "is a folder; name a file",
  ),
  Case(
    "translate output under a file",
    _translating("--output={base}/in.txt/out.txt"),
    "in.txt is a file, not a folder",
  ),
  Case(
    "prepare into a data folder that is a file",
    _data_dir_under_a_file(
      "--config=configs/demo.py", "--config.data.source=files", "--config.data.dir={notes}"
    ),
    "notes.txt': is a file, not the folder of the corpus",
  ),
  Case(
    "prepare a download under a file",
    _data_dir_under_a_file("--config=configs/multi30k.py", "--config.data.dir={notes}/m30k"),
    "notes.txt/m30k: cannot create the folder",
  ),
  Case(
    "sampling seed beyond 32 bits",
    _translating("--config.decode.method=sample", "--config.decode.seed=4294967296"),
    "config.decode.seed must be an integer in [0, 2**32), got 4294967296",
  ),
  Case(
    "half-set multi-process variables",
    _in_trained("--config=configs/demo.py", "ENV:JAX_COORDINATOR_ADDRESS=127.0.0.1:1"),
    "JAX_COORDINATOR_ADDRESS is set but JAX_NUM_PROCESSES and JAX_PROCESS_ID not",
  ),
]


# Mistakes in the flags themselves: main.py's flag parsing prints the line and exits.
FLAG_CASES = {
  "n-best list asked of eval",
  "a server flag given to another mode",
  "mistyped config field",
  "missing config file",
  "unknown config variant",
  "unknown WMT14 data variant",
  "a variant of a config that has none",
  "unknown flag",
  "config value of the wrong type",
}


_HELD: list[socket.socket] = []  # ports held for the "port another program holds" case


def _busy_port() -> int:
  """A port on 127.0.0.1 that a socket of this process listens on (for as long as it runs)."""
  held = socket.socket()
  held.bind(("127.0.0.1", 0))
  held.listen()
  _HELD.append(held)
  return held.getsockname()[1]


def arguments(case: Case, base: pathlib.Path) -> list[str]:
  """The case's main.py arguments, set up in `base` on a copy of the committed small trained
  workdir (helpers.SAVED_RUN), with that run's config overrides right after
  `--config=configs/demo.py` (the case's own overrides come after them, and win). A flag mistake
  is refused while the flags are parsed, before any work, so it gets none."""
  args = case.setup(base, helpers.SAVED_RUN)
  if case.name in FLAG_CASES or "--config=configs/demo.py" not in args:
    return args
  at = args.index("--config=configs/demo.py") + 1
  return [*args[:at], *helpers.saved_run_flags(), *args[at:]]


def _value(text: str) -> object:
  """A command-line override's value as the flag parser reads it (ints, floats, bools, strings)."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def run_mode(args: list[str]) -> None:
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
    modes.translate(config, workdir, which, flag["input"], flag.get("output", "-"), outputs)
  elif mode == "average":
    modes.average(config, workdir, int(flag["num_checkpoints"]), which)
  elif mode == "prepare":
    modes.prepare(config, workdir)
  elif mode == "serve":
    from flaxformer_nmt.serving import options as serve_options  # noqa: PLC0415
    from flaxformer_nmt.serving import service  # noqa: PLC0415

    def served(*args: object) -> None:  # a check that let it through would serve forever
      raise AssertionError("--mode=serve got past its checks and would have served")

    options = serve_options.Options(port=int(flag.get("port", 8080)))
    original, service.run = service.run, served
    try:
      modes.serve(config, workdir, which, members, options)
    finally:
      service.run = original
  elif mode == "export":
    fmt, quantization = flag.get("format", "ctranslate2"), flag.get("quantization", "float32")
    modes.export(config, workdir, which, fmt, flag["output"], quantization)
  else:
    raise AssertionError(f"no such mode in the table: {mode}")
