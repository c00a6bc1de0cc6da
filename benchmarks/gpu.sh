#!/usr/bin/env bash
# The step's GPU figures (profile, A/B of XLA options, the Flax example beside ours), in one
# short run on one NVIDIA GPU, most important first:
#
#   OUT=/tmp/gpu_records FLAX_WMT_DIR=build/flax/examples/wmt bash benchmarks/gpu.sh
#   OUT=/tmp/gpu_records bash benchmarks/gpu.sh profile ab_base     # chosen stages, in this order
#
# All at the paper's batch: bfloat16, 97 rows of 256 target tokens (~25,000), 37,000-token vocabulary.
# Stages (default: all, in this order):
#   profile  the base step under jax.profiler: kernel time by kind, the costliest kernels named
#            (profile_step.py)
#   flax     side by side with the Flax WMT example: base train step, beam-4 decoding at batch 32
#            and 256, alternately in one process (flax_wmt.py; needs FLAX_WMT_DIR, below)
#   ab_base  the base step's A/B: XLA options and config choices compiled in one process and timed
#            round-robin, with the loss of 20 fixed steps beside the baseline's (ab_step.py)
#   ab_big   the same for big, fewer variants
#   steps    the earlier records: base and big (our attention), decoding at 32 and 256
#   decode_xla  decoding at batch 32 under the package's GPU defaults and XLA's own, in turns
#   fp16     base in float16 with its dynamic loss scale (the T4/V100 path of model.dtype=auto)
# Records go to $OUT as <bench>_<gpu>_<what>.json (gpu = h100, h200, ... from the device name;
# a SMOKE=1 dry run's end in _smoke).
# Each stage has its own time limit, so one that hangs costs only itself, and a stage that would
# runs with at most what is left of GPU_BUDGET_S (default 480 s; under 60 s left, it is skipped with a
# line saying so). Exits 1 if any stage failed or was skipped. On one H200 (2026-11-28) the profile
# stage took 82 s, and ab_base's variants compiled in 21-41 s each (4.6 and 3.7 s for two read
# from the shared cache; nine took 250 s, and with their builds outran the stage's 300 s:
# ab_step.py now gets --deadline_s and builds only the variants that fit, most promising first).
# The second lease's `GPU_BUDGET_S=555 FLAX_DECODE_BATCH_SIZES=32 ... gpu.sh ab_base flax` took
# 372 s (7 of 9 variants compiled; the side by side 126 s). The third's (2026-11-29)
# `GPU_BUDGET_S=540 FLAX_DECODE_BATCH_SIZES=32 ... gpu.sh profile flax ab_base` took 387 s (profile
# 61 s, side by side 135 s, all 6 ab_base variants compiled in 187 s). The next run is
# `GPU_BUDGET_S=540 FLAX_DECODE_BATCH_SIZES=32 ... gpu.sh decode_xla flax ab_base` (docs/performance.md).
# SMOKE=1 runs every stage but `steps` at the tiny size, on any machine (a dry run on the CPU;
# tests/e2e/test_scripts.py runs its profile and ab_base stages so; the others ran so by hand).
#
# The Flax example is not on PyPI and the GPU machine has no network: carry a copy, e.g.
#   git -C <a flax clone> archive HEAD examples/wmt | tar -x -C build/flax   (build/ is ignored)
# and pass FLAX_WMT_DIR=build/flax/examples/wmt (FLAX_COMMIT=<sha> names it in the record).
# FLAX_DECODE_BATCH_SIZES=32 decodes at batch 32 only (the goal's figure): two compiles fewer.
# Where the tree was copied to the GPU machine with an older .git, RECORD_COMMIT=<sha> names the
# commit it was made from in every record (beside what git there says).
# Needs the project's dependencies importable (PYTHONPATH=. from the checkout).
set -uo pipefail
failed=0
OUT=${OUT:?set OUT to the folder for the records}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=".:${PYTHONPATH:-}"
# One compilation cache for the whole run: a step compiled by one stage (the profile's baseline) is
# not compiled again by the next (ab_step's baseline and its `again`), which saves GPU minutes. A
# record's compile_s after the first stage may therefore be a cache read.
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
export JAX_COMPILATION_CACHE_DIR=$cache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
PY=${PYTHON:-python3}
BUDGET=${GPU_BUDGET_S:-480}
start=$SECONDS
stages=("$@")
[ ${#stages[@]} -gt 0 ] || [ -z "${SMOKE:-}" ] || stages=(profile flax ab_base ab_big decode_xla fp16)
[ ${#stages[@]} -gt 0 ] || stages=(profile flax ab_base ab_big steps decode_xla fp16)
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 \
    | grep -owiE 'GH200|H100|H200|A100|L40S|L4|A10G|V100|T4' | head -1 | tr 'A-Z' 'a-z')
fi
# A dry run (SMOKE=1) without a GPU names its records "cpu", not "gpu".
GPU=${GPU:-${GPU_NAME:-$([ -n "${SMOKE:-}" ] && echo cpu || echo gpu)}}
$PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
SHAPES=(--dtype=bfloat16 --tokens_per_step=25000 --max_len=256)
PEAK=(--peak_n=8192)
DECODE_SIZE=(--size=base)
[ -z "${SMOKE:-}" ] || { SHAPES=(--size=tiny --tokens_per_step=1024 --max_len=32); PEAK=(--peak_n=256)
  DECODE_SIZE=(--size=tiny --vocab_size=1000); }

run() {  # run <limit_s> <name> <script> <flags...>: one benchmark, its record $OUT/<name>.json
  # A dry run's records end in _smoke: they hold the tiny size, whatever the stage's name says.
  local limit=$1 name=$2${SMOKE:+_smoke} script=$3; shift 3
  local left=$((BUDGET - (SECONDS - start)))
  if [ "$left" -lt 60 ]; then
    echo "SKIPPED: $name ($left s of GPU_BUDGET_S left)"
    failed=$((failed + 1))
    return
  fi
  [ "$left" -ge "$limit" ] || limit=$left
  echo "== $name ($((SECONDS - start)) s in, limit $limit s)"
  # ab_step.py compiles variants only while they fit (each base variant: 25-41 s on the H200).
  local deadline=()
  [ "$script" != ab_step.py ] || deadline=(--deadline_s=$((limit - 25)))
  timeout "$limit" $PY "benchmarks/$script" --results_dir="$OUT" --record="$name" "$@" \
    ${deadline[@]+"${deadline[@]}"} 2>&1 \
    | grep -vE '^I[0-9]{4}|^W[0-9]{4}' | tail -"${TAIL:-4}"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "FAILED: $name"; failed=$((failed + 1)); }
}
# Each variant is an XLA option or a config choice that may speed the step up; an option this XLA lacks is
# reported in the record as that variant's error and the others still run.
# The baseline is the package's default: model.attention=auto (cuDNN's on the GPU) and
# runtime/xla_flags.py's GPU option (Triton GEMMs off), kept by the A/Bs of 2026-11-28
# (benchmarks/results/ab_step_h200_base_cudnn.json; command buffers off was dropped on 2026-11-29:
# it halved decoding). Triton's block-level norm fusion (0.87x) and cuDNN layer norm (1.00x) were
# measured there and dropped.
# Compiled in this order while they fit (ab_step.py --deadline_s): the noise, then what may be
# faster (the output layer and loss in blocks of positions, never holding the whole float32
# logits: 21% of the step on the H200, docs/performance.md; rbg's masks), then the choices the
# defaults replaced, timed against them. cuBLASLt (0.9965x) and `jax` attention (0.828x) were
# measured on 2026-11-29 and left out.
AB_BASE=(
  --variant="again"
  --variant="blocks4k;model.loss_block_tokens=4096"
  --variant="blocks8k;model.loss_block_tokens=8192"
  --variant="rbg;model.dropout_rng=rbg"
  --variant="triton_gemm_on;xla_gpu_enable_triton_gemm=True"
  --variant="ours;model.attention=ours"
)
AB_BIG=(--variant="blocks4k;model.loss_block_tokens=4096" --variant="rbg;model.dropout_rng=rbg")
[ -z "${SMOKE:-}" ] || { AB_BASE=(--variant="fastmath;xla_cpu_enable_fast_math=True"
  --variant="blocks;model.loss_block_tokens=256"); AB_BIG=(); }
for stage in "${stages[@]}"; do
  case "$stage" in
    profile) TAIL=13 run 120 "profile_step_${GPU}_base" profile_step.py --size=base "${SHAPES[@]}" --top=40 ;;
    flax)
      if [ -z "${FLAX_WMT_DIR:-}" ]; then
        echo "SKIPPED: flax (set FLAX_WMT_DIR to the Flax example's folder)"
        failed=$((failed + 1))
      else
        TAIL=5 run 200 "flax_wmt_${GPU}_base" flax_wmt.py --size=base "${SHAPES[@]}" \
          --flax_wmt_dir="$FLAX_WMT_DIR" --flax_commit="${FLAX_COMMIT:-}" \
          --decode_batch_sizes="${FLAX_DECODE_BATCH_SIZES:-32,256}" \
          ${SMOKE:+--decode_batch_sizes=4 --rounds=2 --steps_per_round=2}
      fi
      ;;
    ab_base) TAIL=9 run 330 "ab_step_${GPU}_base" ab_step.py --size=base "${SHAPES[@]}" \
      "${AB_BASE[@]}" ${SMOKE:+--rounds=2 --steps_per_round=2 --loss_steps=3} ;;
    ab_big) TAIL=5 run 240 "ab_step_${GPU}_big" ab_step.py --size=big "${SHAPES[@]}" \
      ${AB_BIG[@]+"${AB_BIG[@]}"} ${SMOKE:+--rounds=2 --steps_per_round=2 --loss_steps=3} ;;
    steps)
      run 85 "train_step_${GPU}_base" train_step.py --size=base "${SHAPES[@]}" --steps=20 --peak_n=8192
      run 100 "train_step_${GPU}_big" train_step.py --size=big "${SHAPES[@]}" --steps=20 --peak_n=8192
      run 70 "decode_${GPU}_base" decode.py --size=base --noctranslate2 --repeats=5 --batch_size=32
      run 70 "decode_${GPU}_base_b256" decode.py --size=base --noctranslate2 --repeats=5 \
        --batch_size=256
      ;;
    decode_xla)
      # Beam-4 decoding at batch 32 under the package's GPU defaults and under XLA's own
      # (FLAXFORMER_NMT_XLA_DEFAULTS=0), in turns, twice: an XLA option kept for the train step
      # must not slow the search (turning command buffers off halved it, 2026-11-29).
      for r in 1 2; do
        run 60 "decode_${GPU}_base_pkg_r$r" decode.py "${DECODE_SIZE[@]}" --noctranslate2 \
          --repeats=5 --batch_size=32
        FLAXFORMER_NMT_XLA_DEFAULTS=0 run 60 "decode_${GPU}_base_xla_r$r" decode.py \
          "${DECODE_SIZE[@]}" --noctranslate2 --repeats=5 --batch_size=32
      done
      ;;
    fp16) run 85 "train_step_${GPU}_base_fp16" train_step.py --size=base "${SHAPES[@]}" \
      --dtype=float16 --steps=20 "${PEAK[@]}" ;;
    *) echo "gpu.sh: unknown stage '$stage' (profile flax ab_base ab_big steps decode_xla fp16)" >&2
      exit 2 ;;
  esac
done
ls "$OUT"
echo "gpu.sh: $((SECONDS - start)) s, $failed failed or skipped"
exit $((failed > 0))
