r"""The server under abuse and load: what one bad client can do to the others, and a soak.

  python benchmarks/serve_safety.py --workdir=runs/demo              # the record's figures
  python benchmarks/serve_safety.py --workdir=runs/demo --requests=300   # the e2e tier's version

Against `main.py --mode=serve` as a process (the run's own config, the user's compilation cache):
1. **Start-up.** Seconds from the command to its first /health answer (any status), and until it
   says "ok".
2. **One bad line.** --rounds rounds of 16 concurrent requests, one of which holds a line that
   cannot be encoded ("\ud800"): the innocent requests that failed or came back different from
   `--mode=translate`'s lines (must be 0), and the bad ones' statuses (must be 400).
3. **Turns.** A 400-line request, and while it decodes, one-line requests one after another: their
   median latency against the big request's time.
4. **Soak.** --requests requests from --clients clients, mixed sizes (1 to 32 lines, some n-best),
   every 50th with an unencodable line: failures of good requests, answers unlike translate's,
   and the server's resident memory after the first tenth (warm-up) and at the end.
5. **Shutdown.** SIGTERM while an upload is stalled half-way: the exit status, the seconds to exit,
   and whether serve_result.json was written.
Last line JSON, recorded in benchmarks/results/<--record>.json (default serve_safety).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
from absl import app, flags

from flaxformer_nmt.benchmarking import record
from flaxformer_nmt.data import demo

_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "A trained workdir (with config.json).")
_REQUESTS = flags.DEFINE_integer("requests", 5000, "Soak: how many requests.")
_CLIENTS = flags.DEFINE_integer("clients", 8, "Soak: concurrent clients.")
_ROUNDS = flags.DEFINE_integer("rounds", 10, "One bad line: rounds of 16 concurrent requests.")
_BIG = flags.DEFINE_integer("big_lines", 400, "Turns: the big request's lines.")
_TIMEOUT_S = flags.DEFINE_integer("timeout_s", 900, "The longest start-up waited for.")
_OVERRIDES = flags.DEFINE_multi_string(
  "override",
  [],
  "A --config.X=V given to both translate and serve (e.g. the e2e tier's smaller batches).",
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD = "\ud800"  # valid JSON ("\\ud800"), not Unicode text: the tokenizer cannot encode it


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _rss_kib(pid: int) -> int:
  with open(f"/proc/{pid}/status", encoding="ascii") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _translate(lines: list[str], scratch: str) -> dict[str, str]:
  """What `--mode=translate` writes for each of `lines` (the reference every answer must equal)."""
  source, out = os.path.join(scratch, "in.txt"), os.path.join(scratch, "out.txt")
  with open(source, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  subprocess.run(
    [sys.executable, os.path.join(REPO, "main.py"), f"--workdir={_WORKDIR.value}"]
    + [*_OVERRIDES.value, "--mode=translate", f"--input={source}", f"--output={out}"],
    check=True,
    capture_output=True,
    timeout=_TIMEOUT_S.value,
  )
  with open(out, encoding="utf-8") as f:
    return dict(zip(lines, f.read().splitlines(), strict=True))


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict, float]:
  start = time.perf_counter()
  async with session.post(f"{url}/translate", json=body) as r:
    answer = await r.json()
  return r.status, answer, time.perf_counter() - start


async def _start_up(url: str, server: subprocess.Popen, began: float) -> tuple[float, float]:
  """(seconds to the first /health answer, seconds until it says "ok")."""
  first = None
  async with aiohttp.ClientSession() as session:
    while time.perf_counter() - began < _TIMEOUT_S.value:
      if server.poll() is not None:
        raise RuntimeError(f"the server exited with {server.returncode}")
      try:
        async with session.get(f"{url}/health") as r:
          health = await r.json()
        first = first if first is not None else time.perf_counter() - began
        if health["status"] == "ok":
          return first, time.perf_counter() - began
      except aiohttp.ClientConnectionError:
        pass
      await asyncio.sleep(0.05 if first is None else 0.5)
  raise RuntimeError("the server was not ready in time")


async def _one_bad_line(url: str, pool: list[str], expected: dict[str, str]) -> dict[str, Any]:
  rng = random.Random(1)
  innocent_failed = bad_not_400 = innocent = 0
  async with aiohttp.ClientSession() as session:
    for _ in range(_ROUNDS.value):
      bodies = [rng.sample(pool, rng.randint(1, 3)) for _ in range(15)]
      bad_at = rng.randrange(16)
      bodies.insert(bad_at, [pool[0], BAD])
      answers = await asyncio.gather(*(_post(session, url, {"text": b}) for b in bodies))
      for i, (status, answer, _) in enumerate(answers):
        if i == bad_at:
          bad_not_400 += status != 400
          continue
        innocent += 1
        good = status == 200 and answer["translations"] == [expected[x] for x in bodies[i]]
        innocent_failed += not good
  return {
    "innocent_requests": innocent,
    "innocent_failed": innocent_failed,
    "bad_requests": _ROUNDS.value,
    "bad_not_400": bad_not_400,
  }


async def _turns(url: str, pool: list[str]) -> dict[str, Any]:
  big = (pool * (_BIG.value // len(pool) + 1))[: _BIG.value]
  async with aiohttp.ClientSession() as session:
    big_task = asyncio.create_task(_post(session, url, {"text": big}))
    await asyncio.sleep(0.2)  # the big request is being decoded
    small = []
    while not big_task.done():
      status, _, seconds = await _post(session, url, {"text": pool[len(small) % len(pool)]})
      assert status == 200
      small.append(seconds)
    status, _, big_s = await big_task
  return {
    "big_request_lines": len(big),
    "big_request_s": round(big_s, 3),
    "one_line_requests": len(small),
    "one_line_median_s": round(statistics.median(small), 4) if small else None,
    "one_line_max_s": round(max(small), 4) if small else None,
  }


async def _soak(
  url: str, pid: int, pool: list[str], expected: dict[str, str], max_nbest: int
) -> dict[str, Any]:
  rng = random.Random(2)
  bodies: list[dict[str, Any]] = []
  for i in range(_REQUESTS.value):
    size = rng.choice([1] * 14 + [2, 3, 5, 8] * 1 + [32])
    lines = rng.sample(pool, min(size, len(pool)))
    body: dict[str, Any] = {"text": lines}
    if i % 50 == 49:
      body["text"] = [*lines[:-1], BAD]
    elif i % 10 == 3 and max_nbest > 1:
      body["nbest"] = 2
    bodies.append(body)
  warm_up = max(len(bodies) // 10, 1)
  counts = {"good": 0, "failed": 0, "unlike_translate": 0, "bad_400": 0, "bad_other": 0}
  rss: dict[str, int] = {}
  queue: asyncio.Queue = asyncio.Queue()
  for i, body in enumerate(bodies):
    queue.put_nowait((i, body))
  done = 0

  async def client(session: aiohttp.ClientSession) -> None:
    nonlocal done
    while not queue.empty():
      _, body = queue.get_nowait()
      status, answer, _ = await _post(session, url, body)
      done += 1
      if done == warm_up:
        rss["after_warm_up_kib"] = _rss_kib(pid)
      if BAD in body["text"]:
        counts["bad_400" if status == 400 else "bad_other"] += 1
        continue
      if status != 200:
        counts["failed"] += 1
        continue
      counts["good"] += 1
      got = answer["translations"]
      if "nbest" in body:
        got = [hyps[0]["text"] for hyps in got]
      counts["unlike_translate"] += got != [expected[x] for x in body["text"]]

  start = time.perf_counter()
  async with aiohttp.ClientSession() as session:
    await asyncio.gather(*(client(session) for _ in range(_CLIENTS.value)))
  seconds = time.perf_counter() - start
  rss["end_kib"] = _rss_kib(pid)
  growth = rss["end_kib"] / rss["after_warm_up_kib"] - 1.0
  return {
    "requests": len(bodies),
    "clients": _CLIENTS.value,
    **counts,
    "seconds": round(seconds, 1),
    "requests_per_s": round(len(bodies) / seconds, 1),
    **rss,
    "rss_growth_after_warm_up": round(growth, 4),
  }


def _stalled_upload_sigterm(server: subprocess.Popen, port: int) -> dict[str, Any]:
  result_path = os.path.join(_WORKDIR.value, "serve_result.json")
  before = os.stat(result_path).st_mtime if os.path.exists(result_path) else 0.0
  with socket.create_connection(("127.0.0.1", port)) as stalled:
    stalled.sendall(
      f"POST /translate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
      'Content-Length: 100000\r\n\r\n{"text": ["'.encode()
    )
    time.sleep(0.5)
    start = time.perf_counter()
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=120)
    took = time.perf_counter() - start
  written = os.path.exists(result_path) and os.stat(result_path).st_mtime > before
  with open(result_path, encoding="utf-8") as f:
    served = json.load(f)
  return {
    "exit_status": code,
    "exit_s": round(took, 2),
    "serve_result_written": written,
    "uploads_dropped": served.get("uploads_dropped"),
  }


def main(argv: list[str]) -> None:
  del argv
  if not os.path.isfile(os.path.join(_WORKDIR.value, "config.json")):
    sys.exit(f"error: --workdir={_WORKDIR.value} has no config.json; train it first.")
  pool = sorted({src for src, _ in demo.make_demo_split("test", 200, seed=0)})
  with tempfile.TemporaryDirectory() as scratch:
    expected = _translate(pool, scratch)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = os.path.join(scratch, "serve.log")
    with open(log_path, "w", encoding="utf-8") as log:
      began = time.perf_counter()
      server = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "main.py"), f"--workdir={_WORKDIR.value}"]
        + [*_OVERRIDES.value, "--mode=serve", f"--port={port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
      )
      try:
        first_health, ready = asyncio.run(_start_up(url, server, began))
        print(f"first /health {first_health:.2f} s, ready {ready:.1f} s", flush=True)
        result: dict[str, Any] = {
          "workdir": _WORKDIR.value,
          "start_up": {"first_health_s": round(first_health, 2), "ready_s": round(ready, 1)},
        }
        result["one_bad_line"] = asyncio.run(_one_bad_line(url, pool, expected))
        print("one bad line:", result["one_bad_line"], flush=True)
        result["turns"] = asyncio.run(_turns(url, pool))
        print("turns:", result["turns"], flush=True)

        async def nbest() -> int:
          async with aiohttp.ClientSession() as s, s.get(f"{url}/health") as r:
            return int((await r.json())["max_nbest"])

        result["soak"] = asyncio.run(_soak(url, server.pid, pool, expected, asyncio.run(nbest())))
        print("soak:", result["soak"], flush=True)
        result["shutdown"] = _stalled_upload_sigterm(server, port)
        print("shutdown:", result["shutdown"], flush=True)
      finally:
        if server.poll() is None:
          server.kill()
          server.wait(60)
  record.report(result)


if __name__ == "__main__":
  app.run(main)
