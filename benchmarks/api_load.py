r"""The Python API loads a run once: the time of `api.load` and of two `.translate` calls.

  python benchmarks/api_load.py --workdir=runs/demo      # the quick start's trained demo

`api.load(workdir)` reads the run's config, vocabulary and parameters once; the first
`.translate` of three lines compiles its search (or reads it from the compilation cache), the
second runs the same programs. For comparison, `api.translate(None, workdir, lines)` once more
after them: the function form loads the run anew at every call (its programs then come from the
compilation cache the first call filled). Figures are wall-clock seconds in this process (JAX's
start-up and the imports before `api.load` excluded); `--cold` starts from an empty compilation
cache of the run's own.
Last line JSON, recorded in benchmarks/results/<--record>.json (default api_load).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

from absl import app, flags

from flaxformer_nmt.benchmarking import record

_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "A trained workdir (with config.json).")
_COLD = flags.DEFINE_bool("cold", True, "Start from an empty compilation cache of this run's.")

LINES = ["three hundred and forty-five", "We need forty-two chairs.", "nine thousand and one"]


def main(argv: list[str]) -> None:
  del argv
  if not os.path.isfile(os.path.join(_WORKDIR.value, "config.json")):
    sys.exit(f"error: --workdir={_WORKDIR.value} has no config.json; train it first.")
  with tempfile.TemporaryDirectory() as scratch:
    if _COLD.value:  # before JAX reads the setting: a cache of this run's alone
      os.environ["FLAXFORMER_NMT_COMPILE_CACHE"] = scratch
    from flaxformer_nmt import api  # pylint: disable=g-import-not-at-top

    start = time.perf_counter()
    model = api.load(_WORKDIR.value)
    load_s = time.perf_counter() - start
    seconds, outputs = [], []
    for _ in range(2):
      start = time.perf_counter()
      outputs.append(model.translate(LINES))
      seconds.append(time.perf_counter() - start)
    start = time.perf_counter()
    again = api.translate(None, _WORKDIR.value, LINES)
    function_s = time.perf_counter() - start
  result: dict[str, Any] = {
    "workdir": _WORKDIR.value,
    "cold_cache": _COLD.value,
    "lines": len(LINES),
    "load_s": round(load_s, 3),
    "first_translate_s": round(seconds[0], 3),
    "second_translate_s": round(seconds[1], 3),
    "function_translate_s": round(function_s, 3),
    "same_output": outputs[0] == outputs[1] == again,
    "translations": outputs[1],
  }
  record.report(result)


if __name__ == "__main__":
  app.run(main)
