"""`--mode=serve` from the command line: listen first, then load and compile on another thread.

The HTTP server listens within a second or two of the command (aiohttp only; JAX is not imported
on this thread), and answers /health with start-up's progress while the loader thread imports JAX,
checks the run, loads the parameters and compiles the batch shapes (service.py). SIGTERM or
Ctrl-C is handled at any time, since XLA compiles off the main thread: during start-up the server
writes `serve_result.json` and exits 0 at once; when serving, it stops within --grace_s (server.py).
A user error found by the loader (a config that disagrees with the run, a missing checkpoint) stops
the server and is the command's one line, exit 2, as before it listened.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.serving.options import Options


def run(workdir: str, load: Callable[[], Any], options: Options) -> dict[str, Any]:
  """Serves the run in `workdir` until SIGTERM; the figures it writes to serve_result.json.
  `load()` (the command's: modes.serving_model with its flags) checks the run and returns its
  loaded model; it runs on the loader thread, and is where JAX is first imported."""
  options.check()
  try:
    import aiohttp  # noqa: F401  (the [serve] extra)
    import prometheus_client  # noqa: F401
  except ImportError as e:
    raise errors.ConfigError(
      f"--mode=serve needs aiohttp and prometheus_client ({e}); install them with "
      "pip install -e '.[serve]'."
    ) from None
  from flaxformer_nmt.serving import guard as guard_lib  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.serving import server  # pylint: disable=g-import-not-at-top

  token = options.token or ("" if options.loopback else guard_lib.new_token())
  name = os.path.basename(os.path.normpath(os.path.abspath(workdir)))
  backend = server.Backend(name)
  hosts = options.allowed_hosts + ((options.host,) if options.loopback else ())
  guard = guard_lib.Guard(options.loopback, options.port, hosts, options.allowed_origins, token)
  uploads = server.Uploads()
  app = server.make_app(backend, guard, options.max_request_bytes, uploads)
  loader = _Loader(load, options, backend)

  def on_listening(url: str, fail: Callable[[BaseException], None]) -> None:
    logging.info("Listening at %s; loading the model (GET /health shows start-up).", url)
    if token and not options.token:  # generated: printed once, here
      shown = url.replace("//0.0.0.0:", "//<this host>:").replace("//[::]:", "//<this host>:")
      sys.stderr.write(
        f"\nThe token for this server: {token}\nThe page: {shown}/?token={token}\n\n"
      )
      sys.stderr.flush()
    loader.start(fail)

  began = time.monotonic()
  served = server.serve(
    app, backend, options.host, options.port, options.grace_s, uploads, on_listening
  )
  result: dict[str, Any] = {
    "mode": "serve",
    "url": f"http://{server.url_host(options.host)}:{options.port}",
    "run": name,
    "ready": served.ready,
    "uploads_dropped": served.uploads_dropped,
  }
  if not served.ready:  # stopped during start-up: the loader may be deep in XLA
    result["stopped"] = f"during start-up ({backend.starting()})"
    result["served_seconds"] = round(time.monotonic() - began, 1)
    _write(workdir, result)
    logging.info("Stopped during start-up (%s).", backend.starting())
    _exit_now()  # not waiting for a compile to end
  batcher = backend.batcher
  assert batcher is not None and loader.session is not None
  # The decoding in flight had the grace less a margin (server.serve); the queue's rest is done
  # within what is left of it.
  batcher.close(timeout=max(options.grace_s - served.shutdown_s - 2.0, 0.5))
  still_decoding = batcher.alive  # lines of clients already gone: not worth overstaying for
  result |= {
    "checkpoint": loader.session.description,
    "ready_seconds": round(backend.ready_s or 0.0, 1),
    "batch_shapes_compiled": backend.details.get("batch_shapes_compiled"),
    "shutdown_seconds": served.shutdown_s,
    "served_seconds": round(time.monotonic() - began, 1),
    **batcher.stats.as_dict(),
  }
  _write(workdir, result)
  if still_decoding:  # the worker is inside XLA: leave without waiting for it, as promised
    logging.warning("Leaving with a batch still decoding (--grace_s=%g).", options.grace_s)
    _exit_now()
  return result


def _exit_now() -> None:
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)  # pylint: disable=protected-access


def _write(workdir: str, result: dict[str, Any]) -> None:
  from flaxformer_nmt.run.folder import Workdir  # pylint: disable=g-import-not-at-top

  Workdir(workdir).write_result(result)


class _Loader:
  """The thread that imports JAX, loads the run and compiles (service.start)."""

  def __init__(self, load: Callable[[], Any], options: Options, backend: Any) -> None:
    self._load = load
    self._options = options
    self._backend = backend
    self.session: Any = None
    self.thread: threading.Thread | None = None

  def start(self, fail: Callable[[BaseException], None]) -> None:
    self.thread = threading.Thread(target=self._run, args=(fail,), name="loader", daemon=True)
    self.thread.start()

  def _run(self, fail: Callable[[BaseException], None]) -> None:
    try:
      self.session = self._load()  # imports JAX: seconds
      from flaxformer_nmt.serving import service  # pylint: disable=g-import-not-at-top

      service.start(self.session, self._options, self._backend)
    except BaseException as e:  # pylint: disable=broad-except  (raised on the main thread)
      fail(e)
