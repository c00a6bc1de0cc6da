"""Which package modules one command crosses, and how often a call climbs back up to a higher one.

  python tools/call_path.py --scenario=translate --workdir=runs/demo   # a trained demo workdir
  python tools/call_path.py --scenario=train_setup --workdir=runs/demo  # resume set-up
  python tools/call_path.py --scenario=translate --workdir=COPY --config=  # its own config.json

Also counted: how often the vocabulary is loaded (`Tokenizer.__init__`) and the model's parameters
are initialised or shaped (`init_params`, also under jax.eval_shape).

`translate` traces `api.translate` of three lines (the whole command). `train_setup` copies the
workdir, asks for 10 more steps with `api.train`, and traces until the first training step is
dispatched (the set-up before it: checks, vocabulary, data, model, restore).

A call *climbs* when its callee's module imports the caller's (directly or through others): the
call goes back up, through a callback (pmap's wrapper calling the function it was given, a search
calling its step function) or an object handed down. A *hidden edge* is a call into a module that
the caller's neither imports nor is imported by: reached through an import inside a function or
an object handed over. The import graph is read from the package's source (module-level `import`
statements only), so the same rule judges any version of the package. Last line: JSON
{"modules": [...], "num_climbs": N, "num_hidden_edges": N, ...}.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import shutil
import sys
import tempfile

PACKAGE = "flaxformer_nmt"


def module_level_imports(root: pathlib.Path) -> dict[str, set[str]]:
  """{module: package modules it imports at module level} for every module under `root`."""
  paths = sorted(root.rglob("*.py"))

  def name(p: pathlib.Path) -> str:
    parts = p.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

  modules = {name(p) for p in paths}
  graph: dict[str, set[str]] = {}
  for p in paths:
    found: set[str] = set()
    for node in ast.parse(p.read_text()).body:  # module level only
      if isinstance(node, ast.Import):
        found |= {a.name for a in node.names if a.name in modules}
      elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
        for alias in node.names:
          sub = f"{node.module}.{alias.name}"
          found.add(sub if sub in modules else node.module)
    graph[name(p)] = {m for m in found if m in modules}
  return graph


def reachable(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  out: dict[str, set[str]] = {}
  for start in graph:
    seen, todo = set(), [start]
    while todo:
      for nxt in graph.get(todo.pop(), ()):
        if nxt not in seen:
          seen.add(nxt)
          todo.append(nxt)
    out[start] = seen
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scenario", choices=("translate", "train_setup"), required=True)
  parser.add_argument("--workdir", required=True)
  parser.add_argument(
    "--config",
    default="demo",
    help="a config name or path; empty (translate only): the run's own config.json",
  )
  args = parser.parse_args()
  if not args.config and args.scenario != "translate":
    parser.error("--config= (the run's own config) is for --scenario=translate only")

  import flaxformer_nmt  # noqa: F401  (after sys.path is as the caller set it)
  from flaxformer_nmt import api

  root = pathlib.Path(flaxformer_nmt.__file__).resolve().parent
  below = reachable(module_level_imports(root))
  entered: list[str] = []
  climbs: list[str] = []
  hidden: list[str] = []
  stop = {"now": False}
  counts = {"tokenizer_loads": 0, "init_params_calls": 0}

  def module_of(frame) -> str | None:
    path = pathlib.Path(frame.f_code.co_filename).resolve()
    try:
      rel = path.relative_to(root)
    except ValueError:
      return None
    parts = (PACKAGE, *rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

  def profile(frame, event, arg):  # noqa: ARG001
    if event != "call" or stop["now"] or frame.f_code.co_name == "<module>":
      return
    if frame.f_back is not None and frame.f_back.f_code.co_name == "<module>":
      return  # import-time work: class bodies, decorators, module-level calls
    callee = module_of(frame)
    if callee is None:
      return
    if (
      args.scenario == "train_setup"
      and frame.f_code.co_name == "train_step"
      and callee.endswith(".steps")
    ):
      stop["now"] = True
      return
    if callee not in entered:
      entered.append(callee)
    code = frame.f_code
    if code.co_name == "__init__" and frame.f_locals.get("self").__class__.__name__ == "Tokenizer":
      counts["tokenizer_loads"] += 1
    if code.co_name == "init_params":
      counts["init_params_calls"] += 1
    caller_frame = frame.f_back
    while caller_frame is not None and module_of(caller_frame) is None:
      caller_frame = caller_frame.f_back  # through jax, functools, ... to our caller
    caller = module_of(caller_frame) if caller_frame is not None else None
    if not caller or caller == callee or callee in below.get(caller, set()):
      return
    edge = f"{caller}.{caller_frame.f_code.co_name} -> {callee}.{frame.f_code.co_name}"
    # A callee that imports the caller is above it: a callback (pmap's wrapper calling the
    # function it was given, a search calling its step function). One that neither imports
    # nor is imported by the caller was reached through an import inside a function or an
    # object handed over.
    (climbs if caller in below.get(callee, set()) else hidden).append(edge)

  config = api.load_config(args.config) if args.config else None
  workdir = args.workdir
  if args.scenario == "train_setup":
    copy = os.path.join(tempfile.mkdtemp(), "workdir")
    shutil.copytree(args.workdir, copy)
    for name in ("train_result.json",):
      if os.path.exists(os.path.join(copy, name)):
        os.remove(os.path.join(copy, name))
    workdir = copy
    saved = json.load(open(os.path.join(copy, "config.json")))
    config = api.load_config(args.config, {"num_train_steps": saved["num_train_steps"] + 10})
  sys.setprofile(profile)
  try:
    if args.scenario == "translate":
      api.translate(config, workdir, ["We need forty-two chairs.", "I am ten years old.", ""])
    else:
      api.train(config, workdir)
  finally:
    sys.setprofile(None)
  distinct_climbs, distinct_hidden = sorted(set(climbs)), sorted(set(hidden))
  for line in distinct_climbs:
    print("climb:", line)
  for line in distinct_hidden:
    print("hidden edge:", line)
  print(
    json.dumps(
      {
        "scenario": args.scenario,
        "modules": entered,
        "num_modules": len(entered),
        "num_climbs": len(distinct_climbs),
        "num_hidden_edges": len(distinct_hidden),
        **counts,
      }
    )
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
