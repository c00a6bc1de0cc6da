"""`main.py --mode=serve` as a process, on a copy of the shared trained demo: 16 concurrent clients
get what `--mode=translate` gives for their lines; the limits (413, 400) leave it serving; the
page, loaded in a real headless browser (Debian's chromium), shows the translation of `/?text=`;
SIGTERM lets the requests in flight finish and exits 0.

One server per module (it compiles its batch shapes at start-up), so the tests run in order on
one xdist worker. The browser test needs `chromium` on the PATH: .ci/run installs it (apt-get) and
sets FLAXFORMER_NMT_REQUIRE_BROWSER=1, under which its absence fails instead of skipping.
"""

from __future__ import annotations

import concurrent.futures
import html
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from flaxformer_nmt.data import demo

import helpers
from cluster import free_port

pytestmark = pytest.mark.xdist_group("serve")

# Small batches and short buckets: the server compiles (2 row sizes x 4 lengths) x 2 searches.
SMALL = [  # on the run's own config, with what a decoding command may change
  "--config.decode.batch_size=4",
  "--config.data.max_len=24",
]
LINES = [src for src, _ in demo.make_demo_split("test", 48, seed=0)]


class Server:
  def __init__(self, workdir: pathlib.Path, log: pathlib.Path) -> None:
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.log = log
    self.proc = subprocess.Popen(
      [sys.executable, "main.py", "--mode=serve", f"--workdir={workdir}", *SMALL]
      + [f"--port={self.port}", "--max_request_bytes=20000", "--max_wait_ms=20"],
      cwd=helpers.REPO,
      stdout=open(log, "w"),  # noqa: SIM115 (closed with the process)
      stderr=subprocess.STDOUT,
    )

  def call(self, path: str, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
      self.url + path,
      data=body,
      method="POST" if body else "GET",
      headers={"Content-Type": "application/json"} if body else {},
    )
    try:
      with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
      return e.code, json.loads(e.read())

  def translate(self, lines: list[str]) -> tuple[int, dict]:
    return self.call("/translate", json.dumps({"text": lines}).encode())

  def wait_ready(self, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      assert self.proc.poll() is None, self.log.read_text()[-4000:]
      try:
        health = self.call("/health")[1]
        if health["status"] != "starting":
          return health
      except (urllib.error.URLError, ConnectionError):
        pass
      time.sleep(0.5)
    raise AssertionError(f"not ready in {timeout} s: {self.log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def served(trained_demo, tmp_path_factory):
  """(server, workdir, what --mode=translate writes for LINES) on a copy of the trained demo."""
  base = tmp_path_factory.mktemp("serve")
  work = base / "workdir"
  shutil.copytree(trained_demo[1], work)
  server = Server(work, base / "server.log")
  try:  # the server is killed whatever fails, here or in a test
    (base / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    proc = helpers.run_main(
      f"--workdir={work}",
      *SMALL,
      "--mode=translate",
      f"--input={base / 'in.txt'}",
      f"--output={base / 'out.txt'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = (base / "out.txt").read_text(encoding="utf-8").splitlines()
    health = server.wait_ready()
    assert health["status"] == "ok" and health["step"] == 60 and health["ready_seconds"] > 0
    assert "Ready: serving" in server.log.read_text()
    yield server, work, dict(zip(LINES, expected, strict=True))
  finally:
    if server.proc.poll() is None:
      server.proc.kill()
      server.proc.wait(60)


def test_sixteen_concurrent_clients_get_what_translate_gives(served):
  server, _, expected = served
  # Client k sends LINES[k::16] in requests of 1 to 3 lines.
  requests = []
  for k in range(16):
    mine = LINES[k::16]
    requests.append([mine[:1], mine[1:]])
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    answers = list(pool.map(lambda reqs: [server.translate(r) for r in reqs], requests))
  for reqs, got in zip(requests, answers, strict=True):
    for lines, (status, answer) in zip(reqs, got, strict=True):
      assert status == 200, answer
      assert answer["translations"] == [expected[line] for line in lines]
      assert answer["truncated"] == [False] * len(lines)
  health = server.call("/health")[1]
  assert health["batches"]["batches"] < health["batches"]["requests"]  # requests shared batches


def test_limits_answer_in_one_line_and_the_server_stays_up(served):
  server, _, expected = served
  status, answer = server.call("/translate", b'{"text": "' + b"x" * 25000 + b'"}')
  assert status == 413 and "the limit is 20000" in answer["error"]
  status, answer = server.call("/translate", b"{not json")
  assert status == 400 and answer["error"].startswith("the body is not JSON")
  status, answer = server.call("/translate", json.dumps({"text": "a", "nbest": 9}).encode())
  assert status == 400 and "beam search finds at most config.decode.beam_size=" in answer["error"]
  status, answer = server.call("/translate", json.dumps({"text": LINES[0], "nbest": 2}).encode())
  assert status == 200 and answer["translations"][0][0]["text"] == expected[LINES[0]]
  assert server.translate([LINES[1]]) == (
    200,
    {"translations": [expected[LINES[1]]], "truncated": [False]},
  )


def _chromium() -> str | None:
  return shutil.which("chromium") or shutil.which("chromium-browser")


def test_the_page_shows_the_translation_of_its_link_in_a_real_browser(served, tmp_path):
  server, _, expected = served
  browser = _chromium()
  if browser is None:
    if os.environ.get("FLAXFORMER_NMT_REQUIRE_BROWSER") == "1":
      pytest.fail("chromium is not on the PATH (apt-get install chromium)")
    pytest.skip("chromium is not installed (.ci/run installs it and requires this test)")
  line = LINES[2]
  url = f"{server.url}/?text={urllib.parse.quote(line)}"
  proc = subprocess.run(
    [
      browser,
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-dev-shm-usage",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      f"--user-data-dir={tmp_path / 'profile'}",
      "--virtual-time-budget=30000",  # runs the page's fetches before the DOM is read
      "--dump-dom",
      url,
    ],
    capture_output=True,
    text=True,
    timeout=180,
  )
  dom = proc.stdout
  assert 'data-state="done"' in dom, (proc.returncode, dom[-2000:], proc.stderr[-2000:])
  shown = re.search(r'<div class="translation">(.*?)</div>', dom, re.S)
  assert shown and html.unescape(shown.group(1)) == expected[line], dom[-2000:]
  assert '<table class="alignment">' in dom  # the word alignment, drawn as a grid


def test_sigterm_finishes_the_requests_in_flight_and_exits_0(served):
  server, work, expected = served
  batches = [LINES * 2 for _ in range(4)]  # 4 requests of 96 lines: seconds of decoding
  accepted = server.call("/health")[1]["batches"]["requests"]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    futures = [pool.submit(server.translate, lines) for lines in batches]
    deadline = time.monotonic() + 60
    while server.call("/health")[1]["batches"]["requests"] < accepted + 4:
      assert time.monotonic() < deadline
      time.sleep(0.05)
    assert not all(f.done() for f in futures)  # SIGTERM comes while they are decoding
    server.proc.send_signal(signal.SIGTERM)
    answers = [f.result(120) for f in futures]
  assert server.proc.wait(120) == 0, server.log.read_text()[-3000:]
  for lines, (status, answer) in zip(batches, answers, strict=True):
    assert status == 200 and answer["translations"] == [expected[line] for line in lines]
  result = json.loads((work / "serve_result.json").read_text())
  assert result["mode"] == "serve" and result["requests"] == accepted + 4
  assert "Stopped serving" in server.log.read_text()
  with pytest.raises(urllib.error.URLError):
    server.call("/health")
