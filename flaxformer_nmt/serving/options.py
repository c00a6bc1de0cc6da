"""--mode=serve's flags, checked before anything loads (no aiohttp or JAX needed to read them)."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import socket

from flaxformer_nmt import errors

MAX_WAIT_MS = 10_000  # a longer wait for company would only be a way to hang the server


@dataclasses.dataclass(frozen=True)
class Options:
  """--mode=serve's flags (docs/serving.md)."""

  host: str = "127.0.0.1"
  port: int = 8080
  max_wait_ms: float = 5.0
  max_request_bytes: int = 1 << 20
  queue_size: int = 256  # requests waiting for the device
  max_request_lines: int = 10_000  # lines in one request (more: 413)
  queue_lines: int = 50_000  # lines waiting for the device, all requests together (more: 503)
  grace_s: float = 25.0  # SIGTERM: how long the decoding in flight may take to finish
  allowed_hosts: tuple[str, ...] = ()  # Host headers accepted beside the loopback names
  allowed_origins: tuple[str, ...] = ()  # web origins (scheme://host[:port]) that may call in
  token: str = ""  # required of every request on a non-loopback address ("" there: generated)
  target_lang: str = ""  # a multilingual model's language for requests that name none
  source_lang: str = ""  # a many-to-many model's input language for requests that name none

  def check(self) -> None:
    """ConfigError naming the flag, before the model loads."""
    if not 0 < self.port < 65536:
      raise errors.ConfigError(f"--port={self.port}: give a port number in [1, 65535].")
    if not (math.isfinite(self.max_wait_ms) and 0 <= self.max_wait_ms <= MAX_WAIT_MS):
      raise errors.ConfigError(
        f"--max_wait_ms={self.max_wait_ms:g}: give a number of milliseconds in [0, {MAX_WAIT_MS}]."
      )
    for name in ("max_request_bytes", "queue_size", "max_request_lines", "queue_lines"):
      if getattr(self, name) < 1:
        raise errors.ConfigError(f"--{name}={getattr(self, name)}: give 1 or more.")
    if self.queue_lines < self.max_request_lines:
      raise errors.ConfigError(
        f"--queue_lines={self.queue_lines} is less than --max_request_lines="
        f"{self.max_request_lines}: a request of the largest size could never be queued."
      )
    if not (math.isfinite(self.grace_s) and 0 < self.grace_s <= 3600):
      raise errors.ConfigError(f"--grace_s={self.grace_s:g}: give seconds in (0, 3600].")
    for origin in self.allowed_origins:
      if origin != "*" and (
        "://" not in origin or origin.rstrip("/") != origin or origin.count("/") != 2
      ):
        raise errors.ConfigError(
          f"--allowed_origins={origin}: give origins as a browser sends them, "
          "scheme://host[:port] (e.g. http://localhost:3000), or *."
        )
    if self.token and (len(self.token) < 8 or any(c.isspace() for c in self.token)):
      raise errors.ConfigError("--token: give at least 8 characters without spaces.")
    self.check_address()

  @property
  def loopback(self) -> bool:
    """Whether --host answers this machine only (127.0.0.0/8, ::1, localhost)."""
    return is_loopback(self.host)

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


def is_loopback(host: str) -> bool:
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False
