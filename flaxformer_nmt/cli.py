r"""The flaxformer_nmt command line: prepare, train, eval, translate, score, average, export, ...

  flaxformer-nmt --config=demo --workdir=runs/demo     # in a clone: python main.py --config=...
  flaxformer-nmt --config=wmt14_ende_base --workdir=runs/base --mode=prepare
  flaxformer-nmt --config=wmt14_ende_base --workdir=runs/base
  flaxformer-nmt --config=... --workdir=... --mode=eval
  flaxformer-nmt --config=... --workdir=... --mode=translate --input=in.txt --output=out.txt
  flaxformer-nmt --config=... --workdir=... --mode=translate --nbest=4 --ensemble=runs/seed1
  flaxformer-nmt --config=... --workdir=... --mode=translate --input=in.txt --constraints=terms.txt
  flaxformer-nmt --config=... --workdir=... --mode=score --input=src.txt --reference=tgt.txt
  flaxformer-nmt --config=... --workdir=... --mode=average --num_checkpoints=5
  flaxformer-nmt --config=... --workdir=... --mode=attention --text="a sentence"

--config takes an installed config's name (demo, multi30k, wmt14_ende_base:files, ...) or the path
of any config file. Any config field can be overridden, e.g. `--config.data.tokens_per_batch=12500`.
Rerunning a training command with the same workdir resumes; on a finished workdir it returns the
saved figures. Modes that report figures end with one JSON line.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from absl import app, flags
from ml_collections import config_flags

from flaxformer_nmt import cli_flags, errors, help_text
from flaxformer_nmt.config import builders as config_builders
from flaxformer_nmt.config import loading as config_files
from flaxformer_nmt.config import run_config
from flaxformer_nmt.run import saved_config as saved_run
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import console
from flaxformer_nmt.serving import flags as _serve_flags  # noqa: F401  (--host, --port, ...)

config_flags.DEFINE_config_file(
  "config",
  None,
  "Experiment config: an installed config's name (demo, multi30k, wmt14_ende_base, "
  "wmt14_ende_base:files, ...) or the path of a config file. Optional once training has saved "
  "<workdir>/config.json: the run's own config is used, and only what a command may change can "
  "differ from it (docs/runs.md).",
  lock_config=True,
)
flags.mark_flags_as_required(["workdir"])


def _user_error(message: object) -> NoReturn:
  """One line on stderr and exit status 2: what every mistake the user can fix ends in."""
  print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
  sys.exit(2)


def _config_spec(argv: list[str]) -> str | None:
  """The value of --config in `argv` (`path` or `path:argument`), if given."""
  return _flag_value(argv, "config")


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of --name in `argv` (`--name=value` or `--name value`), if given."""
  for i, arg in enumerate(argv[1:], 1):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _with_saved_config(argv: list[str]) -> list[str]:
  """`argv` with `--config` standing for the run's saved config.json when it is left out
  (run/saved_config.py); one line (exit 2) if the workdir saved none."""
  workdir = _flag_value(argv, "workdir")
  if workdir is None:
    return argv  # absl says --workdir is required
  if not os.path.isfile(Workdir(workdir).config_path):
    _user_error(
      f"--config is required: --workdir={workdir} has no {run_config.CONFIG_FILE} (no run has "
      "trained there yet, or it was trained before runs saved their config); pass the config "
      "it was trained with, e.g. --config=demo."
    )
  # Before the overrides: ml_collections defines --config.X once it has read --config.
  return [argv[0], f"--config={saved_run.PATH}:{os.path.abspath(workdir)}", *argv[1:]]


# The files a mode reads, checked before JAX is imported.
_READ_FLAGS = {
  "translate": ("input", "constraints"),
  "score": ("input", "reference"),
  "eval": ("constraints",),
}


def _check_input_early(argv: list[str]) -> None:
  """A missing --input (--reference, --constraints) is one line before JAX is imported (seconds
  sooner)."""
  for name in _READ_FLAGS.get(_flag_value(argv, "mode") or "", ()):
    path = _flag_value(argv, name)
    if path and path != "-" and not os.path.isfile(path):
      # The words data reading uses (runtime/files.iter_lines), which would say it later.
      what = "is a directory, not a text file" if os.path.isdir(path) else "no such file"
      _user_error(f"{path}: {what}.")


def _unknown_override(argv: list[str]) -> str | None:
  """A message for the first `--config.a.b=...` naming no field of the config, if any.

  ml_collections reports a mistyped override as a KeyError traceback deep in flag parsing;
  this names the flag and the closest valid field instead.
  """
  spec = _config_spec(argv)
  if spec is None:
    return None
  config = config_files.load(spec)
  for arg in argv[1:]:
    name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
    name = name[2:] if name.startswith("noconfig.") else name
    if not name.startswith("config."):
      continue
    missing = config_builders.missing_field(config, name.split(".", 1)[1])
    if missing is not None:
      what, close = missing
      return f"--{name}: {what}" + (f"; did you mean --config.{close}?" if close else ".")
  return None


def _with_config_path(argv: list[str]) -> list[str]:
  """`argv` with --config's name (`demo`, `wmt14_ende_base:files`) replaced by its file's path,
  which is what ml_collections' config flag loads."""
  out = list(argv)
  for i, arg in enumerate(out[1:], 1):
    if arg.startswith("--config="):
      out[i] = "--config=" + config_files.resolve(arg.split("=", 1)[1])
      return out
    if arg == "--config" and i + 1 < len(out):
      out[i + 1] = config_files.resolve(out[i + 1])
      return out
  return out


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every mistake in the flags reported as one line (exit status 2)."""
  _check_input_early(argv)
  if _config_spec(argv) is None and _flag_value(argv, "mode") != "import":
    argv = _with_saved_config(argv)
  spec = _config_spec(argv)
  try:
    argv = _with_config_path(argv)
    if spec is not None:
      # Loaded once here so that a wrong variant (`wmt14_table3:Z`, `demo:x`) is one line; inside
      # ml_collections' flag parsing it would surface as a traceback.
      config_files.load(spec)
  except errors.ConfigError as e:
    message = str(e)
    own = message.startswith("--config") or spec.startswith(saved_run.PATH)
    _user_error(message if own else f"--config={spec}: {message}")
  try:
    remaining = flags.FLAGS(argv)
    misused = cli_flags.mode_only_flag_misused()
    if misused:
      _user_error(misused)
    return remaining
  except flags.Error as e:
    message = str(e).rstrip(". ")
    _user_error(f"{message}{'' if message.endswith('?') else '.'} See --helpfull.")
  except (KeyError, AttributeError):
    message = _unknown_override(argv)
    if message is None:
      raise  # not a mistyped field: a bug, which keeps its traceback
    _user_error(message)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _user_error(f"Unexpected arguments: {' '.join(argv[1:])} (flags are --name=value).")
  if flags.FLAGS.verbosity < 1 and not flags.FLAGS.alsologtostderr:
    console.install_quiet()
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  try:
    if flags.FLAGS.mode == "serve":  # listens before JAX is imported (serving/launch.py)
      _serve(config, workdir)
      return
    # Imported here so `--help` and flag errors are instant (jax start-up takes seconds).
    from flaxformer_nmt import modes
    from flaxformer_nmt.runtime import parallel

    parallel.maybe_initialize_distributed(flags.FLAGS.distributed)
    if flags.FLAGS.mode == "prepare":
      modes.prepare(config, workdir)
    elif flags.FLAGS.mode == "train":
      modes.train(config, workdir, _given_config_name(), typed_fields(sys.argv))
    elif flags.FLAGS.mode == "eval":
      f = flags.FLAGS
      modes.evaluate(config, workdir, f.checkpoint, tuple(f.ensemble), f.constraints)
    elif flags.FLAGS.mode == "translate":
      f = flags.FLAGS
      outputs = modes.Outputs(
        f.nbest,
        f.alignments,
        tuple(f.ensemble),
        f.target_lang or None,
        f.constraints,
        f.source_lang or None,
      )
      modes.translate(config, workdir, f.checkpoint, f.input, f.output, outputs)
    elif flags.FLAGS.mode == "score":
      f = flags.FLAGS
      if not f.reference:
        raise errors.ConfigError("--mode=score needs --reference=FILE: the translations to score.")
      modes.score(
        config,
        workdir,
        f.checkpoint,
        f.input,
        f.reference,
        f.output,
        tuple(f.ensemble),
        f.target_lang or None,
        f.source_lang or None,
      )
    elif flags.FLAGS.mode == "average":
      modes.average(config, workdir, flags.FLAGS.num_checkpoints, flags.FLAGS.checkpoint)
    elif flags.FLAGS.mode == "attention":
      f = flags.FLAGS
      modes.attention(
        config,
        workdir,
        f.checkpoint,
        f.text,
        f.output,
        f.target_lang or None,
        f.source_lang or None,
      )
    elif flags.FLAGS.mode == "export":
      f = flags.FLAGS
      modes.export(config, workdir, f.checkpoint, f.format, f.output, f.quantization)
    elif flags.FLAGS.mode == "import":
      if config is not None:
        raise errors.ConfigError("--mode=import reads no --config: the model's own config.json.")
      if flags.FLAGS.input in ("", "-"):
        raise errors.ConfigError(
          "--mode=import needs --input=DIR (a transformers Marian model folder) or a Hub id."
        )
      modes.import_model(flags.FLAGS.input, workdir)
  except errors.UserError as e:
    # A mistake the user can fix: one clear line, no traceback, nothing saved is touched.
    # Anything else is a bug and keeps its traceback.
    _user_error(e)


def typed_fields(argv: list[str]) -> set[str]:
  """The config fields the command line sets itself: `model.num_heads` for
  --config.model.num_heads=8 (or `--config.model.num_heads 8`), `model.pre_ln` for
  --config.model.pre_ln and --noconfig.model.pre_ln."""
  out = set()
  for arg in argv[1:]:
    name = arg.lstrip("-").split("=", 1)[0] if arg.startswith("-") else ""
    name = name[2:] if name.startswith("noconfig.") else name
    if name.startswith("config."):
      out.add(name.split(".", 1)[1])
  return out


def _given_config_name() -> str:
  """What --config named on the command line (`demo`, `configs/demo.py`), "" when it was left
  out (then the run's own config.json stands for it)."""
  spec = _config_spec(sys.argv) or ""
  return "" if spec.startswith(saved_run.PATH) else spec


def _serve(config: Any, workdir: str) -> None:
  from flaxformer_nmt.serving import launch  # no JAX: the server listens first
  from flaxformer_nmt.serving.options import Options

  f = flags.FLAGS
  options = Options(
    host=f.host,
    port=f.port,
    max_wait_ms=f.max_wait_ms,
    max_request_bytes=f.max_request_bytes,
    queue_size=f.queue_size,
    max_request_lines=f.max_request_lines,
    queue_lines=f.queue_lines,
    grace_s=f.grace_s,
    allowed_hosts=tuple(f.allowed_hosts),
    allowed_origins=tuple(f.allowed_origins),
    token=f.token,
    target_lang=f.target_lang,
    source_lang=f.source_lang,
  )

  def load() -> Any:  # on the server's loader thread: JAX is imported here, not before listening
    from flaxformer_nmt import modes  # pylint: disable=g-import-not-at-top

    return modes.serving_model(
      config,
      workdir,
      f.checkpoint,
      tuple(f.ensemble),
      f.distributed,
      f.target_lang,
      f.source_lang,
    )

  launch.run(workdir, load, options)


def full_help() -> str:
  """`--helpfull`: every flag with its whole help, this program's first, then absl's."""
  ours = __name__
  others = sorted(m for m in flags.FLAGS.flags_by_module_dict() if m != ours)
  return "\n\n".join(flags.FLAGS.module_help(m).strip("\n") for m in [ours, *others])


_HELP = ("--help", "-help", "-h", "-?", "--helpshort")


def run() -> None:
  """The entry point of `flaxformer-nmt` and of `python main.py`."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  program = "flaxformer-nmt" if not sys.argv[0].endswith(".py") else "python main.py"
  text = None
  if "--version" in sys.argv[1:]:
    text = f"flaxformer_nmt {help_text.version()}"
  elif "--helpfull" in sys.argv[1:]:
    text = full_help()
  elif any(arg in _HELP for arg in sys.argv[1:]):
    text = help_text.usage(program)
  if text is not None:
    try:
      print(text)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
      pass
    sys.exit(0)
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
