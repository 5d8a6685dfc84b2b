#!/bin/bash
#SBATCH --job-name=bert_squad_cpu
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=16
#SBATCH --mem=32G
#SBATCH --time=12:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#
# The same run as job_ft3.sh on a CPU node: one process (bf16 where the CPU has AVX512-BF16/AMX, else fp32;
# QA_PRECISION=fp32 for fp32 everywhere), torch threads = the CPUs the job may use
# (--cpus-per-task; run_qa.py decides and logs it in its PLAN line). The full BASELINE takes days on a
# CPU; the offline demo (QA_MODE=demo) or --max_train_samples make it a sensible CPU job.
#
#   sbatch job_cpu.sh                          # log in logs/bert_squad_cpu-<jobid>.out
#   QA_MODE=demo sbatch -c 8 job_cpu.sh
#   bash job_cpu.sh --max_train_samples 500    # without SLURM (threads: all cores)
#
# Overrides: as job_ft3.sh. Preemption: as job_ft3.sh. CPU levers (scripts/env_setup.sh qa_cpu_levers,
# logged as CPU_LEVERS ...): QA_CPU_ALLOCATOR=auto|jemalloc|tcmalloc|none (LD_PRELOAD, when the library
# is there), QA_CPU_AFFINITY=1|0 (OMP_PROC_BIND/OMP_PLACES).
set -uo pipefail
_self_dir=${QA_HPC_DIR:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "$0")" && pwd)}}
[ -f "$_self_dir/scripts/env_setup.sh" ] || _self_dir=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/env_setup.sh
source "$_self_dir/scripts/env_setup.sh" || { echo "cannot read $_self_dir/scripts/env_setup.sh (submit from the checkout)" >&2; exit 2; }

export CUDA_VISIBLE_DEVICES=""
qa_job_start bert_squad_cpu

qa_select_run "$JOB_NAME" "$@"
qa_cpu_levers   # allocator and thread affinity, each behind a switch (QA_CPU_ALLOCATOR, QA_CPU_AFFINITY)
qa_run_preemptible local python run_qa.py "${QA_ARGS[@]}" --use_cpu "$@"
rc=$?
qa_report "$rc"
qa_run_report
exit "$rc"
