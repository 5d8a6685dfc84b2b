"""What this process runs on, read once: the CPU, the GPU and its libraries, and the process's place in its
job.

Every decision (qa_hpc.plan) and every record of a machine (run_summary.json, the MACHINE line bench results
keep) takes its facts from `read_device_facts()`. Decisions are tested on made-up `DeviceFacts`; a whole
process (a job script, a bench script, run_qa.py, and the test that checks it) is tested on another kind of
CPU with QA_TEST_MACHINE, which replaces what /proc/cpuinfo and torch say of the CPU:

    QA_TEST_MACHINE="cpu_vendor=AuthenticAMD cpu_flags=avx2,fma3 cpu_model=AMD_EPYC_(family_23_model_1)"

Every line that shows the CPU then says `cpu_source=QA_TEST_MACHINE`: it is for tests, never for real runs.
"""

from __future__ import annotations

import importlib.util
import math
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch

from qa_hpc.dist import launch_env
from qa_hpc.errors import UsageError

# What bench results and run_summary.json record of a CPU (torch.cpu.get_capabilities() names), so that
# figures of different machines are never mixed
CPU_FLAGS = (
    "avx2",
    "fma3",
    "avx512_f",
    "avx512_bw",
    "avx512_vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
)
CPU_BF16_FEATURES = ("amx_bf16", "avx512_bf16")  # bf16 GEMMs in hardware
# oneDNN, which runs torch's bf16 matmuls on a CPU, uses no instruction above the level its own variable
# ONEDNN_MAX_CPU_ISA names. These levels are below AVX512_CORE_BF16: under them a bf16 matmul runs without
# bf16 instructions, ~200x slower than fp32 on an AVX512-BF16 EPYC (bench/cpu_peak.py --size 1024: bf16
# 0.0009 TFLOP/s under ONEDNN_MAX_CPU_ISA=AVX2, 0.42 without; fp32 0.19 either way)
ONEDNN_ISA_VAR = "ONEDNN_MAX_CPU_ISA"
ONEDNN_BELOW_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
# Variables by which a job asks for a GPU
GPU_REQUEST_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE")
TEST_MACHINE_VAR = "QA_TEST_MACHINE"  # made-up CPU facts for a whole process, in tests only
TEST_MACHINE_KEYS = ("cpu_vendor", "cpu_flags", "cpu_model")


@dataclass(frozen=True)
class CpuFacts:
    """The CPU as /proc/cpuinfo names it and as torch finds its instruction sets."""

    model: str  # /proc/cpuinfo's name with family and model (a VM may name only "AMD EPYC")
    vendor: str  # /proc/cpuinfo's vendor_id: GenuineIntel, AuthenticAMD, ...
    flags: tuple[str, ...]  # which of CPU_FLAGS torch finds
    source: str = "/proc/cpuinfo"  # or TEST_MACHINE_VAR
    # the setting that keeps oneDNN's kernels below bf16 instructions (`ONEDNN_MAX_CPU_ISA=AVX2`), None: none
    bf16_held_by: str | None = None

    @property
    def bf16(self) -> str | None:
        """The feature that makes bf16 fast on this CPU (CPU_BF16_FEATURES), None without one."""
        return next((name for name in CPU_BF16_FEATURES if name in self.flags), None)

    @property
    def fast_bf16(self) -> bool:
        """Whether bf16 matmuls run on that feature here: the CPU has it and oneDNN may use it."""
        return self.bf16 is not None and self.bf16_held_by is None

    @property
    def source_note(self) -> str:
        """What a decision taken from these facts adds to its reason: a test's made-up CPU never passes for a
        real one."""
        return f", as {TEST_MACHINE_VAR} says" if self.source == TEST_MACHINE_VAR else ""


# modules beside torch that a flag may need: FlashAttention's, or the hub kernels' (--attn_implementation)
OPTIONAL_MODULES = ("flash_attn", "flash_attn_interface", "kernels")


@dataclass(frozen=True)
class DeviceFacts:
    """What this process sees; one more fact is one more field here and in read_device_facts."""

    cuda_available: bool
    gpu_count: int  # GPUs torch can use in this process
    capability: tuple[int, int] | None  # compute capability of this rank's GPU
    gpu_name: str | None
    # CPUs this process may run on (affinity mask, capped by SLURM_CPUS_PER_TASK and a cgroup CPU quota)
    cpus: int
    world_size: int
    local_world_size: int  # processes of this job on this node
    launcher: str  # torchrun | accelerate | python
    omp_num_threads: int | None  # OMP_NUM_THREADS as found in the environment
    accelerate_mixed_precision: str | None  # ACCELERATE_MIXED_PRECISION as found
    gpus_requested: str | None  # what asked for a GPU (CUDA_VISIBLE_DEVICES=..., SLURM_JOB_GPUS=...), if any
    cpu: CpuFacts = CpuFacts(model="unknown", vendor="unknown", flags=())
    torch_version: str = ""
    torch_cuda: str | None = None  # torch.version.cuda: None for a CPU build
    cudnn_version: int | None = None  # torch.backends.cudnn.version(), e.g. 91002; None without cuDNN
    driver_version: str | None = None  # the NVIDIA driver, as nvidia-smi shows it
    modules: frozenset[str] = frozenset()  # those of OPTIONAL_MODULES this Python can import
    gpu_index: int | None = None  # this rank's GPU (its local rank among the GPUs torch sees)
    # the CPUs of the launcher that started this process (torchrun's agent; None: started by no launcher),
    # which a launcher that binds each process to CPUs of its own (torchrun --numa-binding) shares out
    launcher_cpus: int | None = None
    # the CPUs a cgroup CPU quota allows this process's group (a container's --cpus, a Kubernetes limit),
    # which caps both counts above; None: no quota
    cpu_quota: int | None = None

    def machine_line(self) -> str:
        """The one MACHINE line bench scripts keep with every result (spaces in names as _)."""
        shown = {
            "cpu_model": self.cpu.model,
            "cpu_vendor": self.cpu.vendor,
            "cpu_flags": ",".join(self.cpu.flags),
            "cpus": self.cpus,
            "gpu": self.gpu_name or "none",
            "torch": self.torch_version,
        }
        if self.cpu.source == TEST_MACHINE_VAR:
            shown["cpu_source"] = TEST_MACHINE_VAR
        return "MACHINE " + " ".join(f"{key}={value}".replace(" ", "_") for key, value in shown.items())


def read_cpu(env: Mapping[str, str] = os.environ, cpuinfo_file: Path = Path("/proc/cpuinfo")) -> CpuFacts:
    """This machine's CPU (`cpuinfo_file` names it), held below bf16 where ONEDNN_MAX_CPU_ISA says so; or the
    made-up one of QA_TEST_MACHINE, which is the whole CPU a test describes (an AVX2-held run of the tests
    keeps the decisions of each CPU they make up)."""
    if env.get(TEST_MACHINE_VAR, "").strip():
        return parse_test_machine(env[TEST_MACHINE_VAR])
    held = None
    if env.get(ONEDNN_ISA_VAR, "").strip().upper() in ONEDNN_BELOW_BF16:
        held = f"{ONEDNN_ISA_VAR}={env[ONEDNN_ISA_VAR].strip()}"
    try:
        # a brand string is ASCII; a byte that is not UTF-8 must not end the run
        cpuinfo = cpuinfo_file.read_text(encoding="utf-8", errors="replace")
        first_cpu = cpuinfo.split("\n\n")[0].splitlines()
    except OSError:
        first_cpu = []
    info = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first_cpu)}
    name = info.get("model name", platform.machine())
    family = info.get("cpu family", "?")
    model = info.get("model", "?")
    capabilities = torch.cpu.get_capabilities()
    return CpuFacts(
        model=f"{name} (family {family} model {model})",
        vendor=info.get("vendor_id", "unknown"),
        flags=tuple(name for name in CPU_FLAGS if capabilities.get(name)),
        bf16_held_by=held,
    )


def parse_test_machine(text: str) -> CpuFacts:
    """QA_TEST_MACHINE's words -> the CPU they describe: each of TEST_MACHINE_KEYS once, as key=value (as the
    MACHINE line writes them); the flags in CPU_FLAGS' order, as a real read gives them. Anything else is a
    UsageError naming the variable, the word or the field, and what is wrong."""
    given: dict[str, str] = {}
    for place, word in enumerate(text.split(), start=1):
        key, equals, value = word.partition("=")
        if key not in TEST_MACHINE_KEYS or not equals:
            keys = ", ".join(TEST_MACHINE_KEYS)
            _refuse_test_machine(text, f"word {place} {word!r}", f"not key=value with a key from {keys}")
        if key in given:
            _refuse_test_machine(text, f"word {place} {word!r}", f"{key} given twice")
        given[key] = value
    missing = [key for key in TEST_MACHINE_KEYS if key not in given]
    if missing:
        _refuse_test_machine(
            text, ", ".join(missing), "missing: a made-up CPU names its vendor, flags and model"
        )
    # cpu_flags may be empty (a CPU with none of CPU_FLAGS); a vendor and a model always have a name
    for key in ("cpu_vendor", "cpu_model"):
        if not given[key]:
            _refuse_test_machine(text, key, "empty")
    flags = [flag for flag in given["cpu_flags"].split(",") if flag]
    unknown = [flag for flag in flags if flag not in CPU_FLAGS]
    if unknown:
        known = ", ".join(CPU_FLAGS)
        _refuse_test_machine(text, "cpu_flags", f"unknown {', '.join(unknown)} (known: {known})")
    return CpuFacts(
        model=given["cpu_model"].replace("_", " "),
        vendor=given["cpu_vendor"],
        flags=tuple(flag for flag in CPU_FLAGS if flag in flags),
        source=TEST_MACHINE_VAR,
    )


def _refuse_test_machine(text: str, where: str, why: str) -> NoReturn:
    raise UsageError(f"{TEST_MACHINE_VAR}={text!r}: {where}: {why}")


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version as nvidia-smi shows it, through NVML (None where NVML cannot be loaded)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # noqa: BLE001 - a driver library missing or refusing: the record says "not recorded"
        return None


def _usable_cpus(env: Mapping[str, str], pid: int = 0) -> int:
    """The CPUs process `pid` (0: this one) may run on: its affinity mask, capped by SLURM_CPUS_PER_TASK
    (Slurm with task/none leaves the mask at the whole node, and the allocation is then only in that
    variable). OSError where the process cannot be asked."""
    if hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(pid))
    else:
        cpus = os.cpu_count() or 1
    slurm_cpus = env.get("SLURM_CPUS_PER_TASK", "").strip()
    if slurm_cpus.isdigit() and int(slurm_cpus) > 0:
        cpus = min(cpus, int(slurm_cpus))
    return max(1, cpus)


def cgroup_cpu_quota(proc: Path = Path("/proc/self")) -> int | None:
    """The CPUs a cgroup CPU quota lets this process's group use (a container's --cpus, a Kubernetes CPU
    limit: its affinity mask still names every CPU of the host; Slurm limits by the mask instead), rounded
    up; None without a quota, or where none can be read. Each mounted hierarchy of the cpu controller is
    read in the process's own group and every group above it (the smallest quota binds): cgroup v2's
    cpu.max ("QUOTA PERIOD", or "max PERIOD": none), v1's cpu.cfs_quota_us (-1: none) over
    cpu.cfs_period_us."""
    try:
        groups = (proc / "cgroup").read_text(encoding="utf-8").splitlines()
        mounts = (proc / "mountinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    # hierarchy-id:controllers:path; cgroup v2's controllers are empty
    own = dict(line.split(":", 2)[1:] for line in groups if line.count(":") >= 2)
    v1_cpu = next((path for names, path in own.items() if "cpu" in names.split(",")), None)
    limits = []
    for line in mounts:
        # mount id, parent, major:minor, root, mount point, options, [tags,] "-", type, source, options
        fields = line.split()
        if "-" not in fields[5:]:
            continue
        kind = fields[fields.index("-", 5) + 1 :]
        if len(kind) < 3:
            continue
        if kind[0] == "cgroup2":
            path = own.get("")
            read = _v2_quota
        elif kind[0] == "cgroup" and "cpu" in kind[2].split(","):
            path = v1_cpu
            read = _v1_quota
        else:
            continue
        relative = os.path.relpath(path, fields[3]) if path else ".."
        if relative.startswith(".."):  # this process's group lies outside what the mount shows
            continue
        top = Path(fields[4])
        for group in [top / relative, *(top / relative).parents]:
            if (limit := read(group)) is not None:
                limits.append(limit)
            if group == top:
                break
    return max(1, math.ceil(min(limits))) if limits else None


def _v2_quota(group: Path) -> float | None:
    try:
        quota, period = (group / "cpu.max").read_text(encoding="utf-8").split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(group: Path) -> float | None:
    try:
        quota = int((group / "cpu.cfs_quota_us").read_text(encoding="utf-8"))
        period = int((group / "cpu.cfs_period_us").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _within(cpus: int | None, quota: int | None) -> int | None:
    return cpus if cpus is None or quota is None else min(cpus, quota)


def _gpus_requested(env: Mapping[str, str]) -> str | None:
    """What in the environment asked for a GPU, as NAME=value words (None: nothing did)."""
    asked = []
    for name in GPU_REQUEST_VARS:
        value = env.get(name, "").strip()
        if value in ("", "-1", "none", "NoDevFiles") or (name == "SLURM_GPUS_ON_NODE" and value == "0"):
            continue
        asked.append(f"{name}={value}")
    return ", ".join(asked) or None


def _launcher_cpus(env: Mapping[str, str], launcher: str) -> int | None:
    """The CPUs of the launcher that started this process (its parent: torchrun's agent, accelerate's
    launcher); None without one, or where its mask cannot be read. (A launcher that has exited left this
    process to init or a subreaper, whose mask stands in: its workers are being stopped then anyway.)"""
    if launcher == "python":
        return None
    try:
        return _usable_cpus(env, os.getppid())
    except OSError:
        return None


def _launcher(env: Mapping[str, str]) -> str:
    # accelerate launch always sets ACCELERATE_MIXED_PRECISION; torchrun sets TORCHELASTIC_RUN_ID
    if env.get("ACCELERATE_MIXED_PRECISION") is not None:
        return "accelerate"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    return "python"


def read_device_facts(env: Mapping[str, str] = os.environ) -> DeviceFacts:
    """What this process sees now: the one place that asks torch, /proc and the environment about the
    machine for a decision (the run's record also keeps the node's CPU count and the Slurm job it ran in:
    record.Environment.of)."""
    launch = launch_env(env)
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    index = launch.local_rank % count if count else None
    omp = env.get("OMP_NUM_THREADS", "").strip()
    mixed = env.get("ACCELERATE_MIXED_PRECISION")
    cudnn = torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None
    launcher = _launcher(env)
    quota = cgroup_cpu_quota()
    return DeviceFacts(
        cuda_available=cuda,
        gpu_count=count,
        capability=tuple(torch.cuda.get_device_capability(index)) if index is not None else None,
        gpu_name=torch.cuda.get_device_name(index) if index is not None else None,
        cpus=_within(_usable_cpus(env), quota),
        launcher_cpus=_within(_launcher_cpus(env, launcher), quota),
        cpu_quota=quota,
        world_size=launch.world_size,
        local_world_size=launch.local_world_size,
        launcher=launcher,
        omp_num_threads=int(omp) if omp.isdigit() else None,
        accelerate_mixed_precision=mixed.strip().lower() if mixed else None,
        gpus_requested=_gpus_requested(env),
        cpu=read_cpu(env),
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        cudnn_version=cudnn,
        driver_version=_nvidia_driver() if cuda else None,
        modules=frozenset(name for name in OPTIONAL_MODULES if importlib.util.find_spec(name) is not None),
        gpu_index=index,
    )


def set_cuda_tf32(on: bool) -> None:
    """TF32 for a GPU run's matmuls as the plan says, set once the Trainer is built: accelerate turns it on
    for a compiled fp32 run on CUDA (its legacy allow_tf32 switch), behind --precision fp32's back; and
    transformers sets it through torch's new global switch (torch.backends.fp32_precision), after which
    torch.get_float32_matmul_precision(), which inductor's autotuning (max-autotune) reads, raises for a mix
    of the two. torch's own setter sets the matmuls' switches consistently (CUDA's and oneDNN's; cuDNN's keep
    transformers' value, the plan's too)."""
    torch.set_float32_matmul_precision("high" if on else "highest")
