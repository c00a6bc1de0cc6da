"""--mode=serve's flags, checked before anything loads (no aiohttp or JAX needed to read them)."""

from __future__ import annotations

import dataclasses
import math
import socket

from flaxformer_nmt import errors

MAX_WAIT_MS = 10_000  # a longer wait for company would only be a way to hang the server


@dataclasses.dataclass(frozen=True)
class Options:
  """--mode=serve's flags."""

  host: str = "127.0.0.1"
  port: int = 8080
  max_wait_ms: float = 5.0
  max_request_bytes: int = 1 << 20
  queue_size: int = 256

  def check(self) -> None:
    """ConfigError naming the flag, before the model loads."""
    if not 0 < self.port < 65536:
      raise errors.ConfigError(f"--port={self.port}: give a port number in [1, 65535].")
    if not (math.isfinite(self.max_wait_ms) and 0 <= self.max_wait_ms <= MAX_WAIT_MS):
      raise errors.ConfigError(
        f"--max_wait_ms={self.max_wait_ms:g}: give a number of milliseconds in [0, {MAX_WAIT_MS}]."
      )
    if self.max_request_bytes < 1:
      raise errors.ConfigError(f"--max_request_bytes={self.max_request_bytes}: give 1 or more.")
    if self.queue_size < 1:
      raise errors.ConfigError(f"--queue_size={self.queue_size}: give 1 or more.")
    self.check_address()

  def check_address(self) -> None:
    """ConfigError if --host and --port cannot be listened on (a port in use, an address of
    another machine), found before minutes of loading and compiling instead of after."""
    try:
      family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][0]
      with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((self.host, self.port))
    except OSError as e:
      raise errors.ConfigError(
        f"--host={self.host} --port={self.port}: cannot listen there ({e.strerror or e})."
      ) from None
