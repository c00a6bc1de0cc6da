#!/usr/bin/env bash
# The real train step and decoding on one NVIDIA GPU, in one short run, beside the TPU estimates:
#
#   OUT=/tmp/gpu_records bash benchmarks/gpu.sh
#
# Base and big in bfloat16 at the TPU estimates' batch (97 rows of 256 target tokens, ~25,000),
# each with our attention (model.attention="ours") and with jax.nn.dot_product_attention ("jax":
# cuDNN's fused kernel where it takes the shapes); then cached beam-4 decoding of base at the TPU
# estimate's batch (32 sentences) and at 256. Records go to $OUT as <bench>_<gpu>_<size>[_jax].json
# (gpu = h100, h200, ... from the device name); last, base in float16. Each run has its own time
# limit, so one that hangs costs only itself; the script exits 1 if any run failed. Needs the
# project's dependencies importable (PYTHONPATH=. from the checkout).
set -uo pipefail
failed=0
OUT=${OUT:?set OUT to the folder for the records}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=".:${PYTHONPATH:-}"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -owiE 'GH200|H100|H200|A100|L40S|L4|A10G|V100' | head -1 | tr 'A-Z' 'a-z')
GPU=${GPU:-gpu}
$PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"

step() {  # step <limit_s> <record> <flags...>
  local limit=$1 name=$2; shift 2
  echo "== $name"
  timeout "$limit" $PY benchmarks/train_step.py --dtype=bfloat16 --tokens_per_step=25000 \
    --max_len=256 --steps=20 --peak_n=8192 --results_dir="$OUT" --record="$name" "$@" 2>&1 \
    | grep -vE '^I[0-9]{4}|^W[0-9]{4}' | tail -3 || { echo "FAILED: $name"; failed=$((failed + 1)); }
}
decode() {  # decode <limit_s> <record> <flags...>
  local limit=$1 name=$2; shift 2
  echo "== $name"
  timeout "$limit" $PY benchmarks/decode.py --size=base --noctranslate2 --repeats=5 \
    --results_dir="$OUT" --record="$name" "$@" 2>&1 | grep -vE '^I[0-9]{4}|^W[0-9]{4}' | tail -3 \
    || { echo "FAILED: $name"; failed=$((failed + 1)); }
}

step 85 "train_step_${GPU}_base" --size=base
step 85 "train_step_${GPU}_base_jax" --size=base --set model.attention=jax
decode 70 "decode_${GPU}_base" --batch_size=32
decode 70 "decode_${GPU}_base_b256" --batch_size=256
step 100 "train_step_${GPU}_big" --size=big
step 100 "train_step_${GPU}_big_jax" --size=big --set model.attention=jax
# The T4/V100 path (what "auto" picks below compute capability 8.0), on this GPU: float16 with
# its dynamic loss scale.
step 85 "train_step_${GPU}_base_fp16" --size=base --dtype=float16
ls "$OUT"
exit $((failed > 0))
