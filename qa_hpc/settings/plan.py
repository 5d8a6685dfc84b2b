"""What a run will use, decided once: precision, TF32, devices, threads, dataloader workers, reporting.

`decide(request, facts)` is a pure function of what the user asked for (`Request`, from the
parsed flags and accelerate's environment) and what this process sees (`DeviceFacts`), so
every device (A100, H100, V100, T4, CPU, 1 or 4 ranks a node, under accelerate or torchrun)
is tested on a CPU with made-up facts. Its result, a frozen `RunPlan`, is logged (PLAN line),
saved in run_summary.json, and turned into the few `TrainingArguments` fields it owns
(`RunPlan.training_fields`); nothing changes those arguments afterwards. After the Trainer is
built, `qa_hpc.settings.effective` reads back what the objects really use and fails the run
when it differs from the plan.

Precision, highest priority first:
1. `--precision fp32|bf16|fp16`, or HF's `--bf16` / `--fp16` (both given: they must agree);
2. accelerate's mixed precision (`ACCELERATE_MIXED_PRECISION`, which `accelerate launch` sets
   from its config or `--mixed_precision`; `no` means fp32);
3. `auto`: bf16 on GPUs of compute capability >= 8.0 (Ampere+), fp16 on older GPUs, fp32 on CPU.
fp16 is refused on a CPU, bf16 on a GPU below compute capability 8.0 (torch only emulates it there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from qa_hpc.errors import UsageError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
ACCELERATE_PRECISION = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}  # accelerate's names -> ours
BF16_MIN_CAPABILITY = (8, 0)  # bf16 and TF32 tensor cores: Ampere and newer
MAX_AUTO_WORKERS = 4  # dataloader workers per rank on a GPU: collation overlaps the step
GPU_STOP_VOTE_EVERY = 10  # optimizer steps between preemption votes on GPUs (each vote syncs host and device)


class PlanError(UsageError):
    """A request this machine cannot honour; the message says what was asked, what was seen, and what to do."""


@dataclass(frozen=True)
class DeviceFacts:
    """What this process sees (read by qa_hpc.settings.devices.read_device_facts)."""

    cuda_available: bool
    gpu_count: int  # GPUs torch can use in this process
    capability: tuple[int, int] | None  # compute capability of this rank's GPU
    gpu_name: str | None
    cpus: int  # CPUs this process may run on (affinity mask, capped by SLURM_CPUS_PER_TASK)
    world_size: int
    local_world_size: int  # processes of this job on this node
    launcher: str  # torchrun | accelerate | python
    omp_num_threads: int | None  # OMP_NUM_THREADS as found in the environment
    accelerate_mixed_precision: str | None  # ACCELERATE_MIXED_PRECISION as found
    gpus_requested: str | None  # what asked for a GPU (CUDA_VISIBLE_DEVICES=..., SLURM_JOB_GPUS=...), if anything
    torch_version: str = ""
    torch_cuda: str | None = None  # torch.version.cuda: None for a CPU build


@dataclass(frozen=True)
class Request:
    """The settings the user asked for (flags and launcher environment), before any decision."""

    precision: str = "auto"  # --precision
    hf_bf16: bool = False  # --bf16
    hf_fp16: bool = False  # --fp16
    tf32: bool | None = None  # --tf32
    dataloader_num_workers: int = 0  # --dataloader_num_workers
    num_threads: int = 0  # --num_threads (0: decide)
    speed_defaults: bool = True  # --speed_defaults
    use_cpu: bool = False  # --use_cpu
    report_to: tuple[str, ...] = ()  # --report_to, as TrainingArguments normalised it
    logging_dir: str | None = None  # --logging_dir
    output_dir: str = "outputs/run_qa"
    profile: bool = False
    profile_dir: str | None = None


@dataclass(frozen=True)
class RunPlan:
    """The decided settings of one run. Frozen: logged, saved, then only read."""

    device: str  # cuda | cpu
    precision: str  # fp32 | bf16 | fp16
    precision_reason: str
    tf32: bool
    threads: int  # torch intra-op threads of this rank
    threads_reason: str
    dataloader_num_workers: int
    world_size: int
    local_world_size: int
    launcher: str
    stop_vote_every: int  # optimizer steps between preemption votes
    report_to: tuple[str, ...]  # HF integrations left to transformers (TensorBoard is ours)
    tensorboard: bool
    logging_dir: str | None  # None: <output_dir>/runs/<time>_<host>, named when the writer opens
    profile_dir: str | None  # None: profiling off
    gpu_name: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def use_cpu(self) -> bool:
        return self.device == "cpu"

    def training_fields(self, tf32_given: bool | None) -> dict[str, Any]:
        """The TrainingArguments fields this plan owns (and only these), for dataclasses.replace."""
        fields: dict[str, Any] = {
            "bf16": self.precision == "bf16",
            "fp16": self.precision == "fp16",
            "dataloader_num_workers": self.dataloader_num_workers,
            "use_cpu": self.use_cpu,
            "report_to": list(self.report_to),
        }
        # TrainingArguments rejects tf32=True off Ampere and leaves None alone: say it only where it means something
        fields["tf32"] = self.tf32 if self.device == "cuda" else tf32_given
        return fields

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """Variables of the launcher's environment that must agree with the plan before TrainingArguments is built.

        TrainingArguments takes ACCELERATE_MIXED_PRECISION (set by accelerate launch) as the mixed precision
        whenever --bf16/--fp16 are off, so an fp32 plan under `--mixed_precision bf16` would train in bf16.
        """
        if "ACCELERATE_MIXED_PRECISION" not in env:
            return {}
        return {"ACCELERATE_MIXED_PRECISION": {"fp32": "no"}.get(self.precision, self.precision)}

    def log_line(self) -> str:
        return (
            f"PLAN device={self.device}{f'({self.gpu_name})' if self.gpu_name else ''} precision={self.precision} "
            f"({self.precision_reason}) tf32={_on(self.tf32)} threads={self.threads} ({self.threads_reason}) "
            f"dataloader_workers={self.dataloader_num_workers} world_size={self.world_size} "
            f"local_world_size={self.local_world_size} launcher={self.launcher} "
            f"stop_vote_every={self.stop_vote_every} tensorboard={_on(self.tensorboard)} "
            f"profile={_on(self.profile_dir is not None)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def decide(request: Request, facts: DeviceFacts) -> RunPlan:
    """The whole plan; raises PlanError for a request this machine cannot honour."""
    device = _device(request, facts)
    capability = facts.capability if device == "cuda" else None
    precision, reason = decide_precision(request, device, capability, facts.accelerate_mixed_precision)
    threads, threads_reason = decide_threads(request, facts)
    report_to = tuple(r for r in request.report_to if r != "tensorboard")
    return RunPlan(
        device=device,
        precision=precision,
        precision_reason=reason,
        tf32=decide_tf32(request, device, capability),
        threads=threads,
        threads_reason=threads_reason,
        dataloader_num_workers=decide_workers(request, device, facts),
        world_size=facts.world_size,
        local_world_size=facts.local_world_size,
        launcher=facts.launcher,
        stop_vote_every=GPU_STOP_VOTE_EVERY if device == "cuda" and facts.world_size > 1 else 1,
        report_to=report_to,
        tensorboard="tensorboard" in request.report_to,
        logging_dir=request.logging_dir,
        profile_dir=(request.profile_dir or f"{request.output_dir}/profiler") if request.profile else None,
        gpu_name=facts.gpu_name if device == "cuda" else None,
    )


def require_visible_gpu(facts: DeviceFacts) -> None:
    """Refuse a job that asked for a GPU (Slurm --gres, CUDA_VISIBLE_DEVICES) whose torch sees none.

    Training such a job on the CPU would take days while its log looks like a GPU run.
    """
    if facts.gpus_requested and not facts.cuda_available:
        raise PlanError(
            f"this job asked for a GPU ({facts.gpus_requested}) but torch sees none: torch {facts.torch_version} "
            f"built for CUDA {facts.torch_cuda or 'none (a CPU-only build)'}, torch.cuda.is_available()=False. "
            "Install a CUDA build of torch that this node's driver supports (README: 'CUDA build'), or run on "
            "the CPU on purpose with --use_cpu (job_cpu.sh does)"
        )


def _device(request: Request, facts: DeviceFacts) -> str:
    """cuda or cpu; refuses a GPU job whose torch sees no GPU, and one process driving several GPUs."""
    if request.use_cpu:
        return "cpu"
    require_visible_gpu(facts)
    if not facts.cuda_available:
        return "cpu"
    if facts.gpu_count > 1 and facts.world_size == 1:
        raise PlanError(
            f"torch sees {facts.gpu_count} GPUs but this is a single process: transformers would wrap the model in "
            "nn.DataParallel (slower than DDP, and its token counts and MFU would be wrong). Start one process per "
            f"GPU: torchrun --nproc_per_node={facts.gpu_count} run_qa.py ... (or job_ddp.sh), or use one GPU with "
            "CUDA_VISIBLE_DEVICES=0"
        )
    return "cuda"


def decide_precision(
    request: Request, device: str, capability: tuple[int, int] | None, accelerate_env: str | None
) -> tuple[str, str]:
    """(precision, why) by the rules in the module docstring."""
    if request.precision not in PRECISIONS:
        raise PlanError(f"--precision {request.precision!r}: choose one of {', '.join(PRECISIONS)}")
    if request.hf_bf16 and request.hf_fp16:
        raise PlanError("--bf16 and --fp16 contradict each other; give one of them")
    hf = "bf16" if request.hf_bf16 else "fp16" if request.hf_fp16 else None
    if request.precision != "auto" and hf is not None and hf != request.precision:
        raise PlanError(f"--precision {request.precision} contradicts --{hf}; give one of them")
    if request.precision != "auto":
        precision, reason = request.precision, f"--precision {request.precision}"
    elif hf is not None:
        precision, reason = hf, f"--{hf}"
    elif accelerate_env is not None:
        if accelerate_env not in ACCELERATE_PRECISION:
            raise PlanError(
                f"ACCELERATE_MIXED_PRECISION={accelerate_env} (accelerate launch's mixed_precision) is not supported "
                f"here: use one of {', '.join(ACCELERATE_PRECISION)}"
            )
        precision, reason = ACCELERATE_PRECISION[accelerate_env], f"accelerate mixed_precision={accelerate_env}"
    elif device == "cuda":
        if capability is not None and capability >= BF16_MIN_CAPABILITY:
            precision, reason = "bf16", f"auto: GPU sm_{capability[0]}{capability[1]} has bf16"
        else:
            precision, reason = "fp16", f"auto: GPU {_sm(capability)} has no bf16"
    else:
        precision, reason = "fp32", "auto: CPU"
    _check_precision(precision, reason, device, capability)
    return precision, reason


def _sm(capability: tuple[int, int] | None) -> str:
    return f"sm_{capability[0]}{capability[1]}" if capability else "of unknown compute capability"


def _check_precision(precision: str, reason: str, device: str, capability: tuple[int, int] | None) -> None:
    if precision == "fp16" and device == "cpu":
        raise PlanError(
            f"fp16 ({reason}) is not supported on CPU: PyTorch has no fast fp16 CPU kernels and fp16 mixed "
            "precision needs a GPU grad scaler; use --precision bf16 (CPUs with AVX512-BF16/AMX) or fp32"
        )
    if precision == "bf16" and device == "cuda" and not (capability and capability >= BF16_MIN_CAPABILITY):
        raise PlanError(
            f"bf16 ({reason}) needs a GPU of compute capability 8.0 or newer (Ampere+); this one is {_sm(capability)}, "
            "where torch only emulates bf16 (slowly): use --precision fp16 or fp32"
        )


def decide_tf32(request: Request, device: str, capability: tuple[int, int] | None) -> bool:
    """TF32 matmuls for what still runs in fp32: asked, or by default on Ampere+ GPUs."""
    ampere = device == "cuda" and capability is not None and capability >= BF16_MIN_CAPABILITY
    if request.tf32 is True and not ampere:
        raise PlanError(f"--tf32 true needs a GPU of compute capability 8.0 or newer; this run is on {device}"
                        + (f" ({_sm(capability)})" if device == "cuda" else ""))
    if request.tf32 is not None:
        return request.tf32
    return request.speed_defaults and ampere


def decide_threads(request: Request, facts: DeviceFacts) -> tuple[int, str]:
    """Torch threads of this rank: asked for, else this rank's share of the CPUs it may run on."""
    if request.num_threads > 0:
        return request.num_threads, "--num_threads"
    # torchrun sets OMP_NUM_THREADS=1 for its workers when the user did not set it: that 1 is no choice
    torchrun_default = facts.launcher != "python" and facts.local_world_size > 1 and facts.omp_num_threads == 1
    if facts.omp_num_threads and not torchrun_default:
        return facts.omp_num_threads, "OMP_NUM_THREADS"
    share = max(1, facts.cpus // max(1, facts.local_world_size))
    return share, f"{facts.cpus} CPUs / {facts.local_world_size} process(es) on this node"


def decide_workers(request: Request, device: str, facts: DeviceFacts) -> int:
    """Dataloader workers: as asked; on a GPU by default some, so collation overlaps the step."""
    if request.dataloader_num_workers > 0 or not request.speed_defaults or device != "cuda":
        return request.dataloader_num_workers
    per_rank = facts.cpus // max(1, facts.local_world_size)
    return max(0, min(MAX_AUTO_WORKERS, per_rank - 1))
