"""A threaded HTTP server on 127.0.0.1 over a folder: Multi30k's download, served from the real
files beside the checkout (tests/unit/test_download.py, the README's commands)."""

from __future__ import annotations

import functools
import http.server
import pathlib
import threading


class Server:
  """A threaded HTTP server on 127.0.0.1 over `directory`, counting the files it was asked for."""

  def __init__(self, directory: pathlib.Path) -> None:
    self.requests: list[str] = []
    server = self

    class Handler(http.server.SimpleHTTPRequestHandler):
      def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server.requests.append(self.path.lstrip("/"))
        super().do_GET()

      def log_message(self, *args: object) -> None:
        pass

    handler = functools.partial(Handler, directory=str(directory))
    self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/"
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
    self._thread.start()

  def close(self) -> None:
    self._httpd.shutdown()
    self._httpd.server_close()
