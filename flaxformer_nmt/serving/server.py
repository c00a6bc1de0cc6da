"""`--mode=serve`'s HTTP side: the routes, start-up and shutdown (protocol.py reads a body).

  POST /translate  {"text": "..." | ["...", ...], "nbest": K, "alignments": false,
                    "target_lang": "fr" (a multilingual model's output language),
                    "source_lang": "en" (an imported M2M100's input language)}
                   -> {"translations": [...], "truncated": [...]} (input order; with "nbest"
                   each translation is a list of {"text", "score"}; with "alignments" each has
                   its Pharaoh "alignment" and the answer is in that form too)
  GET  /health     -> {"status": "starting" | "ok", "run": ..., ...}
  GET  /metrics    -> Prometheus's text format (metrics.py)
  GET  /           -> the page (page.html): a text box, the translation, n-best, the alignment

The server listens before the model loads (`Backend` says how far start-up is: /health answers
"starting" with the batch shapes compiled so far, and /translate 503 with Retry-After), so a client
sees it come up instead of "connection refused". Who may call is guard.py's. A request is checked
whole before it joins a batch: JSON only (415 otherwise), size (413), lines (413 over
--max_request_lines), fields (400), nesting (400), and every line encoded (400 naming the line
that cannot be). Every error is one line of JSON, `{"error": "..."}`, and the server goes on.

SIGTERM (or Ctrl-C) stops accepting connections, drops uploads not yet received, lets the
decoding in flight finish, and returns within --grace_s; during start-up it returns at once.
aiohttp is imported here and JAX is not: the loader (service.py) imports it on its own thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.resources
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from absl import logging
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from flaxformer_nmt.serving import batcher as batcher_lib
from flaxformer_nmt.serving import guard as guard_lib
from flaxformer_nmt.serving import metrics as metrics_lib
from flaxformer_nmt.serving.protocol import BadRequest, Limits, TooLarge, answer, parse_request

_ROUTES = "POST /translate, GET /health, GET /metrics, GET /"


class Backend:
  """What the routes serve from: "starting" (with the loader's progress) until the loader hands
  over the batcher, the request limits, the /health details and the line check (`ready`)."""

  def __init__(self, run_name: str) -> None:
    self.run_name = run_name
    self.url = ""  # set once the server listens
    self.began = time.monotonic()
    self.stage = "loading the model"
    self.compiled = 0
    self.shapes = 0
    self.batcher: batcher_lib.DynamicBatcher | None = None
    self.limits: Limits | None = None
    self.details: dict[str, Any] = {}
    self.check_lines: Callable[[list[str]], None] = lambda lines: None
    self.ready_s: float | None = None
    self.batch_hook: Callable[[int], None] | None = None  # each batch's lines (metrics)
    self._lock = threading.Lock()

  def progress(self, done: int, total: int) -> None:
    with self._lock:
      self.stage, self.compiled, self.shapes = "compiling", done, total

  def ready(
    self,
    batcher: batcher_lib.DynamicBatcher,
    limits: Limits,
    details: dict[str, Any],
    check_lines: Callable[[list[str]], None],
    announce: Callable[[float], None] = lambda ready_s: None,
  ) -> None:
    """Publishes the batcher, after `announce(seconds since the server began)` has run (the
    "Ready" log line): whoever sees /health say "ok" finds that line already written and
    `ready_seconds` in the details."""
    with self._lock:
      self.limits, self.check_lines = limits, check_lines
      self.ready_s = time.monotonic() - self.began
      self.details = {"run": self.run_name, **details, "ready_seconds": round(self.ready_s, 1)}
      announce(self.ready_s)
      self.batcher = batcher  # last: a route that sees it sees the rest

  @property
  def is_ready(self) -> bool:
    return self.batcher is not None

  def starting(self) -> str:
    """Where start-up is, in a few words."""
    if self.stage == "compiling":
      return f"compiling: {self.compiled} of {self.shapes} batch shapes"
    return self.stage


def url_host(host: str) -> str:
  """`host` as a URL names it ([::1] for an IPv6 address)."""
  return f"[{host}]" if ":" in host and not host.startswith("[") else host


class _AccessLog(AbstractAccessLogger):
  """aiohttp's access line, without the query string (it may hold the token)."""

  def log(self, request: Any, response: Any, time: float) -> None:  # noqa: A002 (aiohttp's name)
    self.logger.info(
      '%s "%s %s" %s %.3f s', request.remote, request.method, request.path, response.status, time
    )


def _error(status: int, message: str, **headers: str) -> web.Response:
  return web.json_response({"error": " ".join(message.split())}, status=status, headers=headers)


class Uploads:
  """The handlers still reading a body: SIGTERM cancels them (a stalled upload must not hold
  shutdown), while the ones already decoding finish."""

  def __init__(self) -> None:
    self.reading: set[asyncio.Task] = set()

  async def read(self, request: web.Request) -> bytes:
    task = asyncio.current_task()
    assert task is not None
    self.reading.add(task)
    try:
      return await request.read()
    finally:
      self.reading.discard(task)

  def drop(self) -> int:
    for task in self.reading:
      task.cancel()
    return len(self.reading)


def make_app(
  backend: Backend,
  guard: guard_lib.Guard,
  max_request_bytes: int,
  uploads: Uploads | None = None,
) -> web.Application:
  """The aiohttp application (tests drive it in-process with aiohttp's test client)."""
  page = importlib.resources.files("flaxformer_nmt.serving").joinpath("page.html").read_bytes()
  uploads = uploads or Uploads()
  metrics = metrics_lib.Metrics(
    queue_lines=lambda: backend.batcher.queued_lines if backend.batcher else 0,
    ready=lambda: 1.0 if backend.is_ready else 0.0,
  )
  backend.batch_hook = metrics.batch_lines.observe

  def starting() -> web.Response:
    return _error(
      503, f"the server is starting ({backend.starting()}); retry shortly", **{"Retry-After": "5"}
    )

  async def translate(request: web.Request) -> web.Response:
    arrived = time.monotonic()
    if not backend.is_ready:
      return starting()
    limits, batcher = backend.limits, backend.batcher
    assert limits is not None and batcher is not None
    if request.content_type != "application/json":
      return _error(
        415,
        f"the body must be JSON sent as Content-Type: application/json, not "
        f"{request.headers.get('Content-Type', '(none)')!r}",
      )
    if request.content_length is not None and request.content_length > limits.max_request_bytes:
      return _error(
        413,
        f"the body has {request.content_length} bytes; the limit is "
        f"{limits.max_request_bytes} (--max_request_bytes)",
      )
    try:
      body = await uploads.read(request)
    except web.HTTPRequestEntityTooLarge:
      return _error(
        413, f"the body is over the limit of {limits.max_request_bytes} bytes (--max_request_bytes)"
      )
    try:
      asked = parse_request(body, limits)
      if asked.lines:
        await asyncio.get_running_loop().run_in_executor(None, backend.check_lines, asked.lines)
    except TooLarge as e:
      return _error(413, str(e))
    except BadRequest as e:
      return _error(400, str(e))
    try:
      future = batcher.submit(asked.lines, asked.kind)
    except batcher_lib.QueueFull as e:
      return _error(503, f"the server is busy: {e}; retry shortly", **{"Retry-After": "1"})
    except batcher_lib.Closed as e:
      return _error(503, str(e))
    try:
      answers = await asyncio.wrap_future(future)
    except Exception as e:  # a decoding failure: this request fails, the server stays up
      return _error(500, f"decoding failed: {type(e).__name__}: {e}")
    metrics.requests.inc()
    metrics.lines.inc(len(asked.lines))
    metrics.latency.observe(time.monotonic() - arrived)
    return web.json_response(answer(answers, asked))

  async def health_route(request: web.Request) -> web.Response:
    del request
    batcher = backend.batcher
    if batcher is None:
      return web.json_response(
        {
          "status": "starting",
          "run": backend.run_name,
          "stage": backend.stage,
          "batch_shapes_compiled": backend.compiled,
          "batch_shapes": backend.shapes,
          "seconds": round(time.monotonic() - backend.began, 1),
        }
      )
    alive = batcher.alive
    status = "ok" if alive else "failed: the decoding worker stopped; restart the server"
    return web.json_response(
      {
        "status": status,
        **backend.details,
        "queue_lines": batcher.queued_lines,
        "batches": batcher.stats.as_dict(),
      },
      status=200 if alive else 503,
    )

  async def metrics_route(request: web.Request) -> web.Response:
    del request
    return web.Response(body=metrics.text(), headers={"Content-Type": metrics_lib.CONTENT_TYPE})

  async def index(request: web.Request) -> web.Response:
    del request
    return web.Response(body=page, content_type="text/html", charset="utf-8")

  @web.middleware
  async def guarded(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Who may call (guard.py), CORS for allowed origins, and every error in JSON: aiohttp's own
    refusals (an unknown path: 404, a wrong method: 405) too, so a client reads them alike."""
    refusal = guard.check(request.method, request.headers, request.query)
    if refusal is not None:
      response: web.StreamResponse = _error(
        refusal.status, refusal.message, **dict(refusal.headers)
      )
    elif request.method == "OPTIONS":  # a CORS preflight (its origin is allowed: guard)
      response = web.Response(
        status=204,
        headers={"Allow": guard_lib.CORS_METHODS, **guard.cors_headers(request.headers, True)},
      )
    else:
      try:
        response = await handler(request)
      except web.HTTPException as e:
        if e.status < 400:
          raise
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else {}  # a 405 must say it
        told = f" (allowed: {allow['Allow']})" if allow else ""
        response = _error(
          e.status,
          f"{e.reason}: {request.method} {request.path}{told}; the routes: {_ROUTES}",
          **allow,
        )
      except Exception as e:  # pylint: disable=broad-except  (a bug of ours: logged, one line)
        logging.exception("Answering %s %s failed.", request.method, request.path)
        response = _error(500, f"the server failed ({type(e).__name__}); its log says more")
      response.headers.update(guard.cors_headers(request.headers))
    if response.status >= 400:
      metrics.errors.labels(str(response.status)).inc()
    return response

  # aiohttp refuses a larger body itself (413) while it is read; the check above answers in JSON.
  app = web.Application(client_max_size=max_request_bytes, middlewares=[guarded])
  app.add_routes(
    [
      web.post("/translate", translate),
      web.get("/health", health_route),
      web.get("/metrics", metrics_route),
      web.get("/", index),
    ]  # OPTIONS (a CORS preflight) is answered by the middleware, for any path
  )
  return app


@dataclasses.dataclass
class Served:
  """How serving ended."""

  ready: bool  # start-up had finished
  shutdown_s: float = 0.0
  uploads_dropped: int = 0


def serve(
  app: web.Application,
  backend: Backend,
  host: str,
  port: int,
  grace_s: float,
  uploads: Uploads,
  on_listening: Callable[[str, Callable[[BaseException], None]], None],
) -> Served:
  """Serves `app` until SIGTERM or SIGINT (or until the loader fails: its error is raised here).

  `on_listening(url, fail)` is called once the socket listens; it starts the loader, which calls
  `fail(error)` if it cannot finish (from its own thread). On a signal the server stops
  accepting, drops the uploads not yet received, lets the decoding in flight finish for what is
  left of `grace_s`, and returns; a second signal ends the process at once."""
  failure: list[BaseException] = []

  async def run() -> Served:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def stopping() -> None:
      stop.set()
      for sig in signals:  # a second signal acts as if none were caught: it ends the process
        loop.remove_signal_handler(sig)

    def fail(error: BaseException) -> None:
      def record() -> None:
        failure.append(error)
        stop.set()

      try:
        loop.call_soon_threadsafe(record)
      except RuntimeError:  # the loop has ended (stopped during start-up): nothing to tell
        pass

    for sig in signals:
      # Ours, not aiohttp's: its handler raises out of the event loop, which then cancels the
      # requests in flight instead of finishing them.
      loop.add_signal_handler(sig, stopping)
    # What the requests in flight may take after a signal: the grace, less a margin for writing
    # the result and exiting.
    runner = web.AppRunner(
      app,
      handle_signals=False,
      shutdown_timeout=max(grace_s - 3.0, 0.5),
      access_log_class=_AccessLog,  # no query strings: a token may be in one
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    backend.url = f"http://{url_host(host)}:{port}"
    on_listening(backend.url, fail)
    await stop.wait()
    start = time.monotonic()
    ready = backend.is_ready
    if ready and not failure:
      logging.info(
        "Stopping: no new connections; finishing the decoding in flight (up to %.0f s; a second "
        "SIGTERM or Ctrl-C ends it now).",
        grace_s,
      )
    if backend.batcher is not None:
      backend.batcher.refuse_new()  # what is accepted is decoded; nothing more is
    dropped = uploads.drop()
    await runner.cleanup()  # closes the listener, waits for the handlers in flight
    took = time.monotonic() - start
    if ready:
      logging.info("Stopped serving (shutdown took %.1f s).", took)
    return Served(ready=ready, shutdown_s=round(took, 2), uploads_dropped=dropped)

  served = asyncio.run(run())
  if failure:
    raise failure[0]
  return served
