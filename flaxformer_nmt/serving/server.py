"""`--mode=serve`'s HTTP side: the routes, the checks of a request, and start-up and shutdown.

  POST /translate  {"text": "..." | ["...", ...], "nbest": K, "alignments": false}
                   -> {"translations": [...], "truncated": [...]} (input order; with "nbest"
                   each translation is a list of {"text", "score"}; with "alignments" each has
                   its Pharaoh "alignment" and the answer is in that form too)
  GET  /health     -> {"status": "ok", "model": ..., "checkpoint": ..., "step": ..., ...}
  GET  /           -> the page (page.html): a text box, the translation, n-best, the alignment

aiohttp parses HTTP; this module only reads JSON. A body over `max_request_bytes` is answered 413,
bad JSON or a field of the wrong type 400, a full queue 503, each with `{"error": "<one line>"}`,
and the server goes on serving. SIGTERM (or Ctrl-C) stops accepting connections, lets the
requests in flight finish (up to SHUTDOWN_TIMEOUT_S; a second signal ends the process at once),
and returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.resources
import json
import signal
import time
from collections.abc import Callable
from typing import Any

from absl import logging
from aiohttp import web

from flaxformer_nmt.serving import batcher as batcher_lib

_FIELDS = ("text", "nbest", "alignments")
SHUTDOWN_TIMEOUT_S = 60  # how long the requests in flight may take to finish after SIGTERM


@dataclasses.dataclass(frozen=True)
class Limits:
  """What a request may ask: the body's size and the n-best lists the search can give."""

  max_request_bytes: int = 1 << 20
  max_nbest: int = 1  # beam: beam_size; sample: any number up to this; greedy: 1
  nbest_rule: str = "greedy search finds one hypothesis"


class BadRequest(ValueError):
  """A request the server refuses with 400 (its message is the one line)."""


@dataclasses.dataclass(frozen=True)
class Asked:
  """A /translate request, checked."""

  lines: list[str]
  kind: batcher_lib.Kind
  nbest_list: bool  # "nbest" was given: answer with lists of {"text", "score"}


def parse_request(body: bytes, limits: Limits) -> Asked:
  """What a /translate body asks for; BadRequest, naming the field, otherwise."""
  try:
    request = json.loads(body.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise BadRequest(f"the body is not JSON: {' '.join(str(e).split())}") from None
  if not isinstance(request, dict):
    raise BadRequest('the body must be a JSON object, e.g. {"text": "..."}')
  unknown = sorted(set(request) - set(_FIELDS))
  if unknown:
    raise BadRequest(f"unknown field {unknown[0]!r}; the fields are {', '.join(_FIELDS)}")
  if "text" not in request:
    raise BadRequest('"text" is missing: give a string or a list of strings')
  text = request["text"]
  lines = [text] if isinstance(text, str) else text
  if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
    raise BadRequest('"text" must be a string or a list of strings')
  for i, line in enumerate(lines):
    if "\n" in line or "\r" in line:
      where = '"text"' if isinstance(text, str) else f'"text"[{i}]'
      raise BadRequest(f"{where} holds a line break: send one line per string")
  nbest = request.get("nbest", 1)
  if isinstance(nbest, bool) or not isinstance(nbest, int) or nbest < 1:
    raise BadRequest(f'"nbest" must be a whole number >= 1, got {json.dumps(nbest)}')
  if nbest > limits.max_nbest:
    raise BadRequest(f'"nbest"={nbest} is more than {limits.max_nbest}: {limits.nbest_rule}')
  alignments = request.get("alignments", False)
  if not isinstance(alignments, bool):
    raise BadRequest(f'"alignments" must be true or false, got {json.dumps(alignments)}')
  return Asked(lines, batcher_lib.Kind(nbest, alignments), "nbest" in request)


def answer(lines: list[batcher_lib.Line], asked: Asked) -> dict:
  """The /translate response for the batcher's answers: plain strings for one hypothesis per
  line, lists of {"text", "score"} when an n-best list was asked for, "alignment" when asked."""

  def hypothesis(h: Any) -> dict[str, Any]:
    out = {"text": h.text, "score": h.score}
    if asked.kind.alignments:
      out["alignment"] = h.alignment
    return out

  if asked.nbest_list:
    translations: list[Any] = [[hypothesis(h) for h in line.hypotheses] for line in lines]
  elif asked.kind.alignments:
    translations = [hypothesis(line.hypotheses[0]) for line in lines]
  else:
    translations = [line.hypotheses[0].text for line in lines]
  return {"translations": translations, "truncated": [line.truncated for line in lines]}


def _error(status: int, message: str, **headers: str) -> web.Response:
  return web.json_response({"error": " ".join(message.split())}, status=status, headers=headers)


def make_app(batcher: batcher_lib.DynamicBatcher, health: Callable[[], dict], limits: Limits):
  """The aiohttp application (tests drive it in-process with aiohttp's test client)."""
  page = importlib.resources.files("flaxformer_nmt.serving").joinpath("page.html").read_bytes()

  async def translate(request: web.Request) -> web.Response:
    if request.content_length is not None and request.content_length > limits.max_request_bytes:
      return _error(
        413,
        f"the body has {request.content_length} bytes; the limit is "
        f"{limits.max_request_bytes} (--max_request_bytes)",
      )
    try:
      body = await request.read()
    except web.HTTPRequestEntityTooLarge:
      return _error(
        413, f"the body is over the limit of {limits.max_request_bytes} bytes (--max_request_bytes)"
      )
    try:
      asked = parse_request(body, limits)
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
    return web.json_response(answer(answers, asked))

  async def health_route(request: web.Request) -> web.Response:
    del request
    status = "ok" if batcher.alive else "failed: the decoding worker stopped; restart the server"
    return web.json_response(
      {"status": status, **health(), "batches": batcher.stats.as_dict()},
      status=200 if batcher.alive else 503,
    )

  async def index(request: web.Request) -> web.Response:
    del request
    return web.Response(body=page, content_type="text/html", charset="utf-8")

  @web.middleware
  async def json_errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """aiohttp's own refusals (an unknown path: 404, a wrong method: 405) answered in JSON as
    well, so a client reads every error the same way."""
    try:
      return await handler(request)
    except web.HTTPException as e:
      if e.status < 400:
        raise
      routes = "POST /translate, GET /health, GET /"
      allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else {}  # a 405 must say it
      told = f" (allowed: {allow['Allow']})" if allow else ""
      return _error(
        e.status,
        f"{e.reason}: {request.method} {request.path}{told}; the routes: {routes}",
        **allow,
      )

  # aiohttp refuses a larger body itself (413) while it is read; the check above answers in JSON.
  app = web.Application(client_max_size=limits.max_request_bytes, middlewares=[json_errors])
  app.add_routes(
    [web.post("/translate", translate), web.get("/health", health_route), web.get("/", index)]
  )
  return app


def serve(app: web.Application, host: str, port: int, on_ready: Callable[[str], None]) -> None:
  """Serves `app` until SIGTERM or SIGINT, then stops accepting connections and lets the
  requests in flight finish (for up to a minute) before returning."""

  async def run() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def stopping() -> None:
      stop.set()
      for sig in signals:  # a second signal acts as if none were caught: it ends the process
        loop.remove_signal_handler(sig)

    for sig in signals:
      # Ours, not aiohttp's: its handler raises out of the event loop, which then cancels the
      # requests in flight instead of finishing them.
      loop.add_signal_handler(sig, stopping)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    on_ready(f"http://{host}:{port}")
    await stop.wait()
    logging.info(
      "Stopping: no new connections; finishing the requests in flight (up to %d s; a second "
      "SIGTERM or Ctrl-C ends it now).",
      SHUTDOWN_TIMEOUT_S,
    )
    start = time.monotonic()
    await runner.cleanup()  # closes the listener, waits for the handlers in flight
    logging.info("Stopped serving (shutdown took %.1f s).", time.monotonic() - start)

  asyncio.run(run())
