"""--mode=serve in this process: the dynamic batcher on a stand-in translator, the HTTP routes on
aiohttp's test client, and the committed small model answering concurrent requests as
--mode=translate does. tests/e2e/test_serve.py starts the server as a process."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shutil
import threading
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from flaxformer_nmt import modes
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.decoding.translator import Hypothesis
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.serving import batcher as batcher_lib
from flaxformer_nmt.serving import guard as guard_lib
from flaxformer_nmt.serving import protocol, server, service
from flaxformer_nmt.serving.batcher import Kind


class Echo:
  """A stand-in translator: each line upper-cased and tagged with its number, `nbest` times;
  lines over 20 characters count as truncated. Records every batch; `gate` can hold them."""

  def __init__(self) -> None:
    self.batches: list[tuple[Kind, list[str], list[int]]] = []
    self.gate = threading.Event()
    self.gate.set()
    self.fail_next = False

  def __call__(self, kind: Kind, lines: list[str], numbers: list[int]):
    self.gate.wait(10)
    self.batches.append((kind, list(lines), list(numbers)))
    if self.fail_next:
      self.fail_next = False
      raise RuntimeError("the device fell over")
    hyps = [
      [Hypothesis(f"{line.upper()}#{n}", -float(k), "0-0" if kind.alignments else None)]
      for line, n in zip(lines, numbers, strict=True)
      for k in range(1)
    ]
    hyps = [h * kind.nbest for h in hyps]
    return hyps, [i for i, line in enumerate(lines) if len(line) > 20]


def _texts(answers: list[batcher_lib.Line]) -> list[str]:
  return [a.hypotheses[0].text for a in answers]


def test_concurrent_requests_share_one_batch_each_keeping_its_order_and_numbers():
  echo = Echo()
  b = batcher_lib.DynamicBatcher(echo, max_rows=8, max_wait_s=5.0, max_queue=8)
  with b._cond:  # the worker cannot look at the queue until all three are in (a re-entrant lock)
    futures = [b.submit(["a", "b"]), b.submit(["c", "d", "e"]), b.submit(["f", "g", "h"])]
  answers = [f.result(10) for f in futures]
  b.close()
  assert [_texts(a) for a in answers] == [
    ["A#0", "B#1"],
    ["C#0", "D#1", "E#2"],
    ["F#0", "G#1", "H#2"],
  ]
  assert len(echo.batches) == 1 and echo.batches[0][2] == [0, 1, 0, 1, 2, 0, 1, 2]
  assert b.stats.as_dict()["mean_batch_lines"] == 8.0


def test_a_lone_request_is_decoded_at_once_and_a_long_one_is_split():
  """Without other requests about, the batcher does not wait max_wait_s for company."""
  echo = Echo()
  b = batcher_lib.DynamicBatcher(echo, max_rows=4, max_wait_s=5.0, max_queue=8)
  start = time.monotonic()
  assert _texts(b.submit(["x"]).result(10)) == ["X#0"]
  assert time.monotonic() - start < 1.0
  lines = [f"l{i}" for i in range(10)]
  answers = b.submit(lines).result(10)
  b.close()
  assert _texts(answers) == [f"L{i}#{i}" for i in range(10)]  # numbered within the request
  assert [len(batch[1]) for batch in echo.batches] == [1, 4, 4, 2]
  assert b.submit([]).result(1) == []


def test_clients_answered_together_are_batched_again_without_waiting_for_more():
  """Once as many requests wait as the largest of the last batches answered, the batch goes:
  max_wait_s is only paid when that company is not (yet) there."""
  echo = Echo()
  b = batcher_lib.DynamicBatcher(echo, max_rows=8, max_wait_s=1.0, max_queue=8)
  with b._cond:  # two clients together, with room for more: the full wait, no more company
    first = [b.submit(["a"]), b.submit(["b"])]
  start = time.monotonic()
  [f.result(10) for f in first]
  assert time.monotonic() - start >= 0.9
  with b._cond:  # the two come back together: their company is here, no wait
    again = [b.submit(["c"]), b.submit(["d"])]
  start = time.monotonic()
  assert [_texts(f.result(10)) for f in again] == [["C#0"], ["D#0"]]
  assert time.monotonic() - start < 0.5
  b.close()
  assert [len(batch[1]) for batch in echo.batches] == [2, 2]


def test_a_batch_split_by_the_deadline_merges_again():
  """Four clients once answered together wait for each other again when two come back late (the
  largest recent batch sets the company expected, not the last one)."""
  echo = Echo()
  b = batcher_lib.DynamicBatcher(echo, max_rows=8, max_wait_s=1.0, max_queue=8)
  with b._cond:  # the four together: a batch of 4 after the full wait
    first = [b.submit([x]) for x in "abcd"]
  [f.result(10) for f in first]
  b._recent_requests.append(2)  # as if the deadline had once split them 2 + 2
  start = time.monotonic()
  early = [b.submit(["e"]), b.submit(["f"])]
  time.sleep(0.3)
  late = [b.submit(["g"]), b.submit(["h"])]
  assert [_texts(f.result(10)) for f in early + late] == [["E#0"], ["F#0"], ["G#0"], ["H#0"]]
  assert time.monotonic() - start < 0.9  # went when the four were there, before the deadline
  b.close()
  assert [len(batch[1]) for batch in echo.batches] == [4, 4]


def test_kinds_are_never_batched_together_and_truncation_is_per_line():
  echo = Echo()
  b = batcher_lib.DynamicBatcher(echo, max_rows=8, max_wait_s=0.01, max_queue=8)
  with b._cond:
    one = b.submit(["short", "a line well over twenty characters"])
    two = b.submit(["c"], Kind(nbest=2))
  first, second = one.result(10), two.result(10)
  b.close()
  assert [a.truncated for a in first] == [False, True]
  assert len(second[0].hypotheses) == 2
  assert sorted(len(batch[1]) for batch in echo.batches) == [1, 2]
  assert {batch[0] for batch in echo.batches} == {Kind(1, False), Kind(2, False)}


def test_a_full_queue_refuses_at_once_and_close_answers_every_accepted_request():
  echo = Echo()
  echo.gate.clear()
  b = batcher_lib.DynamicBatcher(echo, max_rows=1, max_wait_s=0.0, max_queue=2)
  taken = b.submit(["busy"])
  while b._queue:  # the worker took it and waits at the gate
    time.sleep(0.01)
  queued = [b.submit(["q1"]), b.submit(["q2"])]
  with pytest.raises(batcher_lib.QueueFull, match="2 requests are waiting"):
    b.submit(["one too many"])
  assert b.stats.refused == 1
  closing = threading.Thread(target=b.close)
  closing.start()
  time.sleep(0.05)
  with pytest.raises(batcher_lib.Closed):
    b.submit(["late"])
  echo.gate.set()
  closing.join(10)
  assert [_texts(f.result(0)) for f in [taken, *queued]] == [["BUSY#0"], ["Q1#0"], ["Q2#0"]]


def test_a_failed_batch_fails_its_requests_and_the_next_batch_is_served():
  echo = Echo()
  echo.fail_next = True
  b = batcher_lib.DynamicBatcher(echo, max_rows=4, max_wait_s=0.0, max_queue=4)
  with pytest.raises(RuntimeError, match="fell over"):
    b.submit(["a"]).result(10)
  assert _texts(b.submit(["b"]).result(10)) == ["B#0"]
  future = b.submit(["c"])
  assert not future.cancel()  # a client gone cannot break the worker's answer
  assert _texts(future.result(10)) == ["C#0"]
  b.close()


# The worker thread's death is the point: its exception escaping the thread is expected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_that_dies_fails_the_waiting_requests_instead_of_hanging_them():
  echo = Echo()
  b = batcher_lib.DynamicBatcher(echo, max_rows=4, max_wait_s=0.0, max_queue=4)
  b._decode = lambda batch: (_ for _ in ()).throw(SystemExit("the worker is gone"))
  with b._cond:  # both queued before the worker looks
    first, second = b.submit(["a"]), b.submit(["b"])
  for future in (first, second):
    with pytest.raises(SystemExit):
      future.result(10)
  b.close(10)
  assert not b.alive
  with pytest.raises(batcher_lib.Closed, match="the batcher has failed"):
    b.submit(["c"])


# ------------------------------------------------------------------------------------------------
# The HTTP routes.

LIMITS = protocol.Limits(max_request_bytes=200, max_nbest=4, nbest_rule="beam 4")


def _client_calls(app, calls):
  """[(status, JSON or text)] of each (method, path, body) in turn, on aiohttp's test server."""

  async def run():
    out = []
    async with TestClient(TestServer(app)) as client:
      for method, path, body in calls:
        data = body if isinstance(body, bytes | None) else json.dumps(body)
        headers = {"Content-Type": "application/json"} if method == "POST" else {}
        response = await client.request(method, path, data=data, headers=headers)
        kind = response.headers.get("Content-Type", "")
        out.append(
          (response.status, await (response.json() if "json" in kind else response.text()))
        )
    return out

  return asyncio.run(run())


def _app(echo: Echo, queue: int = 8, guard: guard_lib.Guard | None = None, ready: bool = True):
  """The routes around a batcher of `echo` (a Backend made ready, unless `ready` is False)."""
  b = batcher_lib.DynamicBatcher(echo, max_rows=8, max_wait_s=0.0, max_queue=queue)
  backend = server.Backend("echo-run")
  # aiohttp's test server picks its port: the loopback guard is told the name alone.
  guard = guard or guard_lib.Guard(loopback=True, port=0, allowed_hosts=("127.0.0.1",))
  app = server.make_app(backend, guard, LIMITS.max_request_bytes)
  if ready:
    backend.ready(
      b, LIMITS, {"model": "echo", "step": 7}, lambda lines: protocol.check_encodable(lines, str)
    )
  return app, b


def test_translate_answers_in_the_shape_asked_for():
  app, b = _app(Echo())
  calls = [
    ("POST", "/translate", {"text": "one"}),
    ("POST", "/translate", {"text": ["a", "", "a line well over twenty characters"]}),
    ("POST", "/translate", {"text": ["a", "b"], "nbest": 2}),
    ("POST", "/translate", {"text": "a", "alignments": True}),
    ("POST", "/translate", {"text": []}),
    ("GET", "/health", None),
    ("GET", "/", None),
  ]
  out = _client_calls(app, calls)
  b.close()
  assert out[0] == (200, {"translations": ["ONE#0"], "truncated": [False]})
  assert out[1] == (
    200,
    {
      "translations": ["A#0", "#1", "A LINE WELL OVER TWENTY CHARACTERS#2"],
      "truncated": [False, False, True],
    },
  )
  nbest = out[2][1]["translations"]
  assert [[h["text"] for h in hyps] for hyps in nbest] == [["A#0", "A#0"], ["B#1", "B#1"]]
  assert out[3][1]["translations"] == [{"text": "A#0", "score": -0.0, "alignment": "0-0"}]
  assert out[4] == (200, {"translations": [], "truncated": []})
  assert out[5][0] == 200 and out[5][1]["status"] == "ok" and out[5][1]["step"] == 7
  assert out[5][1]["batches"]["lines"] == 7
  assert out[6][0] == 200 and '<textarea id="source"' in out[6][1]


BAD_REQUESTS = [
  (b"{not json", "the body is not JSON"),
  ([1, 2], "must be a JSON object"),
  ({"txt": "a"}, "unknown field 'txt'"),
  ({"nbest": 2}, '"text" is missing'),
  ({"text": 3}, '"text" must be a string or a list of strings'),
  ({"text": ["a", 3]}, '"text" must be a string or a list of strings'),
  ({"text": ["a", "b\nc"]}, '"text"[1] holds a line break'),
  ({"text": "a", "nbest": 0}, '"nbest" must be a whole number >= 1, got 0'),
  ({"text": "a", "nbest": "2"}, '"nbest" must be a whole number >= 1, got "2"'),
  ({"text": "a", "nbest": True}, '"nbest" must be a whole number >= 1, got true'),
  ({"text": "a", "nbest": 5}, '"nbest"=5 is more than 4: beam 4'),
  ({"text": "a", "alignments": "yes"}, '"alignments" must be true or false'),
  (b"\xff\xfe", "the body is not JSON"),
]


def test_bad_requests_get_400_with_one_line_and_the_server_stays_up():
  app, b = _app(Echo())
  calls = [("POST", "/translate", body) for body, _ in BAD_REQUESTS]
  calls += [("GET", "/nowhere", None), ("GET", "/translate", None)]
  calls += [("POST", "/translate", b"x" * 201), ("POST", "/translate", {"text": "still up"})]
  out = _client_calls(app, calls)
  b.close()
  (missing, missing_answer), (method, method_answer) = out[-4:-2]
  assert missing == 404 and "GET /nowhere; the routes: POST /translate" in missing_answer["error"]
  assert (
    method == 405 and "Method Not Allowed: GET /translate (allowed: POST)" in method_answer["error"]
  )
  for (status, answer), (_, message) in zip(out, BAD_REQUESTS, strict=False):
    assert status == 400 and message in answer["error"] and "\n" not in answer["error"], answer
  status, answer = out[-2]
  assert status == 413 and "201 bytes; the limit is 200" in answer["error"]
  assert out[-1] == (200, {"translations": ["STILL UP#0"], "truncated": [False]})


def test_a_full_queue_is_503_and_a_failed_batch_500():
  echo = Echo()
  echo.gate.clear()
  app, b = _app(echo, queue=1)
  b.submit(["holds the worker"])
  while b._queue:
    time.sleep(0.01)
  b.submit(["fills the queue"])

  async def run():
    async with TestClient(TestServer(app)) as client:
      busy = await client.post("/translate", json={"text": "refused"})
      refused = (busy.status, await busy.json(), busy.headers.get("Retry-After"))
      echo.gate.set()
      while b.stats.batches < 2:  # the two queued requests are served
        await asyncio.sleep(0.01)
      echo.fail_next = True
      failed = await client.post("/translate", json={"text": "fails"})
      return refused, (failed.status, await failed.json())

  refused, failed = asyncio.run(run())
  b.close()
  assert refused[0] == 503 and "the server is busy" in refused[1]["error"] and refused[2] == "1"
  assert failed == (500, {"error": "decoding failed: RuntimeError: the device fell over"})


# ------------------------------------------------------------------------------------------------
# The real model: the committed small trained workdir.


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_the_served_model_answers_concurrent_requests_as_translate_does(saved_run, tmp_path):
  config, workdir = saved_run
  lines = ["We need forty-two chairs.", "", "three hundred and five", "nine", "one thousand"]
  lines += ["seven hundred and eleven", "two", "eighty-eight apples", "six", "five hundred"]
  lines.append(" ".join(["ninety-nine"] * 40))  # longer than data.max_len: cut, as translate cuts
  expected, _, _ = modes.translate_hypotheses(config, str(workdir), "latest", lines)
  expected_nbest, _, _ = modes.translate_hypotheses(
    config, str(workdir), "latest", lines[:4], modes.Outputs(nbest=2)
  )
  served = service.ServedSession(Session.load(config, Workdir(str(workdir)), "latest"))
  b = batcher_lib.DynamicBatcher(served.translate, max_rows=8, max_wait_s=0.02, max_queue=64)
  requests = [lines[i : i + 3] for i in range(0, len(lines), 3)]
  with concurrent.futures.ThreadPoolExecutor(len(requests) + 1) as pool:
    futures = [pool.submit(lambda r: b.submit(r).result(120), r) for r in requests]
    nbest = pool.submit(lambda: b.submit(lines[:4], Kind(nbest=2)).result(120))
    answers = [a for f in futures for a in f.result()]
    nbest_answers = nbest.result()
  b.close()
  assert [a.hypotheses[0].text for a in answers] == [h[0].text for h in expected]
  for got, want in zip(answers, expected, strict=True):
    assert got.hypotheses[0].score == pytest.approx(want[0].score, rel=1e-4, abs=1e-5)
  assert [a.truncated for a in answers] == [False] * 10 + [True]
  assert [[h.text for h in a.hypotheses] for a in nbest_answers] == [
    [h.text for h in hyps] for hyps in expected_nbest
  ]
  assert b.stats.batches < len(requests) + 1  # some requests shared a batch
  assert served.get(Kind()).batch_shapes()  # the shapes a server compiles up front
  # --ensemble, loaded as the server loads it, decodes as translate's --ensemble: the member is
  # the same run a few steps earlier (its last checkpoint removed), so it moves the scores.
  member = shutil.copytree(workdir, tmp_path / "member")
  steps = sorted(int(p.name) for p in (member / "checkpoints").iterdir() if p.name.isdigit())
  shutil.rmtree(member / "checkpoints" / str(steps[-1]))
  ensemble = Session.load(config, Workdir(str(workdir)), "latest", (str(member),))
  assert ensemble.description.startswith("ensemble of 2 models")
  hypotheses, _ = service.ServedSession(ensemble).translate(Kind(), lines[:3], [0, 1, 2])
  want, _, _ = modes.translate_hypotheses(
    config, str(workdir), "latest", lines[:3], modes.Outputs(members=(str(member),))
  )
  assert [h[0].text for h in hypotheses] == [h[0].text for h in want]
  assert [h[0].score for h in hypotheses] == pytest.approx([h[0].score for h in want], rel=1e-5)
  assert [h[0].score for h in want] != pytest.approx([h[0].score for h in expected[:3]], rel=1e-3)


def test_serve_options_and_limits_refuse_in_one_line():
  from flaxformer_nmt import errors  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.serving.options import Options  # pylint: disable=g-import-not-at-top

  for options, message in (
    (Options(port=70000), "--port=70000: give a port number in \\[1, 65535\\]"),
    (Options(port=0), "--port=0: give a port number"),
    (Options(max_wait_ms=-1), "--max_wait_ms=-1: give a number of milliseconds in"),
    (Options(max_wait_ms=float("inf")), "--max_wait_ms=inf: give a number of milliseconds in"),
    (Options(queue_size=0), "--queue_size=0: give 1 or more"),
    (Options(host="203.0.113.7", port=8080), "--host=203.0.113.7 --port=8080: cannot listen"),
  ):
    with pytest.raises(errors.ConfigError, match=message):
      options.check()
  import ml_collections  # pylint: disable=g-import-not-at-top

  beam = ml_collections.ConfigDict(dict(method="beam", beam_size=4))
  assert service.limits(beam, Options()).max_nbest == 4
  greedy = ml_collections.ConfigDict(dict(method="greedy", beam_size=4))
  assert service.limits(greedy, Options()).max_nbest == 1
