"""A server no client can hurt, as a process on a copy of the shared trained demo: it answers
/health while it starts; an unencodable line fails only its own request; a one-line request is
answered while a big one is still decoding; strangers (another Content-Type, Host or Origin) are
refused in one JSON line; SIGTERM with an upload stalled half-way exits 0 at once with its result;
on an open address every request needs the printed token, and SIGTERM during start-up exits 0.
And the short version of the soak (benchmarks/serve_safety.py).

In the "serve" xdist group with tests/e2e/test_serve.py: one worker runs both, one server after
the other, and the second start reads the first's compiled programs.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from flaxformer_nmt.data import demo

import helpers
from cluster import free_port

pytestmark = pytest.mark.xdist_group("serve")

SMALL = ["--config.decode.batch_size=4", "--config.data.max_len=24"]
LINES = sorted({src for src, _ in demo.make_demo_split("test", 48, seed=0)})


class Server:
  def __init__(
    self,
    workdir: pathlib.Path,
    log: pathlib.Path,
    *extra: str,
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
  ):
    self.port = free_port()
    self.host = "127.0.0.1"
    self.log = log
    self.began = time.monotonic()
    self.proc = subprocess.Popen(
      [sys.executable, "main.py", "--mode=serve", f"--workdir={workdir}", *SMALL]
      + [f"--host={host}", f"--port={self.port}", "--max_request_lines=600", *extra],
      cwd=helpers.REPO,
      stdout=open(log, "w"),  # noqa: SIM115 (closed with the process)
      stderr=subprocess.STDOUT,
      env=None if env is None else {**os.environ, **env},
    )

  def call(
    self, method: str, path: str, body: bytes | None = None, **headers: str
  ) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(self.host, self.port, timeout=120)
    try:
      headers = {k.replace("_", "-"): v for k, v in headers.items()}
      if body is not None:
        headers.setdefault("Content-Type", "application/json")
      connection.request(method, path, body=body, headers=headers)
      response = connection.getresponse()
      return response.status, json.loads(response.read() or b"{}")
    finally:
      connection.close()

  def translate(self, lines: list[str]) -> tuple[int, dict]:
    return self.call("POST", "/translate", json.dumps({"text": lines}).encode())

  def first_health(self, timeout: float = 60, **headers: str) -> tuple[float, dict]:
    """(seconds from the start to the first /health answer, that answer)."""
    while time.monotonic() - self.began < timeout:
      assert self.proc.poll() is None, self.log.read_text()[-3000:]
      try:
        return time.monotonic() - self.began, self.call("GET", "/health", **headers)[1]
      except (ConnectionError, OSError):
        time.sleep(0.05)
    raise AssertionError(self.log.read_text()[-3000:])

  def wait_ready(self, timeout: float = 600, **headers: str) -> dict:
    while time.monotonic() - self.began < timeout:
      assert self.proc.poll() is None, self.log.read_text()[-3000:]
      health = self.call("GET", "/health", **headers)[1]
      if health["status"] != "starting":
        return health
      time.sleep(0.3)
    raise AssertionError(self.log.read_text()[-3000:])

  def stop(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait(60)


@pytest.fixture(scope="module")
def served(trained_demo, tmp_path_factory):
  """(server, workdir, what --mode=translate writes for LINES, the first /health answer)."""
  base = tmp_path_factory.mktemp("serve_safety")
  work = base / "workdir"
  shutil.copytree(trained_demo[1], work)
  (base / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
  proc = helpers.run_main(
    f"--workdir={work}", *SMALL, "--mode=translate", f"--input={base / 'in.txt'}"
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  expected = dict(zip(LINES, proc.stdout.splitlines()[: len(LINES)], strict=True))
  server = Server(work, base / "server.log")
  try:
    first = server.first_health()
    assert server.wait_ready()["status"] == "ok"
    yield server, work, expected, first
  finally:
    server.stop()


def test_health_answers_while_the_server_starts(served):
  _, _, _, (seconds, health) = served
  assert health["status"] == "starting", health  # it listened before the model was loaded
  assert health["run"] == "workdir" and "batch_shapes" in health
  print(f"first /health answer {seconds:.2f} s after the start")


def test_an_unencodable_line_fails_only_its_own_request(served):
  server, _, expected, _ = served
  requests = [LINES[k : k + 2] for k in range(15)]
  requests.insert(7, [LINES[0], "\ud800"])
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    answers = list(pool.map(server.translate, requests))
  for i, (lines, (status, answer)) in enumerate(zip(requests, answers, strict=True)):
    if i == 7:
      assert status == 400 and answer["error"].startswith('"text"[1] cannot be encoded')
    else:
      assert status == 200 and answer["translations"] == [expected[x] for x in lines]


def test_a_one_line_request_is_answered_while_a_big_one_decodes(served):
  server, _, expected, _ = served
  big = (LINES * 20)[:500]
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    started = time.monotonic()
    future = pool.submit(server.translate, big)
    while server.call("GET", "/health")[1]["queue_lines"] == 0:  # the big one is queued
      assert time.monotonic() - started < 60
      time.sleep(0.01)
    small = [server.translate([LINES[i]]) for i in range(3)]
    big_done_first = future.done()
    status, answer = future.result(300)
  assert not big_done_first
  assert [s for s, _ in small] == [200] * 3 and status == 200
  assert answer["translations"] == [expected[x] for x in big]
  assert server.translate([LINES[0]] * 601)[0] == 413  # over --max_request_lines=600


def test_strangers_are_refused_in_one_json_line(served):
  server, _, _, _ = served
  body = json.dumps({"text": LINES[0]}).encode()
  status, answer = server.call("POST", "/translate", body, Content_Type="text/plain")
  assert status == 415 and "application/json" in answer["error"]
  status, answer = server.call("GET", "/health", Host=f"attacker.example:{server.port}")
  assert status == 403 and "attacker.example" in answer["error"]
  status, answer = server.call("POST", "/translate", body, Origin="https://attacker.example")
  assert status == 403 and "Origin" in answer["error"]
  status, answer = server.call("POST", "/translate", b"[" * 50_000 + b"]" * 50_000)
  assert status == 400 and "nested too deeply" in answer["error"]
  assert server.translate([LINES[0]])[0] == 200  # and it goes on serving
  health = server.call("GET", "/health")[1]
  assert str(helpers.REPO) not in json.dumps(health) and "/tmp" not in json.dumps(health)
  connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
  connection.request("GET", "/metrics")
  metrics = connection.getresponse().read().decode()
  assert 'flaxformer_nmt_errors_total{status="415"} 1.0' in metrics
  assert "flaxformer_nmt_ready 1.0" in metrics


def test_sigterm_with_a_stalled_upload_exits_0_at_once_with_its_result(served):
  """The last test of the module's server: it stops it."""
  server, work, _, _ = served
  with socket.create_connection(("127.0.0.1", server.port)) as stalled:
    stalled.sendall(
      f"POST /translate HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
      "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n".encode()
      + b'{"text": ["'
    )
    time.sleep(0.5)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0, server.log.read_text()[-3000:]
    took = time.monotonic() - start
  result = json.loads((work / "serve_result.json").read_text())
  assert result["ready"] is True and result["uploads_dropped"] == 1
  # Not held by the upload: without the drop, aiohttp would wait for it up to --grace_s - 3 s.
  assert took < 8, took
  print(f"SIGTERM with a stalled upload: exit 0 in {took:.2f} s")


def test_an_open_server_needs_its_token_and_sigterm_during_start_up_exits_0(trained_demo, tmp_path):
  work = tmp_path / "workdir"
  shutil.copytree(trained_demo[1], work)
  # A cache of its own, empty: start-up compiles every shape, so SIGTERM comes while it starts.
  cold = {"FLAXFORMER_NMT_COMPILE_CACHE": str(tmp_path / "cache"), "JAX_COMPILATION_CACHE_DIR": ""}
  server = Server(work, tmp_path / "server.log", host="0.0.0.0", env=cold)
  try:
    _, health = server.first_health(Authorization="Bearer not-it")
    assert "needs its token" in health["error"]
    token = re.search(r"The token for this server: (\S+)", server.log.read_text()).group(1)
    _, health = server.first_health(Authorization=f"Bearer {token}")
    assert health["status"] == "starting"
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0, server.log.read_text()[-3000:]
    took = time.monotonic() - start
  finally:
    server.stop()
  result = json.loads((work / "serve_result.json").read_text())
  assert result["ready"] is False and result["stopped"].startswith("during start-up")
  assert took < 15, took
  print(f"SIGTERM during start-up: exit 0 in {took:.2f} s")


def test_the_short_soak(trained_demo, tmp_path):
  """benchmarks/serve_safety.py with 300 requests: every good request answered as translate
  answers it, every unencodable one 400, no innocent request failed, exit 0 after SIGTERM with
  an upload stalled. (Resident memory is the full soak's figure: 300 requests are too few to
  leave warm-up behind, so it is not asserted here.)"""
  work = tmp_path / "workdir"
  shutil.copytree(trained_demo[1], work)
  proc = subprocess.run(
    [sys.executable, "benchmarks/serve_safety.py", f"--workdir={work}", "--requests=300"]
    + ["--rounds=2", "--big_lines=200", f"--results_dir={tmp_path}", "--record=soak_test"]
    + [f"--override={flag}" for flag in SMALL],
    cwd=helpers.REPO,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["one_bad_line"]["innocent_failed"] == 0
  assert result["one_bad_line"]["bad_not_400"] == 0
  soak = result["soak"]
  assert soak["failed"] == soak["unlike_translate"] == soak["bad_other"] == 0
  assert soak["bad_400"] == 6 and soak["good"] == 294
  assert result["shutdown"]["exit_status"] == 0 and result["shutdown"]["serve_result_written"]
  assert (tmp_path / "soak_test.json").is_file()
