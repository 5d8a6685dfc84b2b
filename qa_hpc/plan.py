"""What a run uses: decided once from the flags and what this process sees, then read back and checked.

`decide(flags, facts)` is pure, so every device is tested on a CPU with made-up `DeviceFacts`. The rules:
docs/REFERENCE.md, "Precision, TF32, threads and the batch across processes".
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from qa_hpc.device import CPU_BF16_FEATURES, TEST_MACHINE_VAR, DeviceFacts, read_device_facts
from qa_hpc.errors import EXIT_USAGE, UsageError

if TYPE_CHECKING:
    from transformers import Trainer

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
ACCELERATE_PRECISION = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}  # accelerate's names -> ours
BF16_MIN_CAPABILITY = (8, 0)  # bf16 and TF32 tensor cores: Ampere and newer
MAX_AUTO_WORKERS = 4  # dataloader workers per rank on a GPU: collation overlaps the step
GPU_STOP_VOTE_EVERY = 10  # optimizer steps between preemption votes on GPUs (each vote syncs host and device)
FlagValues = Mapping[str, Any]  # flag name -> parsed value (qa_hpc.flags.read_flags)
ON = {True: "on", False: "off"}  # a switch in log lines
LOG_NAMES = {
    "dataloader_num_workers": "dataloader_workers",
    "attn_implementation": "attn",
}  # short keys in log lines


class PlanError(UsageError):
    """A request this machine cannot honour; the message says what was asked, what was seen, and what to
    do."""


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
    dropout_mask: str = "torch"  # torch | bulk (qa_hpc.dropout)
    dropout_reason: str = "--dropout_mask torch"
    gpu_name: str | None = None

    def training_fields(self, tf32_given: bool | None) -> dict[str, object]:
        """The TrainingArguments fields this plan owns, and only these."""
        # TrainingArguments refuses tf32=True off Ampere and leaves None alone: say it only where it means
        # something
        return {
            "bf16": self.precision == "bf16",
            "fp16": self.precision == "fp16",
            "dataloader_num_workers": self.dataloader_num_workers,
            "use_cpu": self.device == "cpu",
            "report_to": list(self.report_to),
            "tf32": self.tf32 if self.device == "cuda" else tf32_given,
        }

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The launcher's variables that must say the plan's precision before TrainingArguments is built: it
        takes ACCELERATE_MIXED_PRECISION as the precision when --bf16/--fp16 are off (fp32 under accelerate's
        bf16: bf16)."""
        names = {ours: theirs for theirs, ours in ACCELERATE_PRECISION.items()}
        return (
            {"ACCELERATE_MIXED_PRECISION": names[self.precision]}
            if "ACCELERATE_MIXED_PRECISION" in env
            else {}
        )

    def log_line(self) -> str:
        return (
            f"PLAN device={self.device}{f'({self.gpu_name})' if self.gpu_name else ''} "
            f"precision={self.precision} ({self.precision_reason}) tf32={ON[self.tf32]} "
            f"threads={self.threads} ({self.threads_reason}) "
            f"dataloader_workers={self.dataloader_num_workers} world_size={self.world_size} local_world_size="
            f"{self.local_world_size} launcher={self.launcher} stop_vote_every={self.stop_vote_every} "
            f"tensorboard={ON[self.tensorboard]} profile={ON[self.profile_dir is not None]} "
            f"dropout_mask={self.dropout_mask} ({self.dropout_reason})"
        )


def _sm(capability: tuple[int, int] | None) -> str:
    return f"sm_{capability[0]}{capability[1]}" if capability else "of unknown compute capability"


def decide(flags: FlagValues, facts: DeviceFacts) -> RunPlan:
    """The whole plan from the parsed flags (by name) and this process's facts; PlanError for what it cannot
    honour."""
    if not flags["use_cpu"]:
        require_visible_gpu(facts)
    device = "cuda" if facts.cuda_available and not flags["use_cpu"] else "cpu"
    if device == "cuda" and facts.gpu_count > 1 and facts.world_size == 1:
        raise PlanError(
            f"torch sees {facts.gpu_count} GPUs but this is a single process: transformers would wrap "
            "the model in nn.DataParallel (slower than DDP, and its token counts and MFU would be wrong). "
            f"Start one process per GPU: torchrun --nproc_per_node={facts.gpu_count} run_qa.py ... (or "
            "job_ddp.sh), or use one GPU with CUDA_VISIBLE_DEVICES=0"
        )
    ampere = device == "cuda" and facts.capability is not None and facts.capability >= BF16_MIN_CAPABILITY
    precision, reason = decide_precision(flags, facts, device, ampere)
    if flags["tf32"] is True and not ampere:
        raise PlanError(
            f"--tf32 true needs a GPU of compute capability 8.0 or newer; this run is on {device}"
            + (f" ({_sm(facts.capability)})" if device == "cuda" else "")
        )
    tf32 = (
        flags["tf32"]
        if flags["tf32"] is not None
        else (flags["speed_defaults"] and ampere and flags["precision"] != "fp32")
    )
    workers, threads, threads_reason = decide_threads(flags, facts, device)
    # as TrainingArguments reads --report_to: a name, a list of names, or 'none'
    report_to = [flags["report_to"]] if isinstance(flags["report_to"], str) else flags["report_to"] or []
    report_to = [] if report_to == ["none"] else report_to
    dropout, dropout_reason = decide_dropout(flags["dropout_mask"], device, facts.cpu.vendor)
    return RunPlan(
        device=device,
        precision=precision,
        precision_reason=reason,
        tf32=tf32,
        threads=threads,
        threads_reason=threads_reason,
        dataloader_num_workers=workers,
        world_size=facts.world_size,
        local_world_size=facts.local_world_size,
        launcher=facts.launcher,
        stop_vote_every=GPU_STOP_VOTE_EVERY if device == "cuda" and facts.world_size > 1 else 1,
        report_to=tuple(r for r in report_to if r != "tensorboard"),
        tensorboard="tensorboard" in report_to,
        logging_dir=flags["logging_dir"],
        gpu_name=facts.gpu_name if device == "cuda" else None,
        profile_dir=(flags["profile_dir"] or f"{flags['output_dir']}/profiler") if flags["profile"] else None,
        dropout_mask=dropout,
        dropout_reason=dropout_reason,
    )


def decide_threads(flags: FlagValues, facts: DeviceFacts, device: str) -> tuple[int, int, str]:
    """(dataloader workers, torch threads, why those threads)."""
    share, omp = max(1, facts.cpus // max(1, facts.local_world_size)), facts.omp_num_threads
    workers = flags["dataloader_num_workers"]
    if workers <= 0 and flags["speed_defaults"] and device == "cuda":  # collation overlaps the step
        workers = max(0, min(MAX_AUTO_WORKERS, share - 1))
    if flags["num_threads"] > 0:
        return workers, flags["num_threads"], "--num_threads"
    # torchrun and accelerate launch export OMP_NUM_THREADS=1 when it was unset: a launcher's 1 is no choice
    if omp and not (omp == 1 and facts.launcher != "python"):
        return workers, omp, "OMP_NUM_THREADS"
    own_share = f"{facts.cpus} CPUs / {facts.local_world_size} process(es) on this node"  # less its workers
    return (
        workers,
        max(1, share - workers),
        own_share + (f" - {workers} dataloader workers" if workers else ""),
    )


def decide_dropout(asked: str, device: str, cpu_vendor: str) -> tuple[str, str]:
    """As asked, else bulk masks where torch's CPU bernoulli_ is serial (its parallel path is for Intel CPUs
    only)."""
    if asked != "auto":
        return asked, f"--dropout_mask {asked}"
    if device == "cpu" and cpu_vendor != "GenuineIntel":
        return "bulk", f"auto: {cpu_vendor} CPU, where torch draws masks one element at a time"
    return "torch", "auto: " + (
        "GPU" if device == "cuda" else "Intel CPU, where torch draws masks in parallel"
    )


def require_visible_gpu(facts: DeviceFacts) -> None:
    """Refuse a job that asked for a GPU whose torch sees none: on the CPU it would take days, logged as a GPU
    run."""
    if facts.gpus_requested and not facts.cuda_available:
        raise PlanError(
            f"this job asked for a GPU ({facts.gpus_requested}) but torch sees none: torch "
            f"{facts.torch_version} built for CUDA {facts.torch_cuda or 'none (a CPU-only build)'}, "
            "torch.cuda.is_available()=False. Install a CUDA build of torch that this node's driver "
            "supports (README: 'CUDA build'), or run on the CPU on purpose with --use_cpu (job_cpu.sh "
            "does)"
        )


def decide_precision(flags: FlagValues, facts: DeviceFacts, device: str, ampere: bool) -> tuple[str, str]:
    """(precision, why), first match wins: --precision or HF's --bf16/--fp16 (both given: they must agree),
    accelerate's mixed precision (`no` = fp32), auto; `ampere`: a GPU of compute capability >= 8.0."""
    asked, hf, mixed = (
        flags["precision"],
        [n for n in ("bf16", "fp16") if flags[n]],
        facts.accelerate_mixed_precision,
    )
    if len(hf) > 1:
        raise PlanError("--bf16 and --fp16 contradict each other; give one of them")
    if asked != "auto" and hf and hf[0] != asked:
        raise PlanError(f"--precision {asked} contradicts --{hf[0]}; give one of them")
    if asked != "auto":
        precision, reason = asked, f"--precision {asked}"
    elif hf:
        precision, reason = hf[0], f"--{hf[0]}"
    elif mixed in ACCELERATE_PRECISION:
        precision, reason = ACCELERATE_PRECISION[mixed], f"accelerate mixed_precision={mixed}"
    elif mixed is not None:
        raise PlanError(
            f"ACCELERATE_MIXED_PRECISION={mixed} (accelerate launch's mixed_precision) is not "
            f"supported here: use one of {', '.join(ACCELERATE_PRECISION)}"
        )
    elif device == "cpu":  # auto: bf16 where the CPU does it in hardware (AVX512-BF16/AMX), else fp32
        precision = "bf16" if facts.cpu.bf16 else "fp32"
        reason = f"auto: CPU has {facts.cpu.bf16 or 'no ' + ' or '.join(CPU_BF16_FEATURES)}"
        if facts.cpu.source == TEST_MACHINE_VAR:  # a test's made-up CPU must never pass for a real one
            reason += f", as {TEST_MACHINE_VAR} says"
    else:  # auto on a GPU: bf16 where its tensor cores do it, else fp16
        precision = "bf16" if ampere else "fp16"
        reason = f"auto: GPU {_sm(facts.capability)} has {'' if ampere else 'no '}bf16"
    if precision == "fp16" and device == "cpu":
        raise PlanError(
            f"fp16 ({reason}) is not supported on CPU: PyTorch has no fast fp16 CPU kernels and fp16 "
            "mixed precision needs a GPU grad scaler; use --precision bf16 (CPUs with AVX512-BF16/AMX) "
            "or fp32"
        )
    if precision == "bf16" and device == "cuda" and not ampere:
        raise PlanError(
            f"bf16 ({reason}) needs a GPU of compute capability 8.0 or newer (Ampere+); this one is "
            f"{_sm(facts.capability)}, where torch only emulates bf16 (slowly): use --precision fp16 or "
            "fp32"
        )
    return precision, reason


# --- what this process sees: the impure half ---------------------------------------------------------------
# --- what the objects really use ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Effective:
    precision: str  # the accelerator's mixed precision: what autocast runs in
    tf32: bool
    param_dtype: str  # the master weights: float32 always
    threads: int
    dataloader_num_workers: int
    world_size: int
    device: str
    device_name: str
    optim: str
    attn_implementation: str
    torch_compile: bool
    postprocess: str
    dropout_mask: str

    @classmethod
    def read(cls, trainer: Trainer, postprocess: str) -> Effective:
        """What the Trainer, its accelerator, the model and torch are set to now."""
        # imported here, not at the top: qa_hpc.dropout imports transformers' attention (~2 s), which the
        # job and bench scripts' `python -m qa_hpc.plan --gpu-count` and `--machine` never need
        from qa_hpc.dropout import BulkDropout

        args, mixed = trainer.args, str(trainer.accelerator.mixed_precision)
        return cls(
            precision=ACCELERATE_PRECISION.get(mixed, mixed),
            tf32=torch.backends.cuda.matmul.fp32_precision == "tf32",
            param_dtype=str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
            threads=torch.get_num_threads(),
            dataloader_num_workers=int(args.dataloader_num_workers),
            world_size=int(args.world_size),
            device=args.device.type,
            optim=str(args.optim.value),
            device_name=torch.cuda.get_device_name(args.device)
            if args.device.type == "cuda"
            else args.device.type,
            attn_implementation=str(getattr(trainer.model.config, "_attn_implementation", None) or "default"),
            torch_compile=bool(args.torch_compile),
            postprocess=postprocess,
            dropout_mask="bulk"
            if any(isinstance(m, BulkDropout) for m in trainer.model.modules())
            else "torch",
        )

    def log_line(self, rank: int) -> str:
        """One line per rank (threads and devices can differ between nodes): every field, in order."""
        shown = {**asdict(self), "tf32": ON[self.tf32], "device_name": self.device_name.replace(" ", "_")}
        return " ".join([f"EFFECTIVE rank={rank}", *(f"{LOG_NAMES.get(k, k)}={v}" for k, v in shown.items())])

    def check(self, plan: RunPlan) -> None:
        """Stop the run when it would not use the plan (fp32 master weights always), naming every
        difference."""
        wanted = {**asdict(plan), "param_dtype": "float32"}  # the fields both have, by name
        diff = [
            f"{key}: planned {wanted[key]}, effective {got}"
            for key, got in asdict(self).items()
            if key in wanted and got != wanted[key]
        ]
        if diff:
            raise RuntimeError("the run would not use the planned settings: " + "; ".join(diff))


def main(argv: list[str]) -> int:
    """`python -m qa_hpc.plan --gpu-count`: the GPUs job_ddp.sh starts a process for (exit 2: asked for, none
    seen); `--machine`: the one MACHINE line bench scripts keep with every result (spaces in names as _)."""
    facts = read_device_facts()
    if argv == ["--machine"]:  # the CPU as run_summary.json records it, the GPU, torch
        print(facts.machine_line())
        return 0
    try:
        require_visible_gpu(facts)
    except PlanError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(facts.gpu_count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
