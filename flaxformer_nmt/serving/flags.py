"""--mode=serve's flags (absl), defined when cli.py imports this module; serving/options.py checks
their values. Apart from cli.py for their number; read by `cli._serve` only."""

from __future__ import annotations

from absl import flags

# Listed as the command line's own (in --helpfull, and by flags.FLAGS.get_flags_for_module(cli)):
# they are flags of `main.py`, only written down here.
_CLI = "flaxformer_nmt.cli"

flags.DEFINE_string(
  "host",
  "127.0.0.1",
  "serve: the address to listen on. 127.0.0.1 (the default) answers this machine only, and only "
  "requests naming it as their Host; any other address (0.0.0.0) asks every request for the "
  "token (--token, or one printed at start; docs/serving.md).",
  module_name=_CLI,
)
flags.DEFINE_integer("port", 8080, "serve: the TCP port to listen on.", module_name=_CLI)
flags.DEFINE_float(
  "max_wait_ms",
  5.0,
  "serve: how long the oldest waiting request may wait for others to fill its device batch.",
  module_name=_CLI,
)
flags.DEFINE_integer(
  "max_request_bytes",
  1 << 20,
  "serve: the largest request body accepted (larger: 413).",
  module_name=_CLI,
)
flags.DEFINE_integer(
  "max_request_lines",
  10_000,
  "serve: the most lines one request may hold (more: 413).",
  module_name=_CLI,
)
flags.DEFINE_integer(
  "queue_size",
  256,
  "serve: requests that may wait for the device; one more is answered 503.",
  module_name=_CLI,
)
flags.DEFINE_integer(
  "queue_lines",
  50_000,
  "serve: lines that may wait for the device, all requests together; a request that would "
  "pass it is answered 503.",
  module_name=_CLI,
)
flags.DEFINE_float(
  "grace_s",
  25.0,
  "serve: after SIGTERM, how long the decoding in flight may take before the server exits "
  "(uploads not yet received are dropped at once).",
  module_name=_CLI,
)
flags.DEFINE_list(
  "allowed_hosts",
  [],
  "serve: Host names (name or name:port) accepted besides localhost, 127.0.0.1 and [::1], e.g. "
  "the name a reverse proxy forwards.",
  module_name=_CLI,
)
flags.DEFINE_list(
  "allowed_origins",
  [],
  "serve: web origins (scheme://host[:port]) whose pages may call the server (CORS); * for any.",
  module_name=_CLI,
)
flags.DEFINE_string(
  "token",
  "",
  "serve: the token every request must carry (Authorization: Bearer <token>, or ?token=). "
  "Required on a non-loopback --host, where one is generated and printed if none is given.",
  module_name=_CLI,
)
