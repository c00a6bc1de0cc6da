r"""The translation server under load, against --mode=translate on the same lines.

  python benchmarks/serve.py                          # the quick start's runs/demo, 512 test lines
  python benchmarks/serve.py --workdir=runs/m30k --lines_file=data/x.en   # the run's own config

1. `--mode=translate`'s own code on a warm model, in this process: the lines as one call
   (sentences/s), and each of the first `--latency_lines` lines as a call of its own (the latency
   of one translate call: p50 and p95).
2. `python main.py --mode=serve` as a process on a free port (its "ready" time is in /health),
   then `--clients` concurrent clients (1, 4, 16 by default), each sending requests of
   `--lines_per_request` lines from one shared list until every line is translated, after one
   warm-up pass, --passes times: sentences/s, and p50 and p95 of a request's latency. Every answer
   is compared with translate's output for its lines (`answers_equal_translate`).

A pass over 512 lines takes about a second on a CPU, and a shared machine's speed drifts by tens of
percent within minutes: so each timed pass of the clients follows a timed pass of translate (both
sides see the same machine), each side's sentences/s is the median of its passes (every pass's
seconds are in the record), and the latencies are those of every request of every timed pass.
The two ratios compare a client count's figures with translate's passes timed between that
count's own passes (`translate.paired.<clients>`), not with all of translate's passes pooled.
3. SIGTERM to the server, which must exit 0.

Both sides run on the devices JAX sees here (XLA_FLAGS is passed on to the server); the clients
share the machine with the server, as a page or pipeline on the same host would. Last line JSON,
recorded in benchmarks/results/<--record>.json.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
from absl import app, flags, logging

from flaxformer_nmt import api
from flaxformer_nmt.benchmarking import record
from flaxformer_nmt.data import demo
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.run.folder import Workdir

_CONFIG = flags.DEFINE_string(
  "config",
  "",
  "The workdir's config (name or file); '' = the run's own config.json (docs/runs.md), which both "
  "sides then use, with --set's changes.",
)
_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "A trained workdir.")
_SET = flags.DEFINE_multi_string("set", [], "Config overrides for both sides: path=value.")
_LINES_FILE = flags.DEFINE_string(
  "lines_file", "", "Lines to translate ('' = the demo's test set)."
)
_NUM_LINES = flags.DEFINE_integer("num_lines", 512, "How many lines.")
_CLIENTS = flags.DEFINE_list("clients", ["1", "4", "16"], "Concurrent clients, one run each.")
_PER_REQUEST = flags.DEFINE_integer("lines_per_request", 1, "Lines in each request.")
_LATENCY_LINES = flags.DEFINE_integer("latency_lines", 64, "Single-line translate calls timed.")
_MAX_WAIT_MS = flags.DEFINE_float("max_wait_ms", 5.0, "The server's --max_wait_ms.")
_PASSES = flags.DEFINE_integer(
  "passes", 5, "Timed passes over the lines, each side and client count: the median is reported."
)
_READY_TIMEOUT_S = 1800


def _lines() -> list[str]:
  if _LINES_FILE.value:
    with open(_LINES_FILE.value, encoding="utf-8") as f:
      lines = [line.rstrip("\n") for line in f]
  else:
    lines = [src for src, _ in demo.make_demo_split("test", _NUM_LINES.value, seed=0)]
  return lines[: _NUM_LINES.value]


def _overrides() -> dict[str, Any]:
  out = {}
  for item in _SET.value:
    path, _, value = item.partition("=")
    try:
      out[path] = json.loads(value)
    except json.JSONDecodeError:
      out[path] = value
  return out


def _percentiles(seconds: list[float]) -> dict[str, float]:
  ms = 1000 * np.asarray(seconds)
  return {
    "p50_ms": round(float(np.percentile(ms, 50)), 2),
    "p95_ms": round(float(np.percentile(ms, 95)), 2),
  }


def _throughput(lines: int, passes: list[float]) -> dict[str, Any]:
  """Sentences/s of the median pass over `lines` lines, with every pass's seconds."""
  seconds = float(np.median(passes))
  return {
    "sentences_per_s": round(lines / seconds, 2),
    "seconds": round(seconds, 3),
    "passes_seconds": [round(p, 3) for p in passes],
  }


class TranslateSide:
  """--mode=translate's Translator on a warm model, in this process: all the lines in one call
  (throughput), and one-line calls (latency). Its passes alternate with the server's, so that a
  machine speeding up or slowing down during the run moves both sides alike."""

  def __init__(self, lines: list[str]) -> None:
    if _CONFIG.value:
      config = api.load_config(_CONFIG.value, _overrides())
    else:
      config = api.load_run_config(_WORKDIR.value, _overrides())
    session = Session.load(config, Workdir(_WORKDIR.value), "auto")
    self.checkpoint = session.description
    self.lines = lines
    # --mode=translate's translator (its batch shapes; no per-call progress lines).
    self.translator = session.quiet().translator()
    for line in lines[: _LATENCY_LINES.value]:  # compiles every shape the timed calls use
      self.translator.translate([line])
    self.outputs = self.translator.translate(lines)
    # Per client count ("1", "4", ...): the passes timed between that count's client passes.
    self.passes: dict[str, list[float]] = {}
    self.single: dict[str, list[float]] = {}

  def timed_pass(self, phase: str) -> None:
    """The lines as one call, then each of the first --latency_lines as a call of its own."""
    start = time.perf_counter()
    self.translator.translate(self.lines)
    self.passes.setdefault(phase, []).append(time.perf_counter() - start)
    for line in self.lines[: _LATENCY_LINES.value]:
      start = time.perf_counter()
      self.translator.translate([line])
      self.single.setdefault(phase, []).append(time.perf_counter() - start)

  def _figures(self, passes: list[float], single: list[float]) -> dict[str, Any]:
    return {**_throughput(len(self.lines), passes), "one_line_call": _percentiles(single)}

  def figures(self) -> dict[str, Any]:
    """All passes together, and those of each client count apart (`paired`): a ratio compares
    the server's figure with the translate passes timed between its own passes."""
    every = [p for phase in self.passes.values() for p in phase]
    singles = [t for phase in self.single.values() for t in phase]
    return {
      **self._figures(every, singles),
      "paired": {k: self._figures(self.passes[k], self.single[k]) for k in self.passes},
      "checkpoint": self.checkpoint,
    }


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_server(port: int, log: Any) -> subprocess.Popen:
  checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [sys.executable, os.path.join(checkout, "main.py"), "--mode=serve"]
  command += [f"--config={_CONFIG.value}"] if _CONFIG.value else []
  command += [f"--workdir={_WORKDIR.value}", f"--port={port}"]
  command += [f"--max_wait_ms={_MAX_WAIT_MS.value:g}", *(f"--config.{s}" for s in _SET.value)]
  logging.info("Starting: %s (its log: %s)", " ".join(command[1:]), log.name)
  return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


async def _wait_ready(url: str, server: subprocess.Popen) -> dict[str, Any]:
  deadline = time.monotonic() + _READY_TIMEOUT_S
  async with aiohttp.ClientSession() as session:
    while time.monotonic() < deadline:
      if server.poll() is not None:
        raise RuntimeError(f"the server exited with status {server.returncode}; see its log")
      try:
        async with session.get(f"{url}/health") as response:
          if response.status != 200:
            raise RuntimeError(f"/health answered {response.status}: {await response.text()}")
          health = await response.json()
        if health["status"] != "starting":  # it listens while it loads and compiles
          return health
      except aiohttp.ClientConnectionError:
        pass
      await asyncio.sleep(0.5)
  raise RuntimeError("the server did not become ready")


async def load(
  url: str, lines: list[str], clients: int, expected: list[str], between: Callable[[], None]
) -> dict[str, Any]:
  """`clients` clients sending all `lines` in requests of --lines_per_request lines: a warm-up
  pass, then --passes timed ones, each after a call of `between` (a translate pass)."""
  size = _PER_REQUEST.value
  requests = [list(range(i, min(i + size, len(lines)))) for i in range(0, len(lines), size)]
  latencies: list[float] = []
  wrong = 0

  async def client(session: aiohttp.ClientSession, queue: asyncio.Queue) -> None:
    nonlocal wrong
    while not queue.empty():
      ids = queue.get_nowait()
      start = time.perf_counter()
      async with session.post(f"{url}/translate", json={"text": [lines[i] for i in ids]}) as r:
        answer = await r.json()
      latencies.append(time.perf_counter() - start)
      if r.status != 200 or answer["translations"] != [expected[i] for i in ids]:
        wrong += 1

  connector = aiohttp.TCPConnector(limit=clients)
  passes = []
  async with aiohttp.ClientSession(connector=connector) as session:
    for timed in [False] + [True] * _PASSES.value:  # a warm-up pass, then the timed ones
      if timed:
        between()
      queue: asyncio.Queue = asyncio.Queue()
      for ids in requests:
        queue.put_nowait(ids)
      start = time.perf_counter()
      await asyncio.gather(*(client(session, queue) for _ in range(clients)))
      if timed:
        passes.append(time.perf_counter() - start)
      else:
        latencies.clear()  # the timed passes' requests only
  return {
    **_throughput(len(lines), passes),
    "requests": len(requests),
    **_percentiles(latencies),
    "answers_equal_translate": wrong == 0,
  }


def main(argv: list[str]) -> None:
  del argv
  lines = _lines()
  translate = TranslateSide(lines)
  expected = translate.outputs
  # The clients share this process with translate's loaded model and compiled programs: frozen,
  # those objects no longer lengthen the collector's pauses, as the server freezes its own.
  gc.collect()
  gc.freeze()
  port = _free_port()
  log = tempfile.NamedTemporaryFile("w", prefix="serve-benchmark-", suffix=".log", delete=False)
  server = start_server(port, log)
  url = f"http://127.0.0.1:{port}"
  try:
    health = asyncio.run(_wait_ready(url, server))
    by_clients = {}
    for clients in (int(c) for c in _CLIENTS.value):
      by_clients[str(clients)] = asyncio.run(
        load(url, lines, clients, expected, functools.partial(translate.timed_pass, str(clients)))
      )
      logging.info("%d clients: %s", clients, by_clients[str(clients)])
  finally:
    server.send_signal(signal.SIGTERM)
    try:
      server_exit = server.wait(120)
    except subprocess.TimeoutExpired:
      server.kill()
      server_exit = "killed after 120 s"
  most_key = str(max(int(c) for c in _CLIENTS.value))
  most = by_clients[most_key]
  one = by_clients.get("1")
  translated = translate.figures()
  logging.info("translate: %s", translated)
  result = {
    "benchmark": "serve",
    "lines": len(lines),
    "lines_per_request": _PER_REQUEST.value,
    "max_wait_ms": _MAX_WAIT_MS.value,
    "translate": translated,
    "server_ready_seconds": health["ready_seconds"],
    "server_batch_shapes": health["batch_shapes_compiled"],
    "server_devices": health["devices"],
    "clients": by_clients,
    # Each against the translate passes timed between its own client passes.
    "most_clients_over_translate": (
      round(most["sentences_per_s"] / translated["paired"][most_key]["sentences_per_s"], 3)
    ),
    "one_client_p95_over_translate_call": (
      round(one["p95_ms"] / translated["paired"]["1"]["one_line_call"]["p95_ms"], 3)
      if one
      else None
    ),
    "server_exit_status": server_exit,
  }
  record.report(result)


if __name__ == "__main__":
  app.run(main)
