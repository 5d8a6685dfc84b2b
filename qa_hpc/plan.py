"""What a run uses: decided once from the flags and what this process sees, then read back and checked.

`decide(flags, facts)` is pure, so every device is tested on a CPU with made-up `DeviceFacts`. The rules:
docs/REFERENCE.md, "Precision, TF32, threads and the batch across processes".
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from accelerate.utils import DynamoBackend

from qa_hpc import attention
from qa_hpc.batching import DEFAULT_BUCKETS, default_buckets, parse_buckets
from qa_hpc.device import CPU_BF16_FEATURES, CpuFacts, DeviceFacts, read_device_facts
from qa_hpc.errors import EXIT_USAGE, UsageError
from qa_hpc.outputs import PROFILER_DIR

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPILE_SHAPES = ("auto", "static", "dynamic")  # --compile_shapes
COMPILE_SCOPES = ("model", "regions")  # --compile_scope
ACCELERATE_PRECISION = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}  # accelerate's names -> ours
BF16_MIN_CAPABILITY = (8, 0)  # bf16 and TF32 tensor cores: Ampere and newer
MAX_AUTO_WORKERS = 4  # dataloader workers per rank on a GPU: collation overlaps the step
# torch >= 2.10 runs cuDNN's attention first on these compute capabilities' majors, with cuDNN newer than
# 9.15.0 (check_prefer_cudnn_attention in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp); builds for
# CUDA < 13 only at minor 0 and 3. cuDNN builds an execution plan for every new input shape.
CUDNN_FIRST_TORCH = (2, 10)
CUDNN_FIRST_MAJORS = (9, 10)
CUDNN_FIRST_AFTER = 91500  # torch.backends.cudnn.version() of cuDNN 9.15.0
CUDNN_FIRST_MINORS_BEFORE_CUDA_13 = (0, 3)
NO_CUDNN_ATTENTION = "flash,efficient,math"
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that record CUDA graphs
# what compiling paid where it is the default (one GPU process, buckets, CUDA graphs, one graph compiled):
# bench/results/2026-11-28_h200_gpu_speed/, bert-base's shape at batch 24, MiniLM's accuracy kept
AUTO_COMPILE_MEASURED = "one H200: 14.5 ms a step against 44 eager, ~130 s to compile; 1.39x over 2 epochs"
# the training batches (forward and backward passes) per process from which that compile is won back, cold
# caches, same sitting and records: bert-base's shape 130 s / (44.2 - 14.5 ms) = ~4,400; MiniLM's recipe 72 s
# / (29.6 - 9.7 ms) = ~3,600, its 752 batches 137 s compiled against 68 s eager. bert-base's 2 epochs of
# SQuAD at batch 24 are 7,377
COMPILE_PAYS_FROM_BATCHES = 4000
# the GPUs (compute capability major) and precision the compiled default was measured on: one H200, bf16
# (docs/PERFORMANCE.md); a default elsewhere waits for a measurement there
COMPILE_MEASURED_ON = (9, "bf16")
# why a plan decided before the training data was read has the compile off: decided again once it is counted
COMPILE_AWAITS_COUNT = "auto: decided once the training batches are counted"
GPU_STOP_VOTE_EVERY = 10  # optimizer steps between preemption votes on GPUs (each vote syncs host and device)
FlagValues = Mapping[str, Any]  # flag name -> parsed value (qa_hpc.flags.read_flags)
ON = {True: "on", False: "off"}  # a switch in log lines
# short keys in log lines
LOG_NAMES = {"dataloader_num_workers": "dataloader_workers", "attn_implementation": "attn"}


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
    workers_reason: str = ""  # none: not decided (a CPU's 0)
    pad_to_buckets: tuple[int, ...] = ()  # widths batches are padded to (qa_hpc.batching); () = off
    pad_to_buckets_reason: str = ""
    attn_backend: str = attention.ALL  # SDPA kernels enabled (qa_hpc.attention)
    attn_backend_reason: str = "--attn_backend all"
    torch_compile: bool = False
    compile_backend: str | None = None
    compile_mode: str | None = None
    compile_dynamic: bool | None = None  # None: torch's automatic dynamic shapes
    recompile_limit: int | None = None  # None: torch's own
    compile_scope: str | None = None  # model | regions; None: compile off
    compile_cache_dir: str | None = None  # inductor's and Triton's caches; None: compile off
    compile_reason: str = "no --torch_compile"
    cuda_graphs: bool = False
    cuda_graphs_reason: str = "no --torch_compile"
    persistent_workers: bool = False  # dataloader workers kept from one epoch (and evaluation) to the next
    persistent_workers_reason: str = "no dataloader workers"
    # where --logging_nan_inf_filter runs: "device" (trainer_qa, no host sync) or "off"
    loss_filter: str = "device"
    loss_filter_reason: str = "--logging_nan_inf_filter true"

    def training_fields(self, tf32_given: bool | None) -> dict[str, object]:
        """The TrainingArguments fields this plan owns, and only these."""
        # TrainingArguments refuses tf32=True off Ampere and leaves None alone: say it only where it means
        # something
        return {
            "bf16": self.precision == "bf16",
            "fp16": self.precision == "fp16",
            "dataloader_num_workers": self.dataloader_num_workers,
            "dataloader_persistent_workers": self.persistent_workers,
            "use_cpu": self.device == "cpu",
            "report_to": list(self.report_to),
            "tf32": self.tf32 if self.device == "cuda" else tf32_given,
            "torch_compile": self.torch_compile,
            "torch_compile_backend": self.compile_backend,
            "torch_compile_mode": self.compile_mode,
            # the Trainer's own check bool()s every step's loss, a host-device sync on a GPU; the same rule
            # runs on the device in QuestionAnsweringTrainer.training_step (self.loss_filter)
            "logging_nan_inf_filter": False,
        }

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """Variables the Trainer and torch read that must say the plan's settings before TrainingArguments
        is built and anything is compiled: ACCELERATE_MIXED_PRECISION, which the Trainer takes as the
        precision when --bf16/--fp16 are off (fp32 under accelerate's bf16: bf16);
        ACCELERATE_DYNAMO_USE_DYNAMIC and ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION, the one way
        transformers 5.23 lets torch.compile's `dynamic` and accelerate's regional compilation reach its
        TorchDynamoPlugin; TORCHINDUCTOR_CACHE_DIR, the caches' folder (Triton's inside it)."""
        names = {ours: theirs for theirs, ours in ACCELERATE_PRECISION.items()}
        variables = {}
        if "ACCELERATE_MIXED_PRECISION" in env:
            variables["ACCELERATE_MIXED_PRECISION"] = names[self.precision]
        if self.compile_dynamic is not None:
            variables["ACCELERATE_DYNAMO_USE_DYNAMIC"] = str(self.compile_dynamic).lower()
        if self.torch_compile:
            regions = self.compile_scope == "regions"
            variables["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = str(regions).lower()
            if self.compile_cache_dir is not None:  # None: a plan decided without the caller's folder
                variables["TORCHINDUCTOR_CACHE_DIR"] = self.compile_cache_dir
        return variables

    @property
    def awaits_batch_count(self) -> bool:
        """Decided before the training batches were counted, with the compile, which waits for them, off."""
        return self.compile_reason == COMPILE_AWAITS_COUNT

    def log_line(self) -> str:
        gpu = f"({self.gpu_name})" if self.gpu_name else ""
        return (
            f"PLAN device={self.device}{gpu} precision={self.precision} ({self.precision_reason}) "
            f"tf32={ON[self.tf32]} threads={self.threads} ({self.threads_reason}) "
            f"dataloader_workers={self.dataloader_num_workers}{self.workers_shown()} "
            f"world_size={self.world_size} local_world_size={self.local_world_size} launcher={self.launcher} "
            f"stop_vote_every={self.stop_vote_every} tensorboard={ON[self.tensorboard]} "
            f"profile={ON[self.profile_dir is not None]} "
            f"dropout_mask={self.dropout_mask} ({self.dropout_reason}) "
            f"pad_to_buckets={self.buckets_shown()} "
            f"attn_backend={self.attn_backend} ({self.attn_backend_reason}) "
            f"compile={self.compile_shown()} "
            f"cuda_graphs={ON[self.cuda_graphs]} ({self.cuda_graphs_reason}) "
            f"persistent_workers={ON[self.persistent_workers]} ({self.persistent_workers_reason}) "
            f"loss_filter={self.loss_filter} ({self.loss_filter_reason})"
        )

    def workers_shown(self) -> str:
        return f" ({self.workers_reason})" if self.workers_reason else ""

    def buckets_shown(self) -> str:
        widths = ",".join(map(str, self.pad_to_buckets)) or "off"
        return f"{widths} ({self.pad_to_buckets_reason})" if self.pad_to_buckets_reason else widths

    def compile_shown(self) -> str:
        if not self.torch_compile:
            return f"off ({self.compile_reason})"
        return (
            f"on (backend={self.compile_backend} mode={self.compile_mode} dynamic="
            f"{'auto' if self.compile_dynamic is None else self.compile_dynamic} recompile_limit="
            f"{self.recompile_limit or 'torch'} scope={self.compile_scope} cache={self.compile_cache_dir}: "
            f"{self.compile_reason})"
        )


def _sm(capability: tuple[int, int] | None) -> str:
    return f"sm_{capability[0]}{capability[1]}" if capability else "of unknown compute capability"


def decide(flags: FlagValues, facts: DeviceFacts, train_batches: int | None = None) -> RunPlan:
    """The whole plan from the parsed flags (by name) and this process's facts; PlanError for what it cannot
    honour. `train_batches`: the batches this process trains, once its training data is counted; a plan whose
    compile waits for them (RunPlan.awaits_batch_count) is decided again then."""
    refuse_outside_the_plan(flags)
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
    if device == "cuda" and facts.local_world_size > facts.gpu_count:
        raise PlanError(
            f"{facts.local_world_size} processes on this node, but torch sees {facts.gpu_count} GPU"
            f"{'s' if facts.gpu_count > 1 else ''}: two ranks on one GPU stop NCCL once the model is built. "
            f"Start one process per GPU (--nproc_per_node={facts.gpu_count}), or --use_cpu"
        )
    ampere = device == "cuda" and facts.capability is not None and facts.capability >= BF16_MIN_CAPABILITY
    precision, reason = decide_precision(flags, facts, device, ampere)
    if flags["tf32"] is True and not ampere:
        raise PlanError(
            f"--tf32 true needs a GPU of compute capability 8.0 or newer; this run is on {device}"
            + (f" ({_sm(facts.capability)})" if device == "cuda" else "")
        )
    if flags["tf32"] is not None:
        tf32 = flags["tf32"]
    else:  # a speed default where the tensor cores do it; --precision fp32 is true fp32
        tf32 = flags["speed_defaults"] and ampere and flags["precision"] != "fp32"
    workers, workers_reason = decide_workers(flags, facts, device)
    persistent, persistent_reason = decide_persistent_workers(flags, workers)
    loss_filter, loss_filter_reason = decide_loss_filter(flags)
    threads, threads_reason = decide_threads(flags, facts, workers)
    # as TrainingArguments reads --report_to: a name, a list of names, or 'none'
    report_to = [flags["report_to"]] if isinstance(flags["report_to"], str) else flags["report_to"] or []
    report_to = [] if report_to == ["none"] else report_to
    if "all" in report_to:  # as transformers reads it: every integration installed, TensorBoard among them
        from transformers.integrations import get_available_reporting_integrations

        report_to = get_available_reporting_integrations()
    compiling, compiling_reason = decide_compiling(flags, device, facts, precision, train_batches)
    buckets, buckets_reason = decide_buckets(flags, graphs_ahead(flags, compiling, device, facts.world_size))
    # a pass over a split has at most this many batch shapes (each width, and a short last batch); None: any
    shapes_per_pass = len(buckets or [flags["max_seq_length"]]) + 1
    fixed_shapes = shapes_per_pass if buckets or flags["pad_to_max_length"] else None
    attn_backend, attn_reason = decide_attn_backend(flags, facts, device, precision, fixed_shapes is not None)
    compiled = decide_compile(flags, device, facts.world_size, fixed_shapes, (compiling, compiling_reason))
    dropout, dropout_reason = decide_dropout(
        flags["dropout_mask"], device, facts.cpu, compiled.torch_compile, flags["attn_implementation"]
    )
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
        profile_dir=_profile_dir(flags),
        dropout_mask=dropout,
        dropout_reason=dropout_reason,
        workers_reason=workers_reason,
        pad_to_buckets=buckets,
        pad_to_buckets_reason=buckets_reason,
        attn_backend=attn_backend,
        attn_backend_reason=attn_reason,
        **compiled._asdict(),
        persistent_workers=persistent,
        persistent_workers_reason=persistent_reason,
        loss_filter=loss_filter,
        loss_filter_reason=loss_filter_reason,
    )


def _cpu_share(facts: DeviceFacts) -> tuple[int, str]:
    """(the CPUs of this node that are this process's, how they were counted, for the PLAN line): its
    launcher's CPUs over the processes on the node, and no more than the CPUs it may run on (a launcher that
    binds each process to CPUs of its own, torchrun --numa-binding, has already shared them out: they are not
    divided again)."""
    node = facts.launcher_cpus or facts.cpus
    even = node // max(1, facts.local_world_size)
    quota = " (a cgroup CPU quota's)" if node == facts.cpu_quota else ""
    counted = f"{node} CPUs{quota} / {facts.local_world_size} process(es) on this node"
    if facts.cpus < even:
        return max(1, facts.cpus), f"{counted}, at most the {facts.cpus} this process is bound to"
    return max(1, even), counted


def decide_workers(flags: FlagValues, facts: DeviceFacts, device: str) -> tuple[int, str]:
    """(dataloader workers per process, why): as given (0 included); else on a GPU, under --speed_defaults, up
    to MAX_AUTO_WORKERS, one CPU of the process's share kept for it; else 0 (on a CPU, with no reason: nothing
    was decided)."""
    given = flags["dataloader_num_workers"]
    if given is not None:
        return given, f"--dataloader_num_workers {given}"
    if device == "cpu":  # collation in the training process, every core to torch's threads
        return 0, ""
    if not flags["speed_defaults"]:
        return 0, "--speed_defaults false"
    share = _cpu_share(facts)[0]
    workers = max(0, min(MAX_AUTO_WORKERS, share - 1))
    # measured on one H200 (docs/PERFORMANCE.md, "On a GPU: the measurement"): 0 workers took the 2-epoch
    # projection to 0.76x of 4 workers' (collation then runs on the main thread, between the steps)
    reason = f"collation beside the step, up to {MAX_AUTO_WORKERS} per process; 0 measured 0.76x on one H200"
    if workers == 0:
        reason = f"no CPU to spare beside the process's own ({share} CPU per process)"
    return workers, f"auto: GPU: {reason}"


def decide_persistent_workers(flags: FlagValues, workers: int) -> tuple[bool, str]:
    """(dataloader workers kept across epochs and evaluations, why): as given; else on wherever there are
    workers. Each pass would otherwise fork new workers while the last pass's queue threads end, and a fork
    that meets a thread ending deadlocks its child on CPython releases before the fix of gh-112275 (3.11.7:
    seen as a rank waiting forever for a batch)."""
    given = flags["dataloader_persistent_workers"]
    if given and workers == 0:  # torch's DataLoader would refuse it at the first batch
        raise PlanError(
            "--dataloader_persistent_workers true needs dataloader workers: give --dataloader_num_workers N "
            "(N > 0; this run has none)"
        )
    if given is not None:
        return given, f"--dataloader_persistent_workers {str(given).lower()}"
    if workers == 0:
        return False, "no dataloader workers"
    return True, "auto: workers forked once per split, not once per pass"


def decide_loss_filter(flags: FlagValues) -> tuple[str, str]:
    """(where --logging_nan_inf_filter's rule runs, why): on the device (QuestionAnsweringTrainer) when the
    flag is on, else off; never in the Trainer's own check, which waits for every step's loss."""
    given = flags["logging_nan_inf_filter"]
    return "device" if given else "off", f"--logging_nan_inf_filter {str(given).lower()}"


def decide_threads(flags: FlagValues, facts: DeviceFacts, workers: int) -> tuple[int, str]:
    """(torch threads, why), beside `workers` dataloader workers."""
    omp = facts.omp_num_threads
    if flags["num_threads"] > 0:
        return flags["num_threads"], "--num_threads"
    # torchrun and accelerate launch export OMP_NUM_THREADS=1 when it was unset: a launcher's 1 is no choice
    if omp and not (omp == 1 and facts.launcher != "python"):
        return omp, "OMP_NUM_THREADS"
    share, counted = _cpu_share(facts)
    return (
        max(1, share - workers),
        counted + (f" - {workers} dataloader workers" if workers else ""),
    )


def decide_buckets(flags: FlagValues, graphs_ahead: bool) -> tuple[tuple[int, ...], str]:
    """(the widths batches are padded to, why); () when off. 'auto': on where the run would record CUDA graphs
    (`graphs_ahead`), which pay over a few fixed shapes; off elsewhere (the extra padding costs more than the
    fixed shapes save in an eager run: 0.97x on one H200). A bad list is a usage error."""
    asked = flags["pad_to_buckets"]
    length = flags["max_seq_length"]
    defaults = f"{DEFAULT_BUCKETS} widths from {length}/3 to {length}"  # what 'on' pads to
    if asked == "auto":
        if not graphs_ahead:
            return (), ""
        return default_buckets(length), f"auto: CUDA graphs, one per shape: {defaults}"
    try:
        widths = parse_buckets(asked, length)
    except ValueError as err:
        raise PlanError(str(err)) from err
    if widths and flags["pad_to_max_length"]:
        raise PlanError(
            f"--pad_to_buckets {asked} contradicts --pad_to_max_length (every feature padded to "
            "--max_seq_length); give one of them"
        )
    if asked == "on":
        return widths, f"on: {defaults}, multiples of 8"
    return widths, ""


def _version(text: str | None) -> tuple[int, ...]:
    """'2.13.0+cu130' -> (2, 13); None or no digits -> ()."""
    return tuple(int(part) for part in re.findall(r"\d+", text or "")[:2])


def torch_runs_cudnn_attention_first(facts: DeviceFacts) -> bool:
    """Whether this torch, GPU and cuDNN put cuDNN's attention first in SDPA's priority order (the rule of
    check_prefer_cudnn_attention; see CUDNN_FIRST_TORCH)."""
    if facts.capability is None or facts.cudnn_version is None:
        return False
    major, minor = facts.capability
    if _version(facts.torch_version) < CUDNN_FIRST_TORCH or major not in CUDNN_FIRST_MAJORS:
        return False
    if facts.cudnn_version <= CUDNN_FIRST_AFTER:
        return False
    return _version(facts.torch_cuda) >= (13,) or minor in CUDNN_FIRST_MINORS_BEFORE_CUDA_13


def decide_attn_backend(
    flags: FlagValues, facts: DeviceFacts, device: str, precision: str, shapes_fixed: bool
) -> tuple[str, str]:
    """(the SDPA kernels that may run, why): --attn_implementation other than sdpa wins (no SDPA), then
    --attn_backend all or a list, then auto: on a GPU where torch would run cuDNN's attention first,
    everything but cuDNN while batch shapes vary; elsewhere torch's own choice."""
    implementation = flags["attn_implementation"]
    asked = flags["attn_backend"]
    if names_other_attention(implementation):
        refuse_unusable_attention(implementation, device, precision, facts)
        return attention.NOT_SDPA, f"--attn_implementation {implementation}: no SDPA"
    if asked == attention.ALL:
        return attention.ALL, "--attn_backend all: torch's own choice"
    if asked != "auto":
        try:
            kernels = attention.parse(asked)
        except ValueError as err:
            raise PlanError(str(err)) from err
        if device == "cpu" and not set(kernels) & set(attention.CPU_KERNELS):
            raise PlanError(
                f"--attn_backend {asked}: a CPU has only the {' and '.join(attention.CPU_KERNELS)} SDPA "
                "kernels; name one of them"
            )
        return attention.name_of(kernels), f"--attn_backend {asked}"
    if device == "cpu":
        return attention.ALL, "auto: CPU: torch's own choice (flash or math)"
    torch_version = ".".join(map(str, _version(facts.torch_version)))
    if not torch_runs_cudnn_attention_first(facts):
        return attention.ALL, f"auto: torch {torch_version} does not run cuDNN attention first here"
    if shapes_fixed:
        return attention.ALL, "auto: batch shapes fixed: cuDNN plans each shape once"
    # measured on one H200 (docs/PERFORMANCE.md): 1.28x the median step, ~1.5x the whole run
    return NO_CUDNN_ATTENTION, (
        f"auto: torch {torch_version} runs cuDNN attention first on {_sm(facts.capability)} (cuDNN "
        f"{facts.cudnn_version}) and it plans every new batch shape; shapes vary: cuDNN off"
    )


class CompileDecision(NamedTuple):
    """The RunPlan fields of torch.compile and CUDA graphs; by default, compile off."""

    torch_compile: bool = False
    compile_backend: str | None = None
    compile_mode: str | None = None
    compile_dynamic: bool | None = None
    recompile_limit: int | None = None
    compile_scope: str | None = None
    compile_cache_dir: str | None = None
    compile_reason: str = "no --torch_compile"
    cuda_graphs: bool = False
    cuda_graphs_reason: str = "no --torch_compile"


def decide_after_compile_failed(flags: FlagValues, facts: DeviceFacts, backend: str | None) -> RunPlan:
    """The plan of a run whose compiler failed here: the eager plan, as with --torch_compile false, so that
    what was decided for the compile goes with it (the buckets `--pad_to_buckets auto` chose for CUDA graphs:
    eager over them measured 0.97x on one H200; the attention kernels for fixed shapes), saying why."""
    eager = decide(
        {**flags, "torch_compile": False, "torch_compile_backend": None, "torch_compile_mode": None}, facts
    )
    why = f"fallback=eager: --torch_compile_backend {backend} failed here"
    return replace(eager, compile_reason=why, cuda_graphs_reason="fallback=eager")


def compile_modes() -> list[str]:
    """torch.compile's modes, as its documentation says to list them (private: qa_hpc/private_api.py)."""
    from torch._inductor import list_mode_options

    return list(list_mode_options())


def _profile_dir(flags: FlagValues) -> str | None:
    """Where the profiler writes; None with --profile off, or with no training: it records training steps."""
    if not (flags["profile"] and flags["do_train"]):
        return None
    return flags["profile_dir"] or f"{flags['output_dir']}/{PROFILER_DIR}"


def decide_compiling(
    flags: FlagValues, device: str, facts: DeviceFacts, precision: str, train_batches: int | None
) -> tuple[bool, str]:
    """(torch.compile on, why): as asked (--torch_compile, or a backend or mode given, which turn it on as in
    TrainingArguments); not asked, on where it was measured to pay: training in one process on a GPU of the
    kind it was measured on (COMPILE_MEASURED_ON) under --speed_defaults, over buckets (--pad_to_buckets auto
    or given), for at least COMPILE_PAYS_FROM_BATCHES batches. Off elsewhere: a CPU, several processes (DDP's
    all-reduce between graphs: not measured), other GPUs or precisions (not measured), no training, shapes
    that vary (compile alone: 0.90x on one H200), fewer batches; where only the count is left to decide, off
    until it is known (train_batches None: COMPILE_AWAITS_COUNT)."""
    given = flags["torch_compile"]
    backend, mode = flags["torch_compile_backend"], flags["torch_compile_mode"]
    if mode and mode not in (modes := compile_modes()):  # torch.compile's error fell back to eager
        raise PlanError(f"--torch_compile_mode {mode}: give one of {', '.join(modes)}")
    if given is False and (backend or mode):  # TrainingArguments would compile, the false unsaid
        named = f"--torch_compile_backend {backend}" if backend else f"--torch_compile_mode {mode}"
        raise PlanError(f"--torch_compile false contradicts {named}, which compiles; give one of them")
    if given is not None or backend or mode:
        on = bool(given or backend or mode)
        return on, "" if on else "--torch_compile false"
    if device == "cpu":
        return False, "auto: CPU: eager"
    if not flags["speed_defaults"]:
        return False, "auto: --speed_defaults false"
    if facts.world_size > 1:
        return False, f"auto: {facts.world_size} processes: measured on one GPU only"
    if flags["dropout_mask"] == "bulk":  # drawn between the graphs, the masks would break them into many
        return False, "auto: --dropout_mask bulk, which a compile cannot take"
    if (accumulation := flags["gradient_accumulation_steps"]) > 1:  # measured with CUDA graphs (see below)
        return False, f"auto: --gradient_accumulation_steps {accumulation}: {GRAPHS_OVERWRITE_GRADIENTS}"
    major, measured_precision = COMPILE_MEASURED_ON
    if facts.capability is None or facts.capability[0] != major or precision != measured_precision:
        return False, (
            f"auto: GPU {_sm(facts.capability)} in {precision}: measured on sm_{major}x in "
            f"{measured_precision} only; --torch_compile to compile here"
        )
    if not flags["do_train"]:  # evaluation runs the plain model after training; alone, its compile is a loss
        return False, "auto: no --do_train: the compile pays over training steps"
    if flags["pad_to_max_length"] or flags["pad_to_buckets"] == "off":
        given_shapes = "--pad_to_max_length" if flags["pad_to_max_length"] else "--pad_to_buckets off"
        return False, f"auto: {given_shapes}: measured over buckets only"
    if train_batches is None:
        return False, COMPILE_AWAITS_COUNT
    if train_batches < COMPILE_PAYS_FROM_BATCHES:
        return False, (
            f"auto: {train_batches} training batches, fewer than the {COMPILE_PAYS_FROM_BATCHES} over which "
            f"the compile is won back ({AUTO_COMPILE_MEASURED}); --torch_compile to compile anyway"
        )
    return True, f"auto: one GPU process, {train_batches} training batches: {AUTO_COMPILE_MEASURED}"


def graphs_ahead(flags: FlagValues, compiling: bool, device: str, world_size: int) -> bool:
    """Whether this run, compiled, would record CUDA graphs once buckets fix its shapes (_cuda_graphs' rule
    over any number of fixed shapes); never beside --pad_to_max_length, which fixes them itself."""
    if not compiling or flags["pad_to_max_length"]:
        return False
    backend = flags["torch_compile_backend"] or "inductor"
    mode = flags["torch_compile_mode"]
    accumulation = flags["gradient_accumulation_steps"]
    graphs, _ = _cuda_graphs(mode, backend, device, world_size, DEFAULT_BUCKETS + 1, accumulation)
    return graphs


def decide_compile(
    flags: FlagValues,
    device: str,
    world_size: int,
    fixed_shapes: int | None,
    compiling: tuple[bool, str],
) -> CompileDecision:
    """torch.compile as `compiling` (decide_compiling) says, through the Trainer's own flags; CUDA graphs
    where they pay: on a GPU, with inductor, over fixed shapes, in one process; under inductor's one graph
    with symbolic sizes (each shape is recorded as its own CUDA graph anyway), else static over fixed batch
    shapes with room for all of them (--compile_shapes says otherwise; dynamo's cudagraphs backend records
    from static graphs only); the whole model or its regions
    (--compile_scope), its caches in flags["compile_cache_dir"] (resolved by the caller: it reads the
    environment). `fixed_shapes`: per pass over a split; None when they vary."""
    on, why = compiling
    if not on:
        return CompileDecision(compile_reason=why, cuda_graphs_reason=why)
    backend = flags["torch_compile_backend"] or "inductor"
    known = [name.value.lower() for name in DynamoBackend if name is not DynamoBackend.NO]
    if backend not in known:
        raise PlanError(
            f"--torch_compile_backend {backend}: not a backend the Trainer's torch.compile path takes; "
            f"one of {', '.join(known)}"
        )
    mode = flags["torch_compile_mode"]
    shapes = flags["compile_shapes"]
    accumulation = flags["gradient_accumulation_steps"]
    if mode not in (None, "default") and backend != "inductor":  # torch.compile's error fell back to eager
        raise PlanError(
            f"--torch_compile_mode {mode} is inductor's; --torch_compile_backend {backend} takes no mode: "
            "leave the mode out"
        )
    graphs, graphs_reason = _cuda_graphs(mode, backend, device, world_size, fixed_shapes, accumulation)
    dynamic, limit = None, None  # torch's own: a shape that recompiles makes its sizes dynamic
    over = f" over {fixed_shapes} batch shapes per pass" if fixed_shapes else ""
    # Dynamo's cudagraphs backend keys its recordings on the integer sizes of the inputs it compiled for
    # (torch 2.11's cudagraph_trees.cudagraphify_impl). Symbolic sizes are no integers: one recording for
    # every shape, whose replay fails at the first batch of another width (pytorch/pytorch#131009).
    # Inductor records at the first real call, per shape. So this backend gets one static graph per shape.
    static_only = graphs and backend == "cudagraphs"
    if static_only and (shapes == "dynamic" or fixed_shapes is None):
        raise PlanError(
            "--torch_compile_backend cudagraphs replays one CUDA graph for every batch shape of a graph "
            "with symbolic sizes, which fails at the next width: it needs fixed batch shapes "
            "(--pad_to_buckets on or --pad_to_max_length) and --compile_shapes static or auto"
        )
    if shapes == "dynamic":
        # compiled once, whatever the shapes; CUDA graphs are still recorded per shape, cheaply
        dynamic = True
        reason = f"--compile_shapes dynamic: one graph, its sizes symbolic{over}"
    elif shapes == "auto" and graphs and fixed_shapes is not None and not static_only:
        # measured so on one H200 (130 s cold); static graphs for 6 shapes had not compiled in 125 s
        dynamic = True
        reason = f"auto: CUDA graphs record each shape: one graph compiled, its sizes symbolic{over}"
    elif fixed_shapes is not None:
        dynamic = False
        # training's and evaluation's shapes, prediction's short last batch and one to spare: no shape ever
        # falls back to eager at the limit
        limit = 2 * fixed_shapes + 2
        reason = f"{fixed_shapes} batch shapes per pass, one graph each"
    elif shapes == "static":
        raise PlanError(
            "--compile_shapes static needs fixed batch shapes (--pad_to_buckets on or --pad_to_max_length): "
            "with dynamic padding a graph per sequence length would pass torch's recompile limit"
        )
    else:
        reason = "batch shapes vary: torch makes them dynamic; --pad_to_buckets fixes them"
    if why:  # compiled by auto: why, then how
        reason = f"{why}; {reason}"
    if mode is None:
        # the mode that records them is inductor's; other backends take "default" (cudagraphs records anyway)
        mode = CUDA_GRAPH_MODES[0] if graphs and backend == "inductor" else "default"
    return CompileDecision(
        torch_compile=True,
        compile_backend=backend,
        compile_mode=mode,
        compile_dynamic=dynamic,
        recompile_limit=limit,
        compile_scope=flags["compile_scope"],
        compile_cache_dir=flags["compile_cache_dir"],
        compile_reason=reason,
        cuda_graphs=graphs,
        cuda_graphs_reason=graphs_reason,
    )


# torch's CUDA graph trees hand the first micro-batch's gradients out of the graphs' memory, which the next
# micro-batch's replay overwrites: the accumulated gradients come out wrong (a quarter of eager's over 4
# micro-batches, pytorch/pytorch#96693) or the backward raises (#169545)
GRAPHS_OVERWRITE_GRADIENTS = (
    "CUDA graphs replayed between micro-batches overwrite the gradients accumulated over them"
)


def _cuda_graphs(
    mode: str | None,
    backend: str,
    device: str,
    world_size: int,
    fixed_shapes: int | None,
    accumulation: int,
) -> tuple[bool, str]:
    """(CUDA graphs on, why) for a compiled run of `accumulation` micro-batches per optimizer step."""
    if device == "cpu":
        return False, "CPU: CUDA graphs need a GPU"
    if mode is not None or backend == "cudagraphs":
        graphs = records_cuda_graphs(backend, mode, device)
        given = (
            f"--torch_compile_backend {backend}"
            if backend == "cudagraphs"
            else f"--torch_compile_mode {mode}"
        )
        if graphs and accumulation > 1:
            raise PlanError(
                f"{given} records CUDA graphs, and with --gradient_accumulation_steps {accumulation} "
                f"{GRAPHS_OVERWRITE_GRADIENTS}; give --gradient_accumulation_steps 1 (a larger "
                "--per_device_train_batch_size) or compile without CUDA graphs (inductor in a mode of "
                f"{', '.join(m for m in compile_modes() if m not in CUDA_GRAPH_MODES)})"
            )
        return graphs, given
    if accumulation > 1:
        return False, f"auto: --gradient_accumulation_steps {accumulation}: {GRAPHS_OVERWRITE_GRADIENTS}"
    if backend != "inductor":
        return False, f"auto: --torch_compile_backend {backend}: CUDA graphs come with inductor"
    if world_size > 1:
        return False, f"auto: {world_size} processes: DDP's all-reduce runs between the graphs"
    if fixed_shapes is None:
        return False, "auto: batch shapes vary: a graph recorded per shape; --pad_to_buckets fixes them"
    return True, "auto: GPU, fixed batch shapes, one process: a step replays graphs, not kernel by kernel"


def records_cuda_graphs(backend: str | None, mode: str | None, device: str) -> bool:
    """Whether torch.compile with this backend and mode records CUDA graphs on this device (cuda | cpu):
    inductor in a mode of CUDA_GRAPH_MODES, or dynamo's cudagraphs backend, whatever the mode."""
    return device == "cuda" and (
        backend == "cudagraphs" or backend == "inductor" and mode in CUDA_GRAPH_MODES
    )


# transformers' attention implementations a BERT can take; for FlashAttention's, the modules that provide it
# (any one: without flash_attn, transformers takes a hub kernel through `kernels`)
ATTENTION_IMPLEMENTATIONS: dict[str, tuple[str, ...]] = {
    "sdpa": (),
    "eager": (),
    "flex_attention": (),
    "flash_attention_2": ("flash_attn", "kernels"),
    "flash_attention_3": ("flash_attn_interface", "kernels"),
    "flash_attention_4": ("flash_attn", "kernels"),
}
# a FlashAttention's least compute capability where it is not 8.0, as transformers checks it at load
# (FLASH_ATTENTION_COMPATIBILITY_MATRIX in transformers/modeling_flash_attention_utils.py: FA4 from Hopper)
FLASH_MIN_CAPABILITY = {"flash_attention_4": (9, 0)}


def refuse_unusable_attention(implementation: str, device: str, precision: str, facts: DeviceFacts) -> None:
    """Refuse an --attn_implementation transformers does not have, or a FlashAttention this run cannot run
    (it needs a GPU of compute capability 8.0 or newer, 9.0 for FlashAttention 4, half precision and a module
    that provides it): found once the model loads or at its first step, each was a traceback."""
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise PlanError(
            f"--attn_implementation {implementation}: give one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
        )
    providers = ATTENTION_IMPLEMENTATIONS[implementation]
    if not providers:
        return
    named = f"--attn_implementation {implementation}"
    least = FLASH_MIN_CAPABILITY.get(implementation, BF16_MIN_CAPABILITY)
    if device != "cuda" or facts.capability is None or facts.capability < least:
        where = "a CPU" if device != "cuda" else f"a GPU {_sm(facts.capability)}"
        needs = f"{least[0]}.{least[1]}"
        raise PlanError(f"{named} needs a GPU of compute capability {needs} or newer; this run is on {where}")
    if precision == "fp32":
        raise PlanError(f"{named} runs in bf16 or fp16 only: give --precision bf16, or leave the flag out")
    if not set(providers) & facts.modules:
        raise PlanError(
            f"{named} needs one of the Python modules {', '.join(providers)}, which this Python lacks; "
            "install one, or leave the flag out for SDPA"
        )


def names_other_attention(attn_implementation: str | None) -> bool:
    """--attn_implementation names an attention that does not call SDPA (eager, flex_attention, a
    FlashAttention)."""
    return attn_implementation not in (None, "sdpa")


def decide_dropout(
    asked: str, device: str, cpu: CpuFacts, compiled: bool, attn_implementation: str | None
) -> tuple[str, str]:
    """As asked, else bulk masks where torch's CPU bernoulli_ is serial (its parallel path is for Intel CPUs
    only), unless compiled (a compiled graph draws its own masks, and the bulk draw would break it) or
    attention was asked for by name (bulk masks draw attention's dropout inside their own SDPA call)."""
    own_attention = names_other_attention(attn_implementation)
    if asked == "bulk" and own_attention:
        raise PlanError(
            f"--dropout_mask bulk draws attention's dropout inside SDPA, which contradicts "
            f"--attn_implementation {attn_implementation}; give one of them"
        )
    if asked == "bulk" and compiled:
        raise PlanError(
            "--dropout_mask bulk draws masks outside the compiled graphs, which breaks them into many "
            "(slower than eager); compiled, the graphs draw their own: drop one of them"
        )
    if asked != "auto":
        return asked, f"--dropout_mask {asked}"
    if compiled:
        return "torch", "auto: compiled: the graphs draw their own masks"
    if own_attention:
        return "torch", f"auto: --attn_implementation {attn_implementation} keeps its own attention"
    if device == "cuda":
        return "torch", "auto: GPU"
    if cpu.vendor != "GenuineIntel":
        return (
            "bulk",
            f"auto: {cpu.vendor} CPU, where torch draws masks one element at a time{cpu.source_note}",
        )
    return "torch", f"auto: Intel CPU, where torch draws masks in parallel{cpu.source_note}"


# counts no run can have, and the least of each: refused here, in one line, rather than by torch or
# transformers with a traceback (negative threads were ignored without a word)
LEAST = {
    "dataloader_num_workers": 0,
    "num_threads": 0,  # 0: decided
    "per_device_train_batch_size": 1,
    "per_device_eval_batch_size": 1,
    "gradient_accumulation_steps": 1,
}


def refuse_outside_the_plan(flags: FlagValues) -> None:
    """Refuse counts below LEAST, a seed numpy cannot take, a training of no step, a last batch dropped from
    an evaluation, and HF's flags that would change the evaluation's precision behind the plan's back (PLAN
    and EFFECTIVE would say fp32 while the model ran cast to half precision). Each was a traceback after the
    model loaded, or (no step) a run that ended ok with the untrained model saved as its result."""
    for name, least in LEAST.items():
        if flags[name] is not None and flags[name] < least:
            raise PlanError(f"--{name} {flags[name]}: give a number >= {least}")
    if not 0 <= flags["seed"] < 2**32:
        raise PlanError(f"--seed {flags['seed']}: give a number from 0 to 2**32 - 1")
    if flags["do_train"] and flags["max_steps"] <= 0 and flags["num_train_epochs"] <= 0:
        raise PlanError(
            f"--num_train_epochs {flags['num_train_epochs']:g} trains no step: give a number above 0, or "
            "--max_steps N"
        )
    evaluates = flags["do_eval"] or flags["do_predict"] or flags["eval_strategy"] != "no"
    if flags["dataloader_drop_last"] and evaluates:
        # the Trainer builds the evaluation's loaders with it too: the questions of the last batch's
        # features would have no answer, found only after training, as a traceback
        raise PlanError(
            "--dataloader_drop_last drops the last batch of the evaluation and prediction too, whose "
            "questions would go unanswered: leave it out in a run that evaluates or predicts"
        )
    for name in ("bf16_full_eval", "fp16_full_eval"):
        if flags[name]:
            raise PlanError(
                f"--{name} casts the model itself for evaluation, outside --precision (which PLAN and "
                f"EFFECTIVE say): use --precision {name[:4]}, which evaluates under autocast too"
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
    asked = flags["precision"]
    hf = [n for n in ("bf16", "fp16") if flags[n]]
    mixed = facts.accelerate_mixed_precision
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
        precision = "bf16" if facts.cpu.fast_bf16 else "fp32"
        reason = f"auto: CPU has {facts.cpu.bf16 or 'no ' + ' or '.join(CPU_BF16_FEATURES)}"
        if facts.cpu.bf16 and not facts.cpu.fast_bf16:
            reason += f", which {facts.cpu.bf16_held_by} keeps oneDNN's matmuls from"
        reason += facts.cpu.source_note
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


def main(argv: list[str]) -> int:
    """`python -m qa_hpc.plan --gpu-count`: the GPUs job_ddp.sh starts a process for (exit 2: asked for, none
    seen); `--machine`: the one MACHINE line bench scripts keep with every result (spaces in names as _)."""
    try:
        facts = read_device_facts()  # a QA_TEST_MACHINE that names no CPU: its own message, exit 2
        if argv == ["--machine"]:  # the CPU as run_summary.json records it, the GPU, torch
            print(facts.machine_line())
            return 0
        require_visible_gpu(facts)
    except UsageError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(facts.gpu_count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
