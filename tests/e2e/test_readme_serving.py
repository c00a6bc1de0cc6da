"""docs/serving.md's commands, run as tests/e2e/test_readme.py runs the README's (`-m readme`):
the server started from the quick start's trained runs/demo, the page's requests, SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

import readme
import readme_sandbox
from cluster import free_port


@pytest.mark.readme
def test_serving_chain(tmp_path):
  """docs/serving.md from the quick start's trained runs/demo: the server started by the page's
  command (on a free port instead of 8080, small batches), its curl calls answered as the page
  shows them, then SIGTERM, after which it exits 0."""
  small = ["--config.decode.batch_size=4", "--config.data.max_len=24"]
  box = readme_sandbox.Sandbox(tmp_path, {"demo": readme.DEMO + small})
  box.run(readme.quick_start_training())
  commands = [c for c in readme.in_chain("serving") if not c.text.startswith("pip install")]
  (serve,) = [c for c in commands if "--mode=serve" in c.text]
  port = free_port()
  # The free port for 8080; curl fails on an HTTP error and gives up after a minute.
  local = lambda text: text.replace("8080", str(port)).replace("curl -s ", "curl -sf -m 60 ")  # noqa: E731
  log = tmp_path / "serve.log"
  with open(log, "w") as out:
    server = subprocess.Popen(
      ["bash", "-c", "exec " + local(serve.text)], cwd=box.repo, env=box.env, stdout=out, stderr=out
    )
  try:
    ready = re.compile(r"Ready: serving .* at http://127\.0\.0\.1:(\d+) \(\d+ batch shapes")
    deadline = time.monotonic() + 600
    while not ready.search(log.read_text()):
      assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
      time.sleep(0.5)
    answers = [
      json.loads(box.run(readme.Command(local(c.text), "bash", c.section)).stdout)
      for c in commands
      if c.text.startswith("curl ")
    ]
  finally:
    server.send_signal(signal.SIGTERM)
    try:
      status = server.wait(120)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait(60)
      raise
  assert status == 0, log.read_text()[-3000:]
  lines, nbest, health = answers
  assert len(lines["translations"]) == 2 and lines["truncated"] == [False, False]
  ((first, second),) = nbest["translations"]
  assert set(first) == {"text", "score"} and first["score"] >= second["score"]
  assert health["status"] == "ok" and health["step"] == 30
