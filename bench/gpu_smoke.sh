#!/bin/bash
# GPU smoke: what the first GPU job prints, how fast a steady step is, and whether bert-base learns.
#   1. job_ft3.sh for 20 steps on one GPU: the job path (its PLAN / EFFECTIVE lines, exit 0)
#   2. a short real fine-tune of the cached bert-base-uncased on SQuAD v1.1 with the BASELINE settings
#      (batch 24 per GPU, lr 4e-5, 384/128, auto precision): SMOKE_TRAIN features, 1 epoch, every step
#      timed (bench/gpu_smoke.py), eval on SMOKE_EVAL dev questions; F1 >= SMOKE_MIN_F1 says it learned
#   3. the same through torchrun on every GPU of the node, when it has several
# Each fine-tune writes one JSON record into bench/results/ (GPU, driver, CUDA, torch; steady-state step
# time after SMOKE_WARMUP steps, samples/s, real tokens/s, MFU at the precision that ran, peak memory,
# the 2-epoch projection beside the A100 baseline, EM/F1) and prints SMOKE ... lines. Send those back.
#
#   bash bench/gpu_smoke.sh                       # on a GPU node, after 'bash setup_bert.sh' (no hub needed)
#   SMOKE_TRAIN=24000 OUT=/scratch/smoke bash bench/gpu_smoke.sh
#   SMOKE_MODEL=/scratch/minilm SMOKE_DATA=/scratch/squad bash bench/gpu_smoke.sh   # no cache: a model directory,
#       and a directory with train-v1.1.json (or train-v1.1.first44articles.json) and dev-v1.1.json; step 1 then
#       runs job_ft3.sh's offline demo with that model (QA_MODE=demo), since the job's BASELINE needs the cache
#
# Exit: 0 all ran and learned; 2 no GPU here or nothing cached (one line); else the failing step's status.
set -uo pipefail
# shellcheck source=../scripts/env_setup.sh
source "$(dirname "$0")/../scripts/env_setup.sh"
qa_setup_env   # venv, hf_cache/, offline; cd to the checkout
gpus=$(python -m qa_hpc.plan --gpu-count) || exit $?
if [ "$gpus" -lt 1 ]; then
	echo "GPU_SMOKE=not_run: no GPU here (torch sees none); run bench/gpu_smoke.sh on a GPU node" >&2
	exit "$EXIT_USAGE"
fi
MODEL=${SMOKE_MODEL:-bert-base-uncased}
if [ -z "${SMOKE_DATA:-}" ]; then   # the job's BASELINE: both from the cache setup_bert.sh filled
	python -m qa_hpc.tools.prefetch --check --model "$MODEL" >/dev/null ||
		qa_die "$MODEL and squad are not both cached in $HF_HOME: run 'bash setup_bert.sh' on the login node"
	data=(--dataset_name squad)
	job=(QA_MODE=baseline "QA_MODEL=$MODEL")
else
	train=$SMOKE_DATA/train-v1.1.json
	[ -f "$train" ] || train=$SMOKE_DATA/train-v1.1.first44articles.json
	[ -f "$train" ] && [ -f "$SMOKE_DATA/dev-v1.1.json" ] ||
		qa_die "SMOKE_DATA=$SMOKE_DATA needs train-v1.1.json (or train-v1.1.first44articles.json) and dev-v1.1.json"
	data=(--train_file "$train" --validation_file "$SMOKE_DATA/dev-v1.1.json")
	job=(QA_MODE=demo "QA_DEMO_MODEL=$MODEL")
fi
OUT=${OUT:-/tmp/qa_gpu_smoke}
WARMUP=${SMOKE_WARMUP:-20}
mkdir -p "$OUT"
first_gpu=${CUDA_VISIBLE_DEVICES:-0}
first_gpu=${first_gpu%%,*}   # one process on several GPUs is refused (README)
keep='\b(PLAN|EFFECTIVE|RUN_MODE|JOB_SECONDS|eval_f1|eval_exact_match)\b|ERROR'

# as a short job runs: its plan decided again once its 20 batches are counted, and eager (the 2-epoch job's
# 7,377 compile: bench/gpu_speed.sh measures that)
env "${job[@]}" CUDA_VISIBLE_DEVICES="$first_gpu" QA_OUTPUT_DIR="$OUT/job_ft3" QA_LOG_DIR="$OUT/logs" QA_REPORT_TO=none \
	bash job_ft3.sh --max_steps 20 --max_train_samples 480 --max_eval_samples 200 --save_strategy no \
	--overwrite_output_dir 2>&1 | grep -E "$keep"
job_status=${PIPESTATUS[0]}
[ "$job_status" = 0 ] || { qa_log "GPU_SMOKE job_ft3.sh failed (exit $job_status): $OUT/logs"; exit "$job_status"; }

# eager, as the first GPU run measured it: the 1-GPU and torchrun rows compare like with like (several
# processes never compile by default) and no ~2 min compile; bench/gpu_speed.sh measures the compiled default
finetune=(--model_name_or_path "$MODEL" "${data[@]}" --do_train --do_eval --num_train_epochs 1
	--torch_compile false --max_train_samples "${SMOKE_TRAIN:-12000}" --max_eval_samples "${SMOKE_EVAL:-1000}"
	--per_device_train_batch_size 24 --learning_rate 4e-5 --max_seq_length 384 --doc_stride 128 --precision auto
	--logging_steps 50 --save_strategy no --report_to none --overwrite_output_dir)
smoke() {  # smoke LABEL LAUNCHER...: the timed fine-tune, its log lines, its record
	local label=$1; shift
	"$@" bench/gpu_smoke.py train "${finetune[@]}" --output_dir "$OUT/$label" >"$OUT/$label.log" 2>&1
	local rc=$?
	grep -E "$keep" "$OUT/$label.log"
	[ "$rc" = 0 ] || { qa_log "GPU_SMOKE $label failed (exit $rc): $OUT/$label.log"; return "$rc"; }
	python bench/gpu_smoke.py record "$OUT/$label" --label "$label" --warmup "$WARMUP" --min_f1 "${SMOKE_MIN_F1:-50}"
}
status=0
CUDA_VISIBLE_DEVICES=$first_gpu smoke finetune_1gpu python || status=$?
if [ "$gpus" -gt 1 ]; then
	smoke "finetune_torchrun_x$gpus" python -m torch.distributed.run --standalone --nproc_per_node="$gpus" || status=$?
fi
exit "$status"
