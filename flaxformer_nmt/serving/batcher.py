"""Dynamic batching: the lines of concurrent requests decoded together, in one device batch.

The server's event loop calls `submit(lines, kind)` for each request and awaits the future it
returns; one worker thread owns the devices. The worker takes the oldest waiting request, then
waits up to `max_wait_s` from that request's arrival for more of the same kind (n-best size,
alignments: each kind is its own compiled search) until `max_rows` lines are gathered, and decodes
them as one batch. It waits only when requests are arriving together (one of the last few batches
held more than one request, or more than one is queued), and only until as many requests wait as
the largest of those batches answered (clients answered together come back together): a lone
client's request is decoded at once (after a burst of several clients, once those few batches have
passed), four clients are served four at a time without waiting for a fifth, and requests that
arrive while a batch is decoding form the next batch whatever the wait. A request longer than a
batch is split into chunks of `max_rows` lines and answered when its last chunk is
done. Each line keeps its number within its own request (what sampling keys its draws by), so a
request's lines are decoded as a `--mode=translate` of the same lines decodes them; only the batch
around them differs, which can move a score in its last digits.

`max_queue` bounds the requests waiting for the device: one more is refused at once (`QueueFull`,
the server's 503) instead of waiting behind a queue it cannot see the end of. `close(timeout)`
stops taking requests and returns once every accepted one is answered (or the timeout passes).
If the worker itself ever fails, every waiting request fails with it and `alive` turns False
(/health reports it), rather than waiting for a worker that is gone.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging


@dataclasses.dataclass(frozen=True)
class Kind:
  """What a request asks of the search; requests of one kind share batches."""

  nbest: int = 1
  alignments: bool = False


@dataclasses.dataclass(frozen=True)
class Line:
  """One input line's answer: its hypotheses (best first) and whether it was cut to the model's
  longest input."""

  hypotheses: list[Any]  # translator.Hypothesis
  truncated: bool


# (kind, lines, their numbers within their requests) -> (hypotheses per line, indices of the
# lines that were truncated): the translator of that kind.
TranslateFn = Callable[[Kind, list[str], list[int]], tuple[list[list[Any]], Sequence[int]]]


# How many batches back the batcher looks for the number of clients about.
_RECENT_BATCHES = 8


class QueueFull(Exception):
  """More requests are waiting than the batcher accepts."""


class Closed(Exception):
  """The batcher is shutting down and takes no new request."""


@dataclasses.dataclass
class _Request:
  lines: list[str]
  kind: Kind
  future: concurrent.futures.Future
  answers: list[Line | None]
  chunks_left: int


@dataclasses.dataclass
class _Chunk:
  request: _Request
  start: int  # the chunk's first line within its request
  lines: list[str]
  arrival: float


@dataclasses.dataclass
class Stats:
  requests: int = 0
  lines: int = 0
  batches: int = 0
  refused: int = 0

  def as_dict(self) -> dict[str, Any]:
    mean = self.lines / self.batches if self.batches else 0.0
    return {**dataclasses.asdict(self), "mean_batch_lines": round(mean, 2)}


class DynamicBatcher:
  """Gathers concurrent requests' lines into device batches; see the module docstring."""

  def __init__(
    self, translate: TranslateFn, *, max_rows: int, max_wait_s: float, max_queue: int
  ) -> None:
    self._translate = translate
    self.max_rows = max_rows
    self.max_wait_s = max_wait_s
    self.max_queue = max_queue
    self.stats = Stats()
    self._chunks: collections.deque[_Chunk] = collections.deque()
    self._waiting = 0  # requests with a chunk not yet taken into a batch
    self._cond = threading.Condition()
    self._closing = False
    # Requests in each of the last few batches: how many clients are about.
    self._recent_requests: collections.deque[int] = collections.deque(maxlen=_RECENT_BATCHES)
    self._worker = threading.Thread(target=self._run, name="batcher", daemon=True)
    self._worker.start()

  def submit(self, lines: Sequence[str], kind: Kind = Kind()) -> concurrent.futures.Future:
    """A future of `lines`' answers (a list of `Line`, in order); QueueFull or Closed at once."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()  # a client's cancel() can no longer race the answer
    lines = list(lines)
    if not lines:
      future.set_result([])
      return future
    starts = range(0, len(lines), self.max_rows)
    request = _Request(lines, kind, future, [None] * len(lines), len(starts))
    with self._cond:
      if self._closing:
        raise Closed("the server is shutting down" if self.alive else "the batcher has failed")
      if self._waiting >= self.max_queue:
        self.stats.refused += 1
        raise QueueFull(f"{self._waiting} requests are waiting (the limit is {self.max_queue})")
      now = time.monotonic()
      for start in starts:
        self._chunks.append(_Chunk(request, start, lines[start : start + self.max_rows], now))
      self._waiting += 1
      self.stats.requests += 1
      self._cond.notify_all()
    return future

  @property
  def alive(self) -> bool:
    return self._worker.is_alive()

  def close(self, timeout: float | None = None) -> None:
    """Takes no new request; returns when the accepted ones are answered (or after `timeout`)."""
    with self._cond:
      self._closing = True
      self._cond.notify_all()
    self._worker.join(timeout)

  def _next_batch(self) -> list[_Chunk] | None:
    """The chunks of the next batch (None: closed and nothing left), taken off the queue."""
    with self._cond:
      while not self._chunks:
        if self._closing:
          return None
        self._cond.wait()
      kind = self._chunks[0].request.kind
      company = max(self._recent_requests, default=0)  # the clients about, as far as we know
      together = company > 1 or len({id(c.request) for c in self._chunks}) > 1
      deadline = self._chunks[0].arrival + (self.max_wait_s if together else 0.0)
      while not self._closing:
        left = deadline - time.monotonic()
        rows, requests = self._ready(kind)
        # Clients answered together come back together: once as many requests wait as the
        # largest of the last few batches held, the company expected is here, and waiting
        # longer only adds latency. (The largest, not the last: a batch split by the deadline
        # merges again instead of staying split.)
        if left <= 0 or rows >= self.max_rows or (company > 1 and requests >= company):
          break
        self._cond.wait(left)
      batch, rows, keep = [], 0, collections.deque()
      for chunk in self._chunks:
        fits = not batch or rows + len(chunk.lines) <= self.max_rows
        if chunk.request.kind == kind and fits:
          batch.append(chunk)
          rows += len(chunk.lines)
        else:
          keep.append(chunk)
      self._chunks = keep
      taken = {id(c.request) for c in batch} - {id(c.request) for c in keep}
      self._waiting -= len(taken)
      self._recent_requests.append(len({id(c.request) for c in batch}))
      return batch

  def _ready(self, kind: Kind) -> tuple[int, int]:
    """Lines of `kind` queued (counted up to a full batch) and the requests they belong to."""
    ready, requests = 0, set()
    for chunk in self._chunks:
      if chunk.request.kind == kind:
        ready += len(chunk.lines)
        requests.add(id(chunk.request))
        if ready >= self.max_rows:
          break
    return ready, len(requests)

  def _run(self) -> None:
    batch: list[_Chunk] = []
    try:
      while True:
        batch = self._next_batch() or []
        if not batch:
          return
        self._decode(batch)
    except BaseException as e:  # the worker is gone: fail what waits instead of hanging it
      logging.exception("The batcher's worker failed; failing every waiting request.")
      with self._cond:
        self._closing = True
        waiting, self._chunks = [*batch, *self._chunks], collections.deque()
      for chunk in waiting:
        if not chunk.request.future.done():
          chunk.request.future.set_exception(e)
      raise

  def _decode(self, batch: list[_Chunk]) -> None:
    """Decodes one batch and answers each request whose last chunk it held; a failure fails this
    batch's requests only, and the worker goes on."""
    lines = [line for chunk in batch for line in chunk.lines]
    numbers = [chunk.start + j for chunk in batch for j in range(len(chunk.lines))]
    try:
      hypotheses, truncated = self._translate(batch[0].request.kind, lines, numbers)
      if len(hypotheses) != len(lines):
        raise RuntimeError(f"{len(hypotheses)} answers for a batch of {len(lines)} lines")
      cut = set(truncated)
      done = []
      for chunk in batch:
        request = chunk.request
        for j in range(len(chunk.lines)):
          at = len(done) + j
          request.answers[chunk.start + j] = Line(hypotheses[at], at in cut)
        done += chunk.lines
        request.chunks_left -= 1
        if request.chunks_left == 0 and not request.future.done():
          request.future.set_result(list(request.answers))
    except Exception as e:  # the requests of this batch fail; the server keeps serving
      logging.exception("Decoding a batch of %d lines failed.", len(lines))
      for chunk in batch:
        if not chunk.request.future.done():
          chunk.request.future.set_exception(e)
      return
    self.stats.batches += 1
    self.stats.lines += len(lines)
