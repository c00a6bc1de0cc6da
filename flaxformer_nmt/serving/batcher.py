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
arrive while a batch is decoding form the next batch whatever the wait.

Lines, not requests, are the unit of work. A batch holds `max_rows` lines, shared in turns among
the waiting requests of its kind: each gets an equal part (a request with fewer lines left gives
the rest of its part to the others), in arrival order. A one-line request that arrives beside a
400-line one is in the next batch, not behind the 400 lines. Each line keeps its number within its
own request (what sampling keys its draws by), so a request's lines are decoded as a
`--mode=translate` of the same lines decodes them; only the batch around them differs, which can
move a score in its last digits.

The queue is bounded twice: `max_queue` requests and `max_queue_lines` lines waiting for the
device. One more is refused at once (`QueueFull`, the server's 503) instead of waiting behind a
queue it cannot see the end of. If a batch of several requests fails, each request is decoded
again alone, so that only the faulty one fails. `close(timeout)` stops taking requests and returns
once every accepted one is answered (or the timeout passes). If the worker itself ever fails,
every waiting request fails with it and `alive` turns False (/health reports it), rather than
waiting for a worker that is gone.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import sys
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
  target_lang: str = ""  # a multilingual model's output language ("" for a bilingual one)
  # Terms the translations must contain: each line is then a (text, terms) pair.
  constrained: bool = False
  source_lang: str = ""  # a many-to-many model's input language ("" for any other)


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


@dataclasses.dataclass(eq=False)
class _Request:
  lines: list[str]
  kind: Kind
  future: concurrent.futures.Future
  arrival: float
  answers: list[Line | None]
  next_line: int = 0  # the first line not yet taken into a batch
  answered: int = 0

  @property
  def untaken(self) -> int:
    return len(self.lines) - self.next_line


@dataclasses.dataclass
class _Chunk:
  """A request's consecutive lines in one batch."""

  request: _Request
  start: int  # the chunk's first line within its request
  lines: list[str]


@dataclasses.dataclass
class Stats:
  requests: int = 0
  lines: int = 0
  batches: int = 0
  refused: int = 0
  failed_requests: int = 0
  batches_retried_apart: int = 0

  def as_dict(self) -> dict[str, Any]:
    mean = self.lines / self.batches if self.batches else 0.0
    return {**dataclasses.asdict(self), "mean_batch_lines": round(mean, 2)}


class DynamicBatcher:
  """Gathers concurrent requests' lines into device batches; see the module docstring."""

  def __init__(
    self,
    translate: TranslateFn,
    *,
    max_rows: int,
    max_wait_s: float,
    max_queue: int,
    max_queue_lines: int | None = None,
    on_batch: Callable[[int], None] | None = None,
  ) -> None:
    self._translate = translate
    self.max_rows = max_rows
    self.max_wait_s = max_wait_s
    self.max_queue = max_queue
    self.max_queue_lines = max_queue_lines
    self._on_batch = on_batch
    self.stats = Stats()
    self._queue: collections.deque[_Request] = collections.deque()  # requests with lines untaken
    self._queued_lines = 0
    self._cond = threading.Condition()
    self._closing = False
    # Requests in each of the last few batches: how many clients are about.
    self._recent_requests: collections.deque[int] = collections.deque(maxlen=_RECENT_BATCHES)
    self._turn = 0  # where the next batch's turns start, when more requests wait than it holds
    self._worker = threading.Thread(target=self._run, name="batcher", daemon=True)
    self._worker.start()

  @property
  def queued_lines(self) -> int:
    """Lines waiting for the device (not yet in a batch)."""
    return self._queued_lines

  def submit(self, lines: Sequence[str], kind: Kind = Kind()) -> concurrent.futures.Future:
    """A future of `lines`' answers (a list of `Line`, in order); QueueFull or Closed at once."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()  # a client's cancel() can no longer race the answer
    lines = list(lines)
    if not lines:
      future.set_result([])
      return future
    with self._cond:
      if self._closing:
        raise Closed("the server is shutting down" if self.alive else "the batcher has failed")
      if len(self._queue) >= self.max_queue:
        self.stats.refused += 1
        raise QueueFull(f"{len(self._queue)} requests are waiting (the limit is {self.max_queue})")
      if self.max_queue_lines and self._queued_lines + len(lines) > self.max_queue_lines:
        self.stats.refused += 1
        raise QueueFull(
          f"{self._queued_lines} lines are waiting and this request adds {len(lines)} (the "
          f"limit is {self.max_queue_lines})"
        )
      request = _Request(lines, kind, future, time.monotonic(), [None] * len(lines))
      self._queue.append(request)
      self._queued_lines += len(lines)
      self.stats.requests += 1
      self._cond.notify_all()
    return future

  @property
  def alive(self) -> bool:
    return self._worker.is_alive()

  def refuse_new(self) -> None:
    """Takes no new request (Closed); the accepted ones are still decoded."""
    with self._cond:
      self._closing = True
      self._cond.notify_all()

  def close(self, timeout: float | None = None) -> None:
    """Takes no new request; returns when the accepted ones are answered (or after `timeout`)."""
    with self._cond:
      self._closing = True
      self._cond.notify_all()
    self._worker.join(timeout)

  def _next_batch(self) -> list[_Chunk] | None:
    """The chunks of the next batch (None: closed and nothing left), taken off the queue."""
    with self._cond:
      while not self._queue:
        if self._closing:
          return None
        self._cond.wait()
      oldest = self._queue[0]
      kind = oldest.kind
      company = max(self._recent_requests, default=0)  # the clients about, as far as we know
      together = company > 1 or len(self._queue) > 1
      deadline = oldest.arrival + (self.max_wait_s if together else 0.0)
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
      batch = self._take_in_turns(kind)
      self._recent_requests.append(len(batch))
      return batch

  def _take_in_turns(self, kind: Kind) -> list[_Chunk]:
    """Up to `max_rows` lines of `kind`, an equal part from each waiting request of that kind
    (what one does not need goes to the others), each request's part from its next untaken line.
    Called with the lock held."""
    taking: dict[int, int] = {}
    active = [r for r in self._queue if r.kind == kind]
    if len(active) > self.max_rows:  # more requests than lines: turns start further on each time
      start = self._turn % len(active)
      active = active[start:] + active[:start]
      self._turn += self.max_rows
    room = self.max_rows
    while room > 0 and active:
      share = max(1, room // len(active))
      still = []
      for request in active:
        if room == 0:
          break
        n = min(share, request.untaken - taking.get(id(request), 0), room)
        taking[id(request)] = taking.get(id(request), 0) + n
        room -= n
        if request.untaken > taking[id(request)]:
          still.append(request)
      active = still
    batch = []
    for request in [r for r in self._queue if id(r) in taking]:
      n = taking[id(request)]
      start = request.next_line
      batch.append(_Chunk(request, start, request.lines[start : start + n]))
      request.next_line += n
      self._queued_lines -= n
    self._queue = collections.deque(r for r in self._queue if r.untaken)
    return batch

  def _ready(self, kind: Kind) -> tuple[int, int]:
    """Lines of `kind` queued (counted up to a full batch) and the requests they belong to."""
    ready, requests = 0, 0
    for request in self._queue:
      if request.kind == kind:
        ready += request.untaken
        requests += 1
        if ready >= self.max_rows:
          break
    return ready, requests

  def _drop(self, request: _Request) -> None:
    """Takes a failed request's untaken lines off the queue."""
    with self._cond:
      if request in self._queue:
        self._queue.remove(request)
        self._queued_lines -= request.untaken
        request.next_line = len(request.lines)

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
        waiting = [c.request for c in batch] + list(self._queue)
        self._queue, self._queued_lines = collections.deque(), 0
      for request in waiting:
        if not request.future.done():
          request.future.set_exception(e)
      raise

  def _decode(self, batch: list[_Chunk]) -> None:
    """Decodes one batch and answers each request whose last lines it held. If it fails, each
    of its requests is decoded alone (when it held several), so a failure stays with the request
    that caused it; the worker goes on."""
    batch = [c for c in batch if not c.request.future.done()]  # e.g. failed in an earlier batch
    if not batch:
      return
    lines = [line for chunk in batch for line in chunk.lines]
    try:
      self._decode_chunks(batch)
    except Exception:  # pylint: disable=broad-except
      if len(batch) == 1:
        logging.exception("Decoding a batch of %d lines failed.", len(lines))
        self._fail(batch[0].request, sys.exc_info()[1])
        return
      logging.warning(
        "Decoding a batch of %d lines from %d requests failed; decoding each request alone.",
        len(lines),
        len(batch),
      )
      self.stats.batches_retried_apart += 1
      for chunk in batch:
        try:
          self._decode_chunks([chunk])
        except Exception as e:  # pylint: disable=broad-except
          logging.exception("Decoding a request's %d lines failed.", len(chunk.lines))
          self._fail(chunk.request, e)
      return

  def _fail(self, request: _Request, error: BaseException | None) -> None:
    self._drop(request)
    self.stats.failed_requests += 1
    if not request.future.done():
      request.future.set_exception(error or RuntimeError("decoding failed"))

  def _decode_chunks(self, chunks: list[_Chunk]) -> None:
    """Decodes `chunks` as one batch and answers the requests it completes; raises on failure
    (nothing answered then)."""
    lines = [line for chunk in chunks for line in chunk.lines]
    numbers = [chunk.start + j for chunk in chunks for j in range(len(chunk.lines))]
    hypotheses, truncated = self._translate(chunks[0].request.kind, lines, numbers)
    if len(hypotheses) != len(lines):
      raise RuntimeError(f"{len(hypotheses)} answers for a batch of {len(lines)} lines")
    cut = set(truncated)
    at, complete = 0, []
    for chunk in chunks:
      request = chunk.request
      for j in range(len(chunk.lines)):
        request.answers[chunk.start + j] = Line(hypotheses[at], at in cut)
        at += 1
      request.answered += len(chunk.lines)
      if request.answered == len(request.lines):
        complete.append(request)
    # Counted before anyone is answered: a client that reads /health or /metrics after its
    # answer sees its batch.
    self.stats.batches += 1
    self.stats.lines += len(lines)
    if self._on_batch is not None:
      try:
        self._on_batch(len(lines))
      except Exception:  # pylint: disable=broad-except  (a figure is not worth a request)
        logging.exception("Counting a batch failed.")
    for request in complete:
      if not request.future.done():
        request.future.set_result(list(request.answers))
