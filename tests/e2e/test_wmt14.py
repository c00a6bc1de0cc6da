"""WMT14 beyond the README's EN-DE base recipe (which `tests/e2e/test_readme.py` runs on the mock
WMT14): EN-FR's BLEU, prepare without TensorFlow, prepare's build request and its refusals.

TFDS's WMT14 cannot be downloaded here, so `tests/mock_wmt14_main.py` runs main.py inside
`tfds.testing.mock_data` with a small corpus served under the real builder and split names. The
configs are the real ones, made tiny by command-line overrides of the model size, vocabulary and
step counts only.
"""

from __future__ import annotations

import json
import pathlib
import sys

from helpers import REPO, SMALL_MODEL_FLAGS  # isort: skip


def _mock_main(config: str, workdir: pathlib.Path, *args: str, sizes: str = ""):
  """tests/mock_wmt14_main.py with the config; `sizes` ("train,validation,test" sentence pairs)
  shrinks the mock corpus."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top

  env = {**os.environ, "MOCK_WMT14_SIZES": sizes} if sizes else None
  return subprocess.run(
    [sys.executable, "tests/mock_wmt14_main.py", f"--config={config}", f"--workdir={workdir}"]
    + SMALL_MODEL_FLAGS
    + list(args),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
  )


def _last_json(proc) -> dict:
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_wmt14_enfr_big_tokenized_bleu_has_no_compound_split(tmp_path):
  work = tmp_path / "enfr"
  config = "configs/wmt14_enfr_big.py"
  small = "1000,8,8"  # what is checked is which BLEU, not its value: a few sentences suffice
  prepared = _last_json(_mock_main(config, work, "--mode=prepare", sizes=small))
  assert prepared["dataset"] == "wmt14_translate/fr-en"
  steps = ["--config.num_train_steps=4", "--config.decode.max_len_offset=8"]
  trained = _last_json(_mock_main(config, work, *steps, sizes=small))
  assert trained["test_set"] == "newstest2014"
  assert trained["tokenized_bleu_method"] == "moses-fr"  # no ##AT##: that is t2t's EN-DE step


def test_prepare_without_tensorflow_is_one_line_naming_the_extra(tmp_path):
  """TensorFlow made unimportable (as in a fresh install without the extra): exit 2, one line,
  nothing written."""
  import subprocess  # pylint: disable=g-import-not-at-top

  work = tmp_path / "run"
  proc = subprocess.run(
    [
      sys.executable,
      "tests/without_tensorflow_main.py",
      "--config=configs/wmt14_ende_base.py",
      f"--workdir={work}",
      "--mode=prepare",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors_ = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors_) == 1, proc.stderr[-2000:]
  assert 'pip install -e ".[prepare]"' in errors_[0]
  assert "wmt14_translate/de-en" in errors_[0] and "TensorFlow" in errors_[0]
  assert "Traceback" not in proc.stderr
  assert not work.exists()
