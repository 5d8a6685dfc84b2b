#!/bin/bash
#SBATCH --job-name=bert_squad_ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=32
#SBATCH --mem=128G
#SBATCH --time=04:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#
# Multi-node DDP: the BASELINE fine-tune (see job_ft3.sh) on every GPU of 2 nodes. One task per
# node: srun starts one torchrun per node, which starts one worker per GPU of that node (as torch
# sees them in the allocation); rendezvous is c10d on the first node of the allocation, keyed by the
# job id. NCCL on GPU nodes, gloo on CPU-only nodes (then QA_CPU_PROCS_PER_NODE workers, default 1).
# per_device_train_batch_size stays 24, so the global batch is 24 x GPUs. Each node's torchrun gets the
# task's --cpus-per-task CPUs (passed to srun explicitly: Slurm 22.05+ steps no longer inherit it), and
# run_qa.py gives each of its processes an equal share of them as torch threads (PLAN line).
#
#   sbatch job_ddp.sh                                        # 2 nodes x 4 GPUs
#   sbatch --nodes=4 --gres=gpu:8 job_ddp.sh --max_train_samples 20000
#   sbatch --gres=none job_ddp.sh                            # CPU nodes (gloo)
#
# Overrides: everything job_ft3.sh takes, plus QA_NPROC_PER_NODE, QA_CPU_PROCS_PER_NODE,
# QA_RDZV_PORT (default 15000 + job id mod 10000, so jobs sharing a node do not collide),
# QA_NUMA_BINDING (GPU nodes: exclusive = each worker on its own CPUs of its GPU's NUMA node, torchrun
# --numa-binding with numactl; none to leave it). Passed through to every rank as set: NCCL_DEBUG=INFO
# (which interface and transport NCCL picked), NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME (e.g. ib0, ^lo).
# Preemption: as job_ft3.sh (USR1 to every worker, requeue, resume).
set -uo pipefail
_self_dir=${QA_HPC_DIR:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "$0")" && pwd)}}
[ -f "$_self_dir/scripts/env_setup.sh" ] || _self_dir=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/env_setup.sh
source "$_self_dir/scripts/env_setup.sh" || { echo "cannot read $_self_dir/scripts/env_setup.sh (submit from the checkout)" >&2; exit 2; }

qa_job_start bert_squad_ddp

GPUS=$(qa_gpu_count) || exit $?
if [ "$GPUS" -gt 0 ]; then
	NPROC=${QA_NPROC_PER_NODE:-$GPUS}
	BACKEND=nccl
else
	NPROC=${QA_NPROC_PER_NODE:-${QA_CPU_PROCS_PER_NODE:-1}}
	BACKEND=gloo
fi
case $NPROC in
'' | *[!0-9]* | 0) qa_die "QA_NPROC_PER_NODE/QA_CPU_PROCS_PER_NODE=$NPROC: give a number of processes, 1 or more" ;;
esac
NNODES=${SLURM_NNODES:-1}
# the first node's name as Slurm knows it: every node of the allocation resolves it
if [ -n "${SLURM_JOB_NODELIST:-}" ]; then
	MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
else
	MASTER=127.0.0.1
fi
PORT=$(qa_rdzv_port)
# each GPU worker on CPUs of its own near its GPU (needs numactl; the step's CPUs are the pool). run_qa.py's
# plan sees a bound worker's own CPUs beside torchrun's, and takes the smaller share for its threads and
# loader workers (PLAN shows it)
BINDING=${QA_NUMA_BINDING:-exclusive}
if [ "$GPUS" -eq 0 ]; then
	qa_log "BINDING=none (no GPU on this node: CPU workers share the step's CPUs)"
	BINDING=none
elif [ "$BINDING" = none ]; then
	qa_log "BINDING=none (QA_NUMA_BINDING=none)"
elif ! command -v numactl >/dev/null; then
	qa_log "BINDING=none (no numactl on this node: install it for QA_NUMA_BINDING=$BINDING)"
	BINDING=none
fi

qa_select_run "$JOB_NAME" "$@"
QA_ARGS+=(--ddp_backend "$BACKEND")
# each rank's own exit code, since torchrun exits 1 whatever they are (qa_ranks_exit_code): in the checkout,
# which every node sees
QA_EXIT_CODE_DIR=$(mktemp -d "$PWD/logs/.exit_codes-XXXXXX") || qa_die "cannot write into $PWD/logs"
export QA_EXIT_CODE_DIR
qa_log "DDP nodes=$NNODES nproc_per_node=$NPROC world_size=$(( NNODES * NPROC )) backend=$BACKEND" \
	"rdzv=c10d endpoint=$MASTER:$PORT id=${SLURM_JOB_ID:-local} cpus_per_task=${SLURM_CPUS_PER_TASK:-unset}" \
	"numa_binding=$BINDING NCCL_DEBUG=${NCCL_DEBUG:-unset} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-unset}" \
	"GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-unset}"
bind=()
[ "$BINDING" = none ] || bind=(--numa-binding="$BINDING")
launcher=(
	torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" --max_restarts=0
	"${bind[@]}"
	--rdzv_backend=c10d --rdzv_endpoint="$MASTER:$PORT" --rdzv_id="${SLURM_JOB_ID:-local}"
	run_qa.py "${QA_ARGS[@]}" "$@"
)
if [ -n "${SLURM_JOB_ID:-}" ]; then
	# The preemption warning (SIGUSR1) goes to every process of the step. torchrun must ignore it
	# (its default action would kill it and orphan the workers); the workers handle it: they agree
	# on a step, save one checkpoint and exit 75. SIGTERM stays torchrun's: it passes it on.
	# --kill-on-bad-exit: a node whose torchrun fails ends the whole step at once; the other nodes'
	# ranks would otherwise wait in a collective until its timeout (30 min) with their GPUs held.
	# After a preemption every rank passes a barrier once the checkpoint is written, before any exits.
	# (No --wait: a node ends with 0 only after the run's last collective, so none is left waiting.)
	# --cpus-per-task given to the step explicitly: Slurm 22.05 stopped passing SLURM_CPUS_PER_TASK
	# on to srun, later versions read SRUN_CPUS_PER_TASK; each step then gets what the job asked for.
	# STEP_CPUS: the CPUs the step really got on each node (its affinity mask).
	qa_run_preemptible steps srun --nodes="$NNODES" --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
		--kill-on-bad-exit=1 \
		bash -c 'trap "" USR1; echo "STEP_CPUS node=${SLURMD_NODENAME:-$(hostname)} cpus=$(nproc)"; exec "$@"' \
		torchrun-without-usr1 "${launcher[@]}"
else
	# Ctrl-C by hand: torchrun keeps SIGINT ignored, as the shell started it, which passes it on as SIGTERM
	# (a checkpoint, exit 75); torchrun's own handling would pass SIGINT to the workers, which stop without one
	qa_run_preemptible torchrun "${launcher[0]}" --signals_to_handle=SIGTERM,SIGHUP,SIGQUIT "${launcher[@]:1}"
fi
rc=$?
qa_report "$rc"
qa_run_report
exit "$rc"
