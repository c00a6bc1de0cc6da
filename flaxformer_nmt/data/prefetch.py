"""Training batches packed ahead in a background thread, with the exact position of what was used.

Packing (permuting, bucketing, filling rows) is Python and numpy work on the host. Done in the
training loop it runs between two dispatches; in a thread it runs while the accelerator computes
the step before (the loop blocks on the device, which releases the GIL), so the device does not
wait for it unless packing is slower than the step. `benchmarks/input_pipeline.py` measures how
fast packing is and how many chips one host keeps busy.

Exact resume is kept: each queued batch carries the streams' position *after* it, and
`get_state` returns the position after the last batch handed out, not after the ones packed ahead;
`set_state` stops the worker, drops what it packed, moves the streams and starts it again. Training
logs `input_wait_fraction`, the share of wall time the loop spent waiting for a batch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from flaxformer_nmt.data.streams import Batch, DeviceStreams


class Prefetcher(Iterator[Batch]):
  """DeviceStreams packed `depth` batches ahead in a daemon thread (same batches, same order)."""

  def __init__(self, streams: DeviceStreams, depth: int) -> None:
    if depth < 1:
      raise ValueError(f"prefetch depth {depth} < 1: use the DeviceStreams directly.")
    self._streams, self._depth = streams, depth
    self._state = streams.get_state()  # the position after the last batch handed out
    self.wait_seconds = 0.0  # time next() spent blocked on the queue, summed
    self._start()

  # What the trainer reads besides batches, as DeviceStreams has them.
  @property
  def first_stream(self) -> int:
    return self._streams.first_stream

  @property
  def stream_sizes(self) -> list[int]:
    return self._streams.stream_sizes

  @property
  def num_streams(self) -> int:
    return self._streams.num_streams

  @property
  def examples_per_epoch(self) -> int:
    return self._streams.examples_per_epoch

  def _start(self) -> None:
    self._queue: queue.Queue = queue.Queue(maxsize=self._depth)
    self._stop = threading.Event()
    self._thread = threading.Thread(
      target=self._work, args=(self._queue, self._stop), name="input-prefetch", daemon=True
    )
    self._thread.start()

  def _work(self, out: queue.Queue, stop: threading.Event) -> None:
    def put(item: Any) -> None:
      # Never blocks past a stop: close() and set_state() join this thread.
      while not stop.is_set():
        try:
          out.put(item, timeout=0.1)
          return
        except queue.Full:
          continue

    try:
      while not stop.is_set():
        batch = next(self._streams)
        put((batch, self._streams.get_state()))
    except BaseException as e:  # pylint: disable=broad-except  (re-raised in the trainer)
      put(e)

  def _halt(self) -> None:
    self._stop.set()
    self._thread.join()

  def __iter__(self) -> Prefetcher:
    return self

  def __next__(self) -> Batch:
    if self._stop.is_set():
      raise RuntimeError("the input prefetcher is closed (or its packing failed): no more batches.")
    start = time.perf_counter()
    item = self._queue.get()
    self.wait_seconds += time.perf_counter() - start
    if isinstance(item, BaseException):
      self._stop.set()  # the worker has ended: a later next() says so instead of waiting
      raise item
    batch, self._state = item
    return batch

  def get_state(self) -> list[dict[str, int]]:
    return [dict(p) for p in self._state]

  def set_state(self, positions: list[dict[str, Any]]) -> None:
    self._halt()
    self._streams.set_state(positions)
    self._state = self._streams.get_state()
    self._start()

  def close(self) -> None:
    """Stops the worker (it is a daemon thread, so an exiting program never waits for it)."""
    self._halt()
