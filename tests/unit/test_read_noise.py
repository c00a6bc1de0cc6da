"""The filter that drops the reports orbax's sibling reads leave after one checkpoint read fails.

The end-to-end test (tests/e2e/test_checkpoint.py) cuts a real checkpoint, but which reports appear
there is a matter of thread timing: once in CI a "Future exception was never retrieved" record came
through where only "Task ..." ones had been seen. Here each kind is made on purpose."""

from __future__ import annotations

import asyncio
import gc
import logging

from flaxformer_nmt.checkpoints import read_noise


def _unretrieved(make: str, error: Exception) -> None:
  """Leaves one failed asyncio object of the kind named by `make` for the collector to report."""
  loop = asyncio.new_event_loop()
  try:
    if make == "future":
      future = loop.create_future()
      future.set_exception(error)
    else:

      async def fail() -> None:
        raise error

      future = loop.create_task(fail())
      loop.run_until_complete(asyncio.sleep(0))
      loop.run_until_complete(asyncio.sleep(0))
    assert future.done()
    del future  # the last reference: no cycle holds a finished future, so it is reported here
    gc.collect(1)  # young generations, should a cycle hold it: a full pass costs ~0.4 s in a worker
  finally:
    loop.close()


def test_failures_about_a_read_checkpoint_are_dropped_and_others_kept(tmp_path, caplog):
  ckpt = tmp_path / "checkpoints" / "12"
  read_noise.quiet_failed_read_reports(str(ckpt))
  caplog.set_level(logging.ERROR, logger="asyncio")
  for make in ("future", "task"):
    caplog.clear()
    _unretrieved(make, OSError(f'Error reading "{ckpt}/state/d/abc": byte range'))
    assert not caplog.records, (make, caplog.text)
    _unretrieved(make, OSError("some other failure"))
    assert [r.getMessage().split("\n")[0] for r in caplog.records] == [
      f"{'Future' if make == 'future' else 'Task'} exception was never retrieved"
    ], (make, caplog.text)
