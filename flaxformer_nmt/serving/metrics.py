"""`GET /metrics`: the server's figures in Prometheus's text format (prometheus_client, the [serve]
extra), in a registry of the server's own (not the process-wide default one).

  flaxformer_nmt_requests_total            /translate requests answered 200
  flaxformer_nmt_lines_total               lines translated
  flaxformer_nmt_errors_total{status}      answers with status >= 400, by status
  flaxformer_nmt_batch_lines               lines per device batch (histogram)
  flaxformer_nmt_request_seconds           /translate latency, arrival to answer (histogram)
  flaxformer_nmt_queue_lines               lines waiting for the device
  flaxformer_nmt_ready                     1 once the batch shapes are compiled, else 0
"""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client as prom

CONTENT_TYPE = prom.CONTENT_TYPE_LATEST
_BATCH_BUCKETS = tuple(float(2**i) for i in range(12))  # 1 .. 2048 lines
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
  """The counters the routes and the batcher update."""

  def __init__(self, queue_lines: Callable[[], float], ready: Callable[[], float]) -> None:
    self.registry = prom.CollectorRegistry(auto_describe=True)
    r = self.registry
    self.requests = prom.Counter(
      "flaxformer_nmt_requests", "Translate requests answered 200.", registry=r
    )
    self.lines = prom.Counter("flaxformer_nmt_lines", "Lines translated.", registry=r)
    self.errors = prom.Counter(
      "flaxformer_nmt_errors", "Answers with status >= 400.", ["status"], registry=r
    )
    self.batch_lines = prom.Histogram(
      "flaxformer_nmt_batch_lines", "Lines per device batch.", buckets=_BATCH_BUCKETS, registry=r
    )
    self.latency = prom.Histogram(
      "flaxformer_nmt_request_seconds",
      "Translate latency, arrival to answer.",
      buckets=_LATENCY_BUCKETS,
      registry=r,
    )
    queue = prom.Gauge("flaxformer_nmt_queue_lines", "Lines waiting for the device.", registry=r)
    queue.set_function(queue_lines)
    up = prom.Gauge("flaxformer_nmt_ready", "1 once serving, else 0.", registry=r)
    up.set_function(ready)

  def text(self) -> bytes:
    return prom.generate_latest(self.registry)
