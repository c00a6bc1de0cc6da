"""A server no client can hurt, in this process: the batcher's turns and failures that stay with
their request, and the HTTP checks (JSON only, nesting, lines, encoding, Host, Origin, token,
CORS, start-up, /metrics) on aiohttp's test client. tests/e2e/test_serve_safety.py runs them
against the server as a process."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from flaxformer_nmt import errors
from flaxformer_nmt.decoding.translator import Hypothesis
from flaxformer_nmt.serving import batcher as batcher_lib
from flaxformer_nmt.serving import guard as guard_lib
from flaxformer_nmt.serving import protocol, server
from flaxformer_nmt.serving.batcher import Kind
from flaxformer_nmt.serving.options import Options


class Echo:
  """Each line upper-cased with its number; a batch holding "POISON" fails whole; `delay_s` per
  line; records the batches."""

  def __init__(self, delay_s: float = 0.0) -> None:
    self.batches: list[list[str]] = []
    self.delay_s = delay_s
    self.lock = threading.Lock()

  def __call__(self, kind: Kind, lines: list[str], numbers: list[int]):
    with self.lock:
      self.batches.append(list(lines))
    time.sleep(self.delay_s * len(lines))
    if "POISON" in lines:
      raise TypeError("cannot encode")
    hyps = [
      [Hypothesis(f"{x.upper()}#{n}", -1.0, None)] * kind.nbest
      for x, n in zip(lines, numbers, strict=True)
    ]
    return hyps, []


# ------------------------------------------------------------------------------------------------
# The batcher: lines in turns, failures per request, the queue in lines.


def test_a_one_line_request_beside_a_big_one_goes_in_the_next_batch():
  """Batches are stepped by the test: the one-line request that arrives while the big one's
  first batch decodes is in the second batch, beside 7 of the big one's lines."""
  step, entered, seen = threading.Semaphore(0), threading.Event(), []

  def stepped(kind, lines, numbers):
    entered.set()
    assert step.acquire(timeout=10)
    seen.append(list(lines))
    return [
      [Hypothesis(f"{x.upper()}#{n}", -1.0, None)] for x, n in zip(lines, numbers, strict=True)
    ], []

  b = batcher_lib.DynamicBatcher(stepped, max_rows=8, max_wait_s=0.0, max_queue=8)
  big = b.submit([f"b{i}" for i in range(400)])
  assert entered.wait(10)  # the first batch (8 of the big one's lines) is decoding
  small = b.submit(["s"])
  step.release(2)
  assert [a.hypotheses[0].text for a in small.result(10)] == ["S#0"]
  assert seen[1] == [f"b{i}" for i in range(8, 15)] + ["s"]
  step.release(100)
  answers = big.result(30)
  b.close()
  assert [a.hypotheses[0].text for a in answers] == [f"B{i}#{i}" for i in range(400)]
  assert len(seen) == 51


def test_with_more_requests_than_a_batch_holds_turns_go_round():
  """20 one-line requests and a batch of 8: every request is in one of the first 3 batches,
  then the big one's lines follow (the start of the turns moves on)."""
  step, entered, seen = threading.Semaphore(0), threading.Event(), []

  def stepped(kind, lines, numbers):
    entered.set()
    assert step.acquire(timeout=10)
    seen.append(list(lines))
    return [[Hypothesis(x, -1.0, None)] for x in lines], []

  b = batcher_lib.DynamicBatcher(stepped, max_rows=8, max_wait_s=0.0, max_queue=64)
  first = b.submit(["first"])
  assert entered.wait(10)
  with b._cond:
    big = [b.submit([f"big{j}-{i}" for i in range(30)]) for j in range(10)]
    small = b.submit(["small"])
  step.release(1000)
  small.result(10), first.result(10), [f.result(10) for f in big]
  b.close()
  assert any("small" in batch for batch in seen[1:4]), seen[:4]


def test_turns_split_a_batch_equally_and_give_the_rest_to_the_others():
  echo = Echo()
  # Every request is queued under the batcher's lock, before it can look: the wait only delays the
  # last, partial batch (at 5 s it was 5 s of this test).
  b = batcher_lib.DynamicBatcher(echo, max_rows=8, max_wait_s=0.2, max_queue=8)
  with b._cond:
    futures = [b.submit([f"a{i}" for i in range(20)]), b.submit(["x"]), b.submit(["y", "z"])]
  [f.result(10) for f in futures]
  b.close()
  assert sorted(echo.batches[0]) == sorted(["a0", "a1", "a2", "a3", "a4", "x", "y", "z"])


def test_a_failed_batch_is_retried_per_request_so_only_the_faulty_one_fails():
  echo = Echo()
  b = batcher_lib.DynamicBatcher(echo, max_rows=16, max_wait_s=0.2, max_queue=16)  # as above
  with b._cond:
    innocent = [b.submit([f"ok{i}", "fine"]) for i in range(5)]
    faulty = b.submit(["x", "POISON"])
    innocent.append(b.submit(["late"]))
  for f in innocent:
    assert f.result(10)[0].hypotheses[0].text.endswith("#0")
  with pytest.raises(TypeError, match="cannot encode"):
    faulty.result(10)
  b.close()
  assert b.stats.batches_retried_apart == 1 and b.stats.failed_requests == 1


def test_the_queue_is_bounded_in_lines():
  gate = threading.Event()

  def held(kind, lines, numbers):
    gate.wait(10)
    return [[Hypothesis(x, 0.0, None)] for x in lines], []

  b = batcher_lib.DynamicBatcher(held, max_rows=2, max_wait_s=0.0, max_queue=99, max_queue_lines=5)
  b.submit(["busy"])
  while b._queue:
    time.sleep(0.01)
  b.submit(["1", "2", "3"])
  with pytest.raises(batcher_lib.QueueFull, match="3 lines are waiting and this request adds 3"):
    b.submit(["4", "5", "6"])
  assert b.queued_lines == 3
  gate.set()
  b.close(10)


# ------------------------------------------------------------------------------------------------
# The guard.


def test_the_guard_on_a_loopback_address():
  g = guard_lib.Guard(loopback=True, port=8080, allowed_origins=("http://localhost:3000",))
  ok = {"Host": "127.0.0.1:8080"}
  assert g.check("POST", ok, {}) is None
  for host in ("localhost:8080", "[::1]:8080", "LOCALHOST:8080"):
    assert g.check("GET", {"Host": host}, {}) is None
  for host in ("evil.example:8080", "127.0.0.1:9999", "", "127.0.0.1"):
    refusal = g.check("GET", {"Host": host}, {})
    assert refusal is not None and refusal.status == 403 and "Host" in refusal.message
  assert g.check("POST", {**ok, "Origin": "http://127.0.0.1:8080"}, {}) is None  # its own page
  foreign = g.check("POST", {**ok, "Origin": "https://evil.example"}, {})
  assert foreign is not None and foreign.status == 403 and "evil.example" in foreign.message
  assert g.check("POST", {**ok, "Origin": "null"}, {}).status == 403
  allowed = {**ok, "Origin": "http://localhost:3000"}
  assert g.check("POST", allowed, {}) is None
  assert g.cors_headers(allowed)["Access-Control-Allow-Origin"] == "http://localhost:3000"
  assert "Access-Control-Allow-Methods" in g.cors_headers(allowed, preflight=True)
  on_80 = guard_lib.Guard(loopback=True, port=80)
  assert on_80.check("GET", {"Host": "localhost"}, {}) is None  # browsers omit port 80
  assert g.cors_headers(ok) == {} and g.cors_headers({**ok, "Origin": "http://evil"}) == {}
  wider = guard_lib.Guard(loopback=True, port=8080, allowed_hosts=("nmt.internal",))
  assert wider.check("GET", {"Host": "nmt.internal:443"}, {}) is None


def test_the_guard_on_an_open_address_wants_the_token():
  g = guard_lib.Guard(loopback=False, port=8080, token="s3cret-token")
  host = {"Host": "203.0.113.7:8080"}
  refusal = g.check("GET", host, {})
  assert (
    refusal is not None
    and refusal.status == 401
    and ("WWW-Authenticate", "Bearer") in (refusal.headers)
  )
  assert g.check("GET", {**host, "Authorization": "Bearer wrong"}, {}).status == 401
  # aiohttp decodes header bytes with surrogateescape: a 401, not a traceback
  assert g.check("GET", {**host, "Authorization": "Bearer \udcff"}, {}).status == 401
  assert g.check("GET", {**host, "Authorization": "Bearer s3cret-token"}, {}) is None
  assert g.check("GET", {**host, "Authorization": "token s3cret-token"}, {}) is None
  assert g.check("GET", host, {"token": "s3cret-token"}) is None
  assert g.check("OPTIONS", host, {}) is None  # a preflight carries no credentials
  assert len(guard_lib.new_token()) >= 32


def test_serve_options_refuse_in_one_line():
  for options, message in (
    (Options(max_request_lines=0), "--max_request_lines=0: give 1 or more"),
    (Options(queue_lines=10, max_request_lines=20), "--queue_lines=10 is less than"),
    (Options(grace_s=0), "--grace_s=0: give seconds"),
    (Options(allowed_origins=("localhost:3000",)), "--allowed_origins=localhost:3000: give"),
    (Options(allowed_origins=("http://x.org/",)), "--allowed_origins=http://x.org/: give"),
    (Options(token="short"), "--token: give at least 8 characters"),
  ):
    with pytest.raises(errors.ConfigError, match=message):
      options.check()
  assert Options(host="127.0.0.1").loopback and Options(host="::1").loopback
  assert not Options(host="0.0.0.0").loopback


# ------------------------------------------------------------------------------------------------
# The routes.

LIMITS = protocol.Limits(max_request_bytes=100_000, max_nbest=2, max_request_lines=50)


def _serve(guard=None, ready=True, echo=None):
  echo = echo or Echo()
  backend = server.Backend("my-run")
  guard = guard or guard_lib.Guard(loopback=True, port=0, allowed_hosts=("127.0.0.1",))
  app = server.make_app(backend, guard, LIMITS.max_request_bytes)
  b = batcher_lib.DynamicBatcher(
    echo, max_rows=8, max_wait_s=0.0, max_queue=8, on_batch=backend.batch_hook
  )
  if ready:

    def check(lines):
      protocol.check_encodable(lines, lambda line: line.encode("utf-8"))

    backend.ready(b, LIMITS, {"model": "echo"}, check)
  else:
    backend.progress(3, 56)
  return app, b


def _calls(app, calls):
  """[(status, body as JSON or text, headers)] of each (method, path, kwargs)."""

  async def run():
    out = []
    async with TestClient(TestServer(app)) as client:
      for method, path, kwargs in calls:
        response = await client.request(method, path, **kwargs)
        kind = response.headers.get("Content-Type", "")
        body = await (response.json() if "json" in kind else response.text())
        out.append((response.status, body, response.headers))
    return out

  return asyncio.run(run())


J = {"Content-Type": "application/json"}


def test_bodies_json_only_nesting_lines_and_encoding_each_one_json_line():
  app, b = _serve()
  deep = b"[" * 100_000 + b"]" * 100_000
  calls = [
    (
      "POST",
      "/translate",
      {"data": json.dumps({"text": "a"}), "headers": {"Content-Type": "text/plain"}},
    ),
    ("POST", "/translate", {"data": b"text=a"}),  # a form: no JSON content type
    (
      "POST",
      "/translate",
      {"data": deep[:99_000], "headers": {"Content-Type": "application/json"}},
    ),
    ("POST", "/translate", {"json": {"text": ["x"] * 51}}),
    ("POST", "/translate", {"data": '{"text": "a", "nbest": ' + "9" * 5000 + "}", "headers": J}),
    (
      "POST",
      "/translate",
      {"data": '{"text": ["ok", "\\ud800"]}', "headers": {"Content-Type": "application/json"}},
    ),
    (
      "POST",
      "/translate",
      {
        "data": '{"text": "\\udfff"}',
        "headers": {"Content-Type": "application/json; charset=utf-8"},
      },
    ),
    ("POST", "/translate", {"json": {"text": ["still", "up"]}}),
  ]
  out = _calls(app, calls)
  b.close()
  statuses = [status for status, _, _ in out]
  assert statuses == [415, 415, 400, 413, 400, 400, 400, 200], out
  for _, body, _ in out[:-1]:
    assert set(body) == {"error"} and "\n" not in body["error"]
  assert "application/json" in out[0][1]["error"]
  assert "nested too deeply" in out[2][1]["error"]
  assert "51 lines; the limit is 50 (--max_request_lines)" in out[3][1]["error"]
  assert "4300 digits" in out[4][1]["error"]
  assert out[5][1]["error"].startswith('"text"[1] cannot be encoded (UnicodeEncodeError')
  assert out[6][1]["error"].startswith('"text" cannot be encoded')
  assert out[7][1]["translations"] == ["STILL#0", "UP#1"]


def test_host_origin_cors_and_the_page_own_origin():
  app, b = _serve(guard_lib.Guard(True, 0, ("127.0.0.1",), ("http://localhost:3000",)))
  body = {"json": {"text": "a"}}
  out = _calls(
    app,
    [
      ("GET", "/health", {"headers": {"Host": "rebound.example:8080"}}),
      ("POST", "/translate", {**body, "headers": {"Origin": "https://evil.example"}}),
      ("POST", "/translate", {**body, "headers": {"Origin": "http://localhost:3000"}}),
      ("OPTIONS", "/translate", {"headers": {"Origin": "http://localhost:3000"}}),
      ("OPTIONS", "/translate", {"headers": {"Origin": "https://evil.example"}}),
    ],
  )
  b.close()
  assert out[0][0] == 403 and "rebound.example" in out[0][1]["error"]
  assert out[1][0] == 403 and "https://evil.example" in out[1][1]["error"]
  assert out[2][0] == 200 and out[2][2]["Access-Control-Allow-Origin"] == "http://localhost:3000"
  assert out[3][0] == 204 and "POST" in out[3][2]["Access-Control-Allow-Methods"]
  assert "Content-Type" in out[3][2]["Access-Control-Allow-Headers"]
  assert out[4][0] == 403


def test_an_open_server_wants_its_token_and_health_names_no_path():
  app, b = _serve(guard_lib.Guard(loopback=False, port=0, token="t0k3n-value"))
  out = _calls(
    app,
    [
      ("GET", "/health", {}),
      ("GET", "/health", {"headers": {"Authorization": "Bearer t0k3n-value"}}),
      ("POST", "/translate", {"json": {"text": "a"}, "params": {"token": "t0k3n-value"}}),
      ("GET", "/", {"params": {"token": "t0k3n-value"}}),
    ],
  )
  b.close()
  assert out[0][0] == 401 and "token" in out[0][1]["error"]
  assert out[1][0] == 200 and out[1][1]["run"] == "my-run" and "/" not in json.dumps(out[1][1])
  assert out[2][0] == 200 and out[3][0] == 200


def test_while_starting_health_says_how_far_and_translate_is_503_with_retry_after():
  app, b = _serve(ready=False)
  out = _calls(app, [("GET", "/health", {}), ("POST", "/translate", {"json": {"text": "a"}})])
  b.close()
  health = out[0][1]
  assert out[0][0] == 200 and health["status"] == "starting" and health["run"] == "my-run"
  assert health["batch_shapes_compiled"] == 3 and health["batch_shapes"] == 56
  assert out[1][0] == 503 and out[1][2]["Retry-After"] == "5"
  assert "compiling: 3 of 56 batch shapes" in out[1][1]["error"]


def test_metrics_in_prometheus_text():
  app, b = _serve()
  out = _calls(
    app,
    [
      ("POST", "/translate", {"json": {"text": ["a", "b", "c"]}}),
      ("POST", "/translate", {"json": {"text": "x", "nbest": 9}}),
      ("GET", "/metrics", {}),
    ],
  )
  b.close()
  text = out[-1][1]
  assert out[-1][0] == 200 and "text/plain" in out[-1][2]["Content-Type"]
  for line in (
    "flaxformer_nmt_requests_total 1.0",
    "flaxformer_nmt_lines_total 3.0",
    'flaxformer_nmt_errors_total{status="400"} 1.0',
    'flaxformer_nmt_batch_lines_bucket{le="4.0"} 1.0',
    "flaxformer_nmt_request_seconds_count 1.0",
    "flaxformer_nmt_queue_lines 0.0",
    "flaxformer_nmt_ready 1.0",
  ):
    assert line in text, line


def test_the_ready_line_is_written_before_health_says_ok():
  # A client that sees "ok" must find the "Ready" log line already written and ready_seconds set
  # (an e2e test once read the log between the two).
  backend = server.Backend("echo-run")
  seen = []
  b = batcher_lib.DynamicBatcher(Echo(), max_rows=8, max_wait_s=0.0, max_queue=8)
  backend.ready(
    b, LIMITS, {"model": "echo"}, lambda lines: None, lambda s: seen.append(backend.is_ready)
  )
  b.close()
  assert seen == [False] and backend.is_ready
  assert backend.details["ready_seconds"] == round(backend.ready_s, 1) >= 0
