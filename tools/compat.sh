#!/usr/bin/env bash
# Runs the unit tier and a short list of end-to-end tests (multi-process training, kill -9 resume,
# the EMA, the Colab notebook headless in a real kernel; listed below) under Python 3.13 (pyenv's,
# or python3.13 on the PATH) in a fresh virtual environment, with one of two package stacks:
#   tools/compat.sh colab  [PYTEST_ARGS...]  Colab's (jax 0.7.2, flax 0.11.2, orbax-checkpoint
#                                            0.12.4; tools/constraints-colab.txt): the oldest we support
#   tools/compat.sh newest [PYTEST_ARGS...]  whatever pip resolves today on Python 3.13 (what most
#                                            new users get: jax 0.12.x, flax 0.12.x when written)
# .ci/run calls both after the README's test command (Python 3.11, jax 0.10.x). Where no Python 3.13
# is found, the leg says so on a line of its own and runs under python3 instead.
set -euo pipefail
cd "$(dirname "$0")/.."
stack=${1:?usage: tools/compat.sh colab|newest [PYTEST_ARGS...]}
shift
case "$stack" in
  colab) constraints=(-c tools/constraints-colab.txt) ;;
  newest) constraints=() ;;
  *) echo "tools/compat.sh: unknown stack '$stack' (colab or newest)" >&2; exit 2 ;;
esac
python=""
for candidate in python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13; do
  # A pyenv shim exists even where it cannot run 3.13: ask the interpreter itself.
  if "$candidate" -c "import sys; assert sys.version_info[:2] == (3, 13)" >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  python=python3
  echo "compat[$stack]: SKIPPED Python 3.13 (none found on this machine); running under $(python3 --version) instead."
fi
# COMPAT_VENV names a virtual environment kept between runs (.ci/run keeps one per leg): it is
# made if missing, and made anew if it is not this Python's, was made from another pyproject.toml,
# or the install in it fails. The newest
# leg upgrades every package in it (eager), so a kept venv still tests today's releases.
venv=${COMPAT_VENV:-$(mktemp -d)/venv}
case "$stack" in
  newest) upgrade=(--upgrade --upgrade-strategy eager) ;;
  *) upgrade=() ;;
esac
version() { "$1" -c "import sys; print(sys.version_info[:2])" 2>/dev/null; }
# What the venv was made from: a kept venv made from another pyproject.toml (or constraints) is
# made anew, so a dependency the project no longer declares cannot linger in it unseen.
stamp=$(cat pyproject.toml tools/constraints-colab.txt | sha256sum | cut -c1-16)
# COMPAT_PREPARE=1 (.ci/run, in the background while its main leg runs): the venv and the project's
# requirements only (tools/requirements.py), then exit; the leg run later finds them installed and
# adds the project itself, whose editable build writes into the checkout.
prepare=${COMPAT_PREPARE:-0}
if [ "$prepare" = 1 ]; then
  listed=$("$python" tools/requirements.py test)  # fails the script if it fails
  mapfile -t wanted <<<"$listed"
else
  wanted=(-e ".[test]")
fi
install_venv() {
  if [ "$(version "$venv/bin/python")" != "$(version "$python")" ] \
    || [ "$(cat "$venv/.made_from" 2>/dev/null)" != "$stack $stamp" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # Unstamped while pip changes it: an install cut short (a failed .ci/run ends the preparation)
  # leaves a venv the next run makes anew rather than trusts.
  rm -f "$venv/.made_from"
  # ${a[@]+"${a[@]}"}: an empty array under `set -u` on bash < 4.4 too.
  "$venv/bin/python" -m pip install -q ${upgrade[@]+"${upgrade[@]}"} "${wanted[@]}" \
    ${constraints[@]+"${constraints[@]}"} && echo "$stack $stamp" > "$venv/.made_from"
}
if ! install_venv; then
  echo "compat[$stack]: the install in $venv failed; making the venv anew."
  rm -rf "$venv"
  install_venv
fi
if [ "$prepare" = 1 ]; then
  echo "compat[$stack]: requirements installed in $venv (the project is added when the leg runs)"
  exit 0
fi
. "$venv/bin/activate"
python - "$stack" <<'PY'
import sys, jax, jaxlib, flax, optax, orbax.checkpoint, numpy
print(f"compat[{sys.argv[1]}]: Python {sys.version.split()[0]}, jax {jax.__version__}, "
      f"jaxlib {jaxlib.__version__}, flax {flax.__version__}, optax {optax.__version__}, "
      f"orbax-checkpoint {orbax.checkpoint.__version__}, numpy {numpy.__version__}")
PY
# The unit tier (alone, so it compiles at -O0 as a contributor runs it: tests/conftest.py), then
# the end-to-end tests whose code depends most on the JAX, orbax and optax of the stack: several
# processes joined by jax.distributed (gloo collectives, orbax from two processes), exact resume
# after kill -9 (orbax's asynchronous saves), the EMA in optax's state, and the Colab notebook in a
# real kernel.
python -m pytest -q -n 2 tests/unit "$@"
python -m pytest -q -n 2 \
  tests/e2e/test_multiprocess.py::test_two_processes_train_like_one_through_sigterm_and_kill \
  tests/e2e/test_checkpoint_multiprocess.py \
  tests/e2e/test_resume.py::test_kill9_at_random_steps_then_resume_is_bitwise_identical \
  tests/e2e/test_best_ema.py::test_the_ema_is_the_hand_computed_average_of_the_trained_parameters \
  tests/e2e/test_notebook.py "$@"
