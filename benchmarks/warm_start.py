r"""A second command starts warm: translate and server start, cold and warm compilation cache.

  python benchmarks/warm_start.py --workdir=runs/demo      # the quick start's trained demo

For each command, the compilation cache (a fresh folder of this run's, through
FLAXFORMER_NMT_COMPILE_CACHE) is cleared, then the command runs twice as a user types it, with the
run's own config (`--workdir` alone):
1. `--mode=translate` of two lines, from start to exit;
2. `--mode=serve` on a free port, from start until `/health` says "ok" (ready), then SIGTERM.
The second run of each finds the first's programs in the cache. Each figure is the wall-clock time
of the whole command, JAX's start-up included (what a user waits for); `ratio` is warm / cold.
Last line JSON, recorded in benchmarks/results/<--record>.json (default warm_start).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from absl import app, flags

from flaxformer_nmt.benchmarking import record

_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "A trained workdir (with config.json).")
_SERVE = flags.DEFINE_bool("serve", True, "Also time the server's start (the [serve] extra).")
_TIMEOUT_S = flags.DEFINE_integer("timeout_s", 900, "The longest one command may take.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = "three hundred and forty-five\nWe need forty-two chairs.\n"


def _command(*flags_: str) -> list[str]:
  return [sys.executable, os.path.join(REPO, "main.py"), f"--workdir={_WORKDIR.value}", *flags_]


def _translate(env: dict[str, str], scratch: str) -> float:
  """Seconds of one `--mode=translate` of two lines, start to exit."""
  source = os.path.join(scratch, "in.txt")
  with open(source, "w", encoding="utf-8") as f:
    f.write(LINES)
  start = time.perf_counter()
  subprocess.run(
    _command("--mode=translate", f"--input={source}", f"--output={scratch}/out.txt"),
    env=env,
    check=True,
    capture_output=True,
    timeout=_TIMEOUT_S.value,
  )
  return time.perf_counter() - start


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _serve(env: dict[str, str], scratch: str) -> float:
  """Seconds from starting `--mode=serve` until /health says it is ready ("ok": it answers
  "starting" while it loads and compiles); the server is then stopped with SIGTERM and must exit
  0."""
  port = _free_port()
  with open(os.path.join(scratch, f"serve_{port}.log"), "w", encoding="utf-8") as log:
    start = time.perf_counter()
    server = subprocess.Popen(
      _command("--mode=serve", f"--port={port}"), env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
      while True:
        if server.poll() is not None:
          raise RuntimeError(f"the server exited with {server.returncode}; see {log.name}")
        if time.perf_counter() - start > _TIMEOUT_S.value:
          raise RuntimeError(f"the server was not ready in {_TIMEOUT_S.value} s")
        try:
          with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            if reply.status == 200 and json.load(reply)["status"] == "ok":
              break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
          pass
        time.sleep(0.1)
      ready = time.perf_counter() - start
    finally:
      server.send_signal(signal.SIGTERM)
      code = server.wait(timeout=120)
  if code != 0:
    raise RuntimeError(f"the server exited with {code} after SIGTERM; see {log.name}")
  return ready


def _pair(name: str, run: Any, scratch: str) -> dict[str, Any]:
  """`run` twice with a cache of its own, cleared before the first."""
  cache = os.path.join(scratch, f"cache_{name}")
  shutil.rmtree(cache, ignore_errors=True)
  env = dict(os.environ, FLAXFORMER_NMT_COMPILE_CACHE=cache)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # "auto" would keep JAX's own setting
  cold = run(env, scratch)
  warm = run(env, scratch)
  entries = len(os.listdir(cache))
  print(f"{name}: cold {cold:.1f} s, warm {warm:.1f} s ({entries} cache entries)", flush=True)
  return {
    "cold_s": round(cold, 2),
    "warm_s": round(warm, 2),
    "ratio": round(warm / cold, 3),
    "cache_entries": entries,
  }


def main(argv: list[str]) -> None:
  del argv
  if not os.path.isfile(os.path.join(_WORKDIR.value, "config.json")):
    sys.exit(f"error: --workdir={_WORKDIR.value} has no config.json; train it first.")
  with tempfile.TemporaryDirectory() as scratch:
    result: dict[str, Any] = {"workdir": _WORKDIR.value, "lines": LINES.count("\n")}
    result["translate"] = _pair("translate", _translate, scratch)
    if _SERVE.value:
      result["serve"] = _pair("serve", _serve, scratch)
  record.report(result)


if __name__ == "__main__":
  app.run(main)
