#!/usr/bin/env bash
# Multi30k English->German end to end within a wall-clock training budget:
#   benchmarks/multi30k.sh DATA_DIR [MINUTES=60] [WORKDIR=runs/multi30k_<MINUTES>m] [AVERAGE=5] \
#       [--config.x=y ...]
# trains configs/multi30k.py for MINUTES minutes (evaluation time not counted), averages the last
# AVERAGE checkpoints, decodes test_2016_flickr with beam 4, and prints sacreBLEU (cased,
# detokenized, with signature) and the paper's compound-split tokenized BLEU. Last line: JSON,
# also written to WORKDIR/multi30k_result.json.
#
# Each step reads its figures from the files main.py writes into the workdir
# (<mode>_result.json), not from a pipe: a closed terminal or a missing directory cannot cost the
# result of an hour of training, and a rerun after an interruption resumes training.
set -euo pipefail
DATA_DIR=${1:?usage: benchmarks/multi30k.sh DATA_DIR [MINUTES] [WORKDIR] [AVERAGE]}
MINUTES=${2:-60}
WORKDIR=${3:-runs/multi30k_${MINUTES}m}
AVERAGE=${4:-5}
shift $(( $# < 4 ? $# : 4 ))  # the rest: config overrides for every command
cd "$(dirname "$0")/.."
mkdir -p "$WORKDIR"
common=(--config=configs/multi30k.py --workdir="$WORKDIR" --config.data.dir="$DATA_DIR" "$@")

SECONDS=0
python main.py "${common[@]}" --config.max_train_minutes="$MINUTES" \
  --config.num_train_steps=10000000
train_s=$SECONDS
python main.py "${common[@]}" --mode=average --num_checkpoints="$AVERAGE"
python main.py "${common[@]}" --mode=eval --checkpoint=averaged --config.decode.beam_size=4
python benchmarks/plot_curve.py --workdir="$WORKDIR" --title="Multi30k EN-DE, $MINUTES min" \
  | tail -1 > "$WORKDIR/curve_result.json"

python - "$WORKDIR" "$MINUTES" "$train_s" <<'PY'
import json, os, sys
workdir, minutes, train_s = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
load = lambda name: json.load(open(os.path.join(workdir, f"{name}_result.json")))
train, avg, ev, curve = load("train"), load("average"), load("eval"), load("curve")
result = {
    "benchmark": "multi30k", "budget_minutes": minutes, "train_wall_s": train_s,
    "steps": train["step"], "averaged_steps": avg["steps"],
    "test_sacrebleu_beam4_averaged": ev["test_sacrebleu_beam4"],
    "test_tokenized_bleu_beam4_averaged": ev["test_tokenized_bleu_beam4"],
    "test_sacrebleu_greedy_averaged": ev["test_sacrebleu_greedy"],
    "test_sacrebleu_beam4_last": train.get("test_sacrebleu_beam4"),
    "sacrebleu_signature": ev["sacrebleu_signature"],
    "curve": curve["curve"], "plot": curve["plot"],
}
line = json.dumps(result)
with open(os.path.join(workdir, "multi30k_result.json"), "w") as f:
  f.write(line + "\n")
print(line)
PY
