"""Who may use the server: local means local, and open means authenticated, as Jupyter does it.

- **Host.** On a loopback address (the default, 127.0.0.1) the Host header must name `localhost`,
  `127.0.0.1` or `[::1]` with the server's port, or a name `--allowed_hosts` adds. A web page
  cannot then reach the server through a DNS name that points at 127.0.0.1 (DNS rebinding): its
  requests carry its own name as the Host.
- **Origin.** A browser names the page that makes a request in its Origin header. The server's own
  page (an Origin equal to the Host) and the origins `--allowed_origins` names may call in; any
  other web page gets 403 (cross-site request forgery), and no page can read an answer unless it
  is allowed (CORS: an allowed origin gets the Access-Control headers and the OPTIONS preflight).
  Programs that send no Origin (curl, requests, aiohttp) are not browsers and are let through.
- **Token.** On any other address (`--host=0.0.0.0`) every request needs the token: `--token`, or
  one generated at start and printed once. It comes as `Authorization: Bearer <token>` or
  `?token=<token>` (how the page's link carries it). `--token` on a loopback address asks for it
  there too. The OPTIONS preflight carries none, as browsers send it.

Nothing here imports aiohttp: the checks take the request's method, headers and query, and say
what to refuse with (status, one line) or which headers to add.
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
from collections.abc import Mapping

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Content-Type, Authorization"


def new_token() -> str:
  return secrets.token_urlsafe(24)


@dataclasses.dataclass(frozen=True)
class Refusal:
  status: int
  message: str
  headers: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Guard:
  """The server's rules; `check` is asked once per request, before its body is read."""

  loopback: bool
  port: int
  allowed_hosts: tuple[str, ...] = ()
  allowed_origins: tuple[str, ...] = ()
  token: str = ""  # "" = none asked for

  def _host_allowed(self, host: str) -> bool:
    host = host.lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if any(host == a.lower() or name == a.lower() for a in self.allowed_hosts):
      return True
    if not self.loopback:
      return True  # open: the token decides
    names = {f"{n}:{self.port}" for n in LOOPBACK_NAMES}
    if self.port == 80:  # browsers leave the default port out
      names |= set(LOOPBACK_NAMES)
    return host in names

  def own_origin(self, origin: str, host: str) -> bool:
    """`origin` is the server's own page, as reached through `host`."""
    return origin.lower() in (f"http://{host}".lower(), f"https://{host}".lower())

  def origin_allowed(self, origin: str) -> bool:
    return "*" in self.allowed_origins or origin in self.allowed_origins

  def check(
    self, method: str, headers: Mapping[str, str], query: Mapping[str, str]
  ) -> Refusal | None:
    """What to refuse this request with, or None to serve it."""
    host = headers.get("Host", "")
    if not self._host_allowed(host):
      names = ", ".join(f"{n}:{self.port}" for n in LOOPBACK_NAMES)
      return Refusal(
        403,
        f"Host {host or '(none)'!r} is not this server's: on a loopback address it answers "
        f"{names} (--allowed_hosts adds names)",
      )
    origin = headers.get("Origin")
    if origin is not None and not self.own_origin(origin, host) and not self.origin_allowed(origin):
      return Refusal(
        403,
        f"Origin {origin!r} may not use this server (--allowed_origins names the web pages "
        "that may)",
      )
    if method == "OPTIONS" or not self.token:
      return None
    given = query.get("token") or _bearer(headers.get("Authorization", ""))
    # Headers are decoded with surrogateescape: compare bytes as they came.
    given_bytes = given.encode("utf-8", "surrogateescape")
    if not given or not hmac.compare_digest(given_bytes, self.token.encode()):
      return Refusal(
        401,
        "this server needs its token: send Authorization: Bearer <token> or ?token=<token> "
        "(printed when the server started)",
        (("WWW-Authenticate", "Bearer"),),
      )
    return None

  def cors_headers(self, headers: Mapping[str, str], preflight: bool = False) -> dict[str, str]:
    """The CORS headers for an allowed foreign origin (none for the page's own or no Origin)."""
    origin = headers.get("Origin")
    if origin is None or self.own_origin(origin, headers.get("Host", "")):
      return {}
    if not self.origin_allowed(origin):
      return {}
    out = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
    if preflight:
      out |= {
        "Access-Control-Allow-Methods": CORS_METHODS,
        "Access-Control-Allow-Headers": CORS_HEADERS,
        "Access-Control-Max-Age": "600",
      }
    return out


def _bearer(authorization: str) -> str:
  scheme, _, value = authorization.strip().partition(" ")
  return value.strip() if scheme.lower() in ("bearer", "token") else ""
