#!/usr/bin/env bash
# Runs the parallel, training, multi-process, translation and decoding tests, and the Colab notebook
# (headless, in a real kernel), under the oldest
# stack we support: Colab's (Python 3.13 where this machine has it, jax 0.7.2, flax 0.11.2,
# orbax-checkpoint 0.12.4; tools/constraints-colab.txt), in a fresh virtual environment.
#   tools/compat_oldest_jax.sh [PYTEST_ARGS...]
# .ci/run calls it after the README's test command, which runs everything under the newest JAX.
set -euo pipefail
cd "$(dirname "$0")/.."
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
  echo "compat: no Python 3.13 here; using $(python3 --version) with Colab's packages." >&2
fi
venv=$(mktemp -d)/venv
"$python" -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python -m pip install -q -e ".[test]" -c tools/constraints-colab.txt
python - <<'PY'
import sys, jax, flax, optax, orbax.checkpoint
print(f"compat: Python {sys.version.split()[0]}, jax {jax.__version__}, flax {flax.__version__}, "
      f"optax {optax.__version__}, orbax-checkpoint {orbax.checkpoint.__version__}")
PY
python -m pytest -q tests/test_parallel.py tests/test_train.py tests/test_multiprocess.py \
  tests/test_translate.py tests/test_decode.py tests/test_notebook.py "$@"
