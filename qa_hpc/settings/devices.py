"""Read the facts the plan is decided from: GPUs, CPUs, ranks and launcher, as this process sees them.

The one impure half of the settings: `qa_hpc.settings.plan.decide` takes these facts as a
value, so tests feed it made-up ones for machines they do not have.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

import torch

from qa_hpc.errors import EXIT_USAGE
from qa_hpc.settings.plan import DeviceFacts, PlanError, require_visible_gpu

# Environment variables that say a GPU was asked for (a Slurm --gres=gpu job, or an explicit choice).
GPU_REQUEST_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE")


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None


def usable_cpus(env: Mapping[str, str]) -> int:
    """CPUs this process may run on: its affinity mask, capped by Slurm's --cpus-per-task.

    Slurm with task/affinity binds the mask itself; with task/none the mask is the whole node,
    and SLURM_CPUS_PER_TASK is then the only statement of the allocation.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    slurm = _int_env(env, "SLURM_CPUS_PER_TASK")
    return max(1, min(cpus, slurm) if slurm else cpus)


def gpus_requested(env: Mapping[str, str]) -> str | None:
    """'NAME=value, ...' for every variable that names a GPU for this job, or None."""
    asked = []
    for name in GPU_REQUEST_VARS:
        value = env.get(name, "").strip()
        none = value in ("", "-1", "none", "NoDevFiles") or (name == "SLURM_GPUS_ON_NODE" and value == "0")
        if not none:
            asked.append(f"{name}={value}")
    return ", ".join(asked) or None


def launcher(env: Mapping[str, str]) -> str:
    """accelerate launch always sets ACCELERATE_MIXED_PRECISION; torchrun sets TORCHELASTIC_RUN_ID."""
    if "ACCELERATE_MIXED_PRECISION" in env:
        return "accelerate"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    return "python"


def device_name(device: torch.device) -> str:
    """A CUDA device's name as the driver reports it ("NVIDIA H100 80GB HBM3"), else the device type ("cpu")."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return device.type


def read_device_facts(env: Mapping[str, str] | None = None) -> DeviceFacts:
    env = os.environ if env is None else env
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    local_rank = _int_env(env, "LOCAL_RANK") or 0
    index = local_rank % count if count else None
    precision = env.get("ACCELERATE_MIXED_PRECISION")
    return DeviceFacts(
        cuda_available=cuda,
        gpu_count=count,
        capability=tuple(torch.cuda.get_device_capability(index)) if index is not None else None,
        gpu_name=torch.cuda.get_device_name(index) if index is not None else None,
        cpus=usable_cpus(env),
        world_size=_int_env(env, "WORLD_SIZE") or 1,
        local_world_size=_int_env(env, "LOCAL_WORLD_SIZE") or 1,
        launcher=launcher(env),
        omp_num_threads=_int_env(env, "OMP_NUM_THREADS"),
        accelerate_mixed_precision=precision.strip().lower() if precision else None,
        gpus_requested=gpus_requested(env),
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m qa_hpc.settings.devices --gpu-count`: what job_ddp.sh starts one process per."""
    parser = argparse.ArgumentParser(prog="python -m qa_hpc.settings.devices",
                                     description="The GPUs torch sees here; exit 2 when a GPU was asked for but none "
                                     "is seen.")
    parser.add_argument("--gpu-count", action="store_true", help="print the number of GPUs torch sees")
    parser.parse_args(argv)
    facts = read_device_facts()
    try:
        require_visible_gpu(facts)
    except PlanError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(facts.gpu_count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
