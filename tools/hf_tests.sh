#!/usr/bin/env bash
# Runs the tests that check --mode=import and --mode=export --format=huggingface against
# transformers itself (tests/e2e/test_pretrained.py, marker `hf`), in a virtual environment with
# the `hf` extra (transformers 5, torch). torch from the registry pulls CUDA wheels of several GB,
# so the venv is kept between runs where HF_VENV names one (.ci/run keeps it beside the
# compatibility legs'): made once; when pyproject.toml changes, the install runs again in it
# (torch stays unless the extra asks for another), and it is made anew only if that fails. Prints
# its versions, the venv's size, and the figures the tests print (-s).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HF_VENV:-$(mktemp -d)/venv}
stamp=$(sha256sum pyproject.toml | cut -c1-16)
# HF_PREPARE=1 (.ci/run, in the background while its main leg runs): the venv and the requirements
# of the test and hf extras only (tools/requirements.py), then exit; the leg run later adds the
# project itself, whose editable build writes into the checkout.
prepare=${HF_PREPARE:-0}
install_venv() {
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  fi
  if [ "$(cat "$venv/.made_from" 2>/dev/null)" != "hf $stamp" ]; then
    if [ "$prepare" = 1 ]; then
      listed=$(python3 tools/requirements.py test hf) || return
      mapfile -t wanted <<<"$listed"
    else
      wanted=(-e ".[test,hf]")
    fi
    "$venv/bin/python" -m pip install -q "${wanted[@]}" || return
    echo "hf $stamp" > "$venv/.made_from"
  fi
  if [ "$prepare" = 1 ]; then
    return 0
  fi
  # This checkout, whichever folder it is in (CI's clone moves): the package itself, no deps.
  "$venv/bin/python" -m pip install -q --no-deps -e .
}
if ! install_venv; then
  echo "hf: the install in $venv failed; making the venv anew."
  rm -rf "$venv"
  install_venv
fi
if [ "$prepare" = 1 ]; then
  echo "hf: requirements installed in $venv (the project is added when the leg runs)"
  exit 0
fi
. "$venv/bin/activate"
python - <<'PY'
import sys, jax, torch, transformers, safetensors, peft
print(f"hf: Python {sys.version.split()[0]}, jax {jax.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, safetensors {safetensors.__version__}, "
      f"peft {peft.__version__}")
PY
echo "hf: venv $venv, $(du -sh "$venv" | cut -f1)"
# Two workers; -rP prints what each passing test printed (its figures: score differences, greedy
# agreement) in the summary, which xdist would otherwise drop. transformers' and
# huggingface_hub's progress bars stay off.
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
python -m pytest -q -rP -n 2 -m hf tests/e2e/test_pretrained.py tests/e2e/test_m2m100.py \
  tests/e2e/test_lora_peft.py "$@"
