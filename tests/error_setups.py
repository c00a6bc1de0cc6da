"""How each user mistake of tests/error_cases.py's table is set up: a tiny files corpus (whole or
damaged), a copy of the committed trained workdir, fine-tuning and translating arguments, a port
another program holds. Each builder takes a fresh folder and the trained workdir and returns the
main.py arguments of its case."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import socket
from collections.abc import Callable

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


def copy_trained(base: pathlib.Path, trained: pathlib.Path) -> pathlib.Path:
  workdir = base / "workdir"
  shutil.copytree(trained, workdir)
  return workdir


def in_trained(*args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    return [f"--workdir={copy_trained(base, trained)}", *[a.format(base=base) for a in args]]

  return setup


def copy_trained_before_config_json(base: pathlib.Path, trained: pathlib.Path) -> pathlib.Path:
  """A copy of the trained run without its config.json, as runs trained before it existed are:
  its commands use the config they are given (config/run_config.py rules only runs that saved
  theirs), so a config that disagrees with the run reaches the data and shape checks."""
  workdir = copy_trained(base, trained)
  (workdir / "config.json").unlink()
  return workdir


def in_trained_before_config_json(*args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    workdir = copy_trained_before_config_json(base, trained)
    return [f"--workdir={workdir}", *[a.format(base=base) for a in args]]

  return setup


def bad_corpus(**damage: bytes | None) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    return [
      f"--workdir={copy_trained_before_config_json(base, trained)}",
      *_files_config(_corpus(base / "c", **damage)),
    ]

  return setup


def fine_tuning(init_from: str, *args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """A new workdir (nothing to resume) fine-tuning from `init_from` ({trained}: a copy of the
  trained demo)."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    (base / "not_a_run").mkdir()
    source = init_from.format(base=base, trained=copy_trained(base, trained))
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


def workdir_is_a_file(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  (base / "notes.txt").write_text("my notes\n")
  return [f"--workdir={base / 'notes.txt'}", "--config=configs/demo.py"]


def no_checkpoint(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  (base / "empty").mkdir()
  return [
    f"--workdir={base / 'empty'}",
    "--config=configs/demo.py",
    "--mode=translate",
    f"--input={_translate_input(base)}",
  ]


def translate_bad_utf8(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  (base / "in.txt").write_bytes(b"three\n\xc3(\n")
  return [
    f"--workdir={copy_trained(base, trained)}",
    "--config=configs/demo.py",
    "--mode=translate",
    f"--input={base / 'in.txt'}",
  ]


def translating(*args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """A translate command on a copy of the trained workdir, with a real input file."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    workdir = copy_trained(base, trained)
    formatted = [a.format(base=base) for a in args]
    return [
      f"--workdir={workdir}",
      "--config=configs/demo.py",
      "--mode=translate",
      f"--input={_translate_input(base)}",
      *formatted,
    ]

  return setup


def kept_none(what: str, *args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """A translate command on a copy of the trained workdir made to look like a run that kept no
  parameter average (its config.json says ema_decay 0) or no best/ folder."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    args_out = translating(*args)(base, trained)
    workdir = base / "workdir"
    if what == "ema":
      saved = json.loads((workdir / "config.json").read_text())
      saved["optim"]["ema_decay"] = 0.0
      (workdir / "config.json").write_text(json.dumps(saved))
    else:
      shutil.rmtree(workdir / "best")
    return args_out

  return setup


def member_with_other_vocabulary(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  other = base / "other"
  shutil.copytree(trained, other)
  (other / "spm.model").write_bytes(b"a vocabulary of another run")
  return translating(f"--ensemble={other}")(base, trained)


def member_with_other_heads(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  """Same parameter shapes, another architecture: only the saved config.json tells."""
  other = base / "other"
  shutil.copytree(trained, other)
  saved = json.loads((other / "config.json").read_text())
  saved["model"]["num_heads"] = 4
  (other / "config.json").write_text(json.dumps(saved))
  return translating(f"--ensemble={other}")(base, trained)


def data_dir_under_a_file(*args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """--mode=prepare whose config.data.dir ({notes}) names a file, or a path under one."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    (base / "notes.txt").write_text("my notes\n")
    workdir = copy_trained_before_config_json(base, trained)
    formatted = [a.format(notes=base / "notes.txt") for a in args]
    return [f"--workdir={workdir}", "--mode=prepare", *formatted]

  return setup


TWO = ("\n".join(LINES[:2]) + "\n").encode()
_HELD: list[socket.socket] = []  # ports held for the "port another program holds" case


def busy_port() -> int:
  """A port on 127.0.0.1 that a socket of this process listens on (for as long as it runs)."""
  held = socket.socket()
  held.bind(("127.0.0.1", 0))
  held.listen()
  _HELD.append(held)
  return held.getsockname()[1]


def importing(
  name: str = "marian", tokenizer: dict[str, object] | None = None, **config: object
) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """--mode=import of a folder `name` whose config.json is a Marian model's (OPUS-MT's sizes)
  with `config` changed (and `tokenizer` as its tokenizer_config.json); the run it would make is
  new."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    del trained
    folder = base / name
    folder.mkdir()
    if tokenizer is not None:
      (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    marian = {
      "model_type": "marian",
      "vocab_size": 58101,
      "d_model": 512,
      "encoder_layers": 6,
      "decoder_layers": 6,
      "encoder_attention_heads": 8,
      "decoder_attention_heads": 8,
      "encoder_ffn_dim": 2048,
      "decoder_ffn_dim": 2048,
      "activation_function": "swish",
      "scale_embedding": True,
    }
    (folder / "config.json").write_text(json.dumps({**marian, **config}))
    return [f"--workdir={base / 'imported'}", "--mode=import", f"--input={folder}"]

  return setup


def transformers_folder(base: pathlib.Path) -> pathlib.Path:
  """A transformers model folder as a user has one (an export, an OPUS-MT download): its
  config.json is a MarianConfig's."""
  folder = base / "opus-mt-en-de"
  folder.mkdir(exist_ok=True)
  (folder / "config.json").write_text(json.dumps({"model_type": "marian", "d_model": 512}))
  return folder


def transformers_folder_as(how: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """A transformers model folder given where a run belongs: `--workdir` of a translate
  ("workdir"), `config.init_from` of a fine-tune ("init_from"), or one of our runs given to
  --mode=import as if it were a transformers model ("import_run")."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    if how == "import_run":
      run = copy_trained(base, trained)
      return [f"--workdir={base / 'imported'}", "--mode=import", f"--input={run}"]
    folder = transformers_folder(base)
    if how == "workdir":
      return [f"--workdir={folder}", "--mode=translate"]
    return [
      f"--workdir={base / 'fine'}",
      "--config=configs/demo.py",
      f"--config.init_from={folder}",
    ]

  return setup


def importing_into_a_users_folder(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  """--mode=import into an existing folder of the user's (a glossary in its vocabulary/): it
  must stay as it was."""
  args = importing()(base, trained)
  user = base / "userdir"
  (user / "vocabulary").mkdir(parents=True)
  (user / "vocabulary" / "glossary.txt").write_text("g\n")
  return [f"--workdir={user}", *args[1:]]


def vocabulary_changed_in_place(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
  """A resume of a run trained with data.vocab_path=DIR/v.model, that file since replaced in
  place by another (here: one byte of it changed)."""
  workdir = copy_trained(base, trained)
  vocab = base / "v.model"
  data = bytearray((workdir / "spm.model").read_bytes())
  saved = json.loads((workdir / "config.json").read_text())
  saved["data"]["vocab_path"] = str(vocab)
  (workdir / "config.json").write_text(json.dumps(saved, indent=2))
  data[-1] ^= 1
  vocab.write_bytes(bytes(data))
  return [f"--workdir={workdir}", "--config=configs/demo.py", f"--config.data.vocab_path={vocab}"]


def many_to_many(*args: str) -> Callable[[pathlib.Path, pathlib.Path], list[str]]:
  """A translate command on a copy of the trained workdir whose config.json says it is a
  many-to-many model (data.lang_tokens="m2m100", as an imported M2M100's does): the languages a
  request names are checked before anything else is read."""

  def setup(base: pathlib.Path, trained: pathlib.Path) -> list[str]:
    workdir = copy_trained(base, trained)
    config = json.loads((workdir / "config.json").read_text())
    config["data"].update(lang_tokens="m2m100", languages="en,de,fr", lang_tag_format="__{}__")
    (workdir / "config.json").write_text(json.dumps(config))
    return [
      f"--workdir={workdir}",
      "--mode=translate",
      f"--input={_translate_input(base)}",
      *[a.format(base=base) for a in args],
    ]

  return setup
