"""Runs a case of tests/error_cases.py's table as `cli.main` would, in this process: the mode
functions with the case's overrides as the API takes them (tests/unit/test_errors.py)."""

from __future__ import annotations

import ast

from flaxformer_nmt import api, modes
from flaxformer_nmt.runtime import parallel


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
  workdir, mode = flag["workdir"], flag.get("mode", "train")
  if mode == "import":  # reads no config (cli.main: the model's own)
    modes.import_model(flag["input"], workdir)
    raise AssertionError("--mode=import got past its checks")
  # No --config: the run's own (cli.main reads its config.json).
  config = api.load_config(flag["config"], overrides) if "config" in flag else None
  members = tuple(m for m in flag.get("ensemble", "").split(",") if m)
  which = flag.get("checkpoint", "auto")
  if mode == "train":
    modes.train(config, workdir)
  elif mode == "eval":
    modes.evaluate(config, workdir, which, members)
  elif mode == "translate":
    outputs = modes.Outputs(
      int(flag.get("nbest", 1)),
      "alignments" in flag,
      members,
      flag.get("target_lang") or None,
      source_lang=flag.get("source_lang") or None,
    )
    modes.translate(config, workdir, which, flag["input"], flag.get("output", "-"), outputs)
  elif mode == "average":
    modes.average(config, workdir, int(flag["num_checkpoints"]), which)
  elif mode == "prepare":
    modes.prepare(config, workdir)
  elif mode == "serve":
    from flaxformer_nmt.serving import options as serve_options  # noqa: PLC0415

    # What serving/launch.py checks before it listens, then what its loader checks.
    serve_options.Options(port=int(flag.get("port", 8080))).check()
    modes.serving_model(config, workdir, which, members)
    raise AssertionError("--mode=serve got past its checks and would have served")
  elif mode == "export":
    fmt, quantization = flag.get("format", "ctranslate2"), flag.get("quantization", "float32")
    modes.export(config, workdir, which, fmt, flag["output"], quantization)
  else:
    raise AssertionError(f"no such mode in the table: {mode}")
