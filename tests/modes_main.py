"""Several modes in one multi-process job: in each process, what `main.py --mode=...` runs for each
step, one step after another (tests/e2e/test_multiprocess.py). The processes start and join once,
not once per mode; the modes themselves are main.py's (`modes.py`), on the config main.py builds.

  python tests/modes_main.py SPEC.json

SPEC: {"workdir": ..., "overrides": {dotted config field: value}, "steps": [{"mode": "eval" |
"translate" | "score" | "average", "overrides": {...}, and the mode's arguments}, ...]}.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flaxformer_nmt import api, modes  # noqa: E402
from flaxformer_nmt.runtime import parallel  # noqa: E402


def main() -> None:
  with open(sys.argv[1], encoding="utf-8") as f:
    spec = json.load(f)
  parallel.maybe_initialize_distributed("auto")
  workdir = spec["workdir"]
  for step in spec["steps"]:
    config = api.load_config("demo", {**spec["overrides"], **step.get("overrides", {})})
    which = step.get("checkpoint", "auto")
    if step["mode"] == "eval":
      modes.evaluate(config, workdir, which)
    elif step["mode"] == "translate":
      outputs = modes.Outputs(nbest=step.get("nbest", 1), constraints=step.get("constraints", ""))
      modes.translate(config, workdir, which, step["input"], step["output"], outputs)
    elif step["mode"] == "score":
      modes.score(config, workdir, which, step["input"], step["reference"], step["output"])
    elif step["mode"] == "average":
      modes.average(config, workdir, step["num_checkpoints"], which)
    else:
      raise ValueError(f"no such step: {step}")


if __name__ == "__main__":
  main()
