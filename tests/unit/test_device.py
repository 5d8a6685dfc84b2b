"""The device facts: QA_TEST_MACHINE's made-up CPU (good and bad values), the CPU as this machine has it, the
MACHINE line, and bf16 in hardware; then the plan each kind of CPU gets from the facts run_qa.py reads; what
asked for a GPU, the CPUs a process may use, and a GPU process's facts under a made-up torch.cuda."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from fixtures.machines import AMX_INTEL, AVX2_AMD, AVX512_BF16_AMD, CPU_KINDS, CpuKind

import qa_hpc.plan
from qa_hpc.device import (
    CPU_FLAGS,
    CpuFacts,
    cgroup_cpu_quota,
    parse_test_machine,
    read_cpu,
    read_device_facts,
    set_cuda_tf32,
)
from qa_hpc.errors import UsageError
from qa_hpc.flags import read_flags
from qa_hpc.plan import decide


def test_a_made_up_cpu_is_the_cpu_its_words_name():
    assert parse_test_machine(AVX2_AMD.test_machine) == CpuFacts(
        model="AMD EPYC (family 23 model 1)",
        vendor="AuthenticAMD",
        flags=("avx2", "fma3"),
        source="QA_TEST_MACHINE",
    )
    # any order, spaces between words: its flags in CPU_FLAGS' order, as a real read gives them
    shuffled = parse_test_machine("  cpu_flags=amx_bf16,avx2,avx512_f  cpu_model=X cpu_vendor=GenuineIntel ")
    assert shuffled.flags == ("avx2", "avx512_f", "amx_bf16") and shuffled.vendor == "GenuineIntel"
    no_flags = parse_test_machine("cpu_vendor=ARM cpu_flags= cpu_model=Neoverse_V2")  # none of CPU_FLAGS
    assert no_flags.flags == () and no_flags.model == "Neoverse V2"


GOOD = "cpu_vendor=AuthenticAMD cpu_flags=avx2,fma3 cpu_model=EPYC"
# what is wrong | QA_TEST_MACHINE | words of the message after "QA_TEST_MACHINE='...': "
BAD = [
    (
        "unknown_key",
        GOOD.replace("cpu_vendor", "cpu_vendr"),
        "word 1 'cpu_vendr=AuthenticAMD': not key=value",
    ),
    ("no_key", GOOD.replace("cpu_vendor=", ""), "word 1 'AuthenticAMD': not key=value with a key from"),
    ("no_value", GOOD.replace("=EPYC", ""), "word 3 'cpu_model': not key=value with a key from cpu_vendor"),
    ("twice", GOOD + " cpu_vendor=GenuineIntel", "word 4 'cpu_vendor=GenuineIntel': cpu_vendor given twice"),
    ("missing", GOOD.replace(" cpu_model=EPYC", ""), "cpu_model: missing: a made-up CPU names its vendor"),
    ("two_missing", "cpu_model=EPYC", "cpu_vendor, cpu_flags: missing"),
    ("empty", GOOD.replace("AuthenticAMD", ""), "cpu_vendor: empty"),
    (
        "unknown_flags",
        GOOD.replace("avx2,", "avx2,sse9,avx_512,"),
        "cpu_flags: unknown sse9, avx_512 (known: avx2",
    ),
]


@pytest.mark.parametrize("value, says", [pytest.param(value, says, id=name) for name, value, says in BAD])
def test_a_bad_made_up_cpu_is_refused_naming_the_variable_the_word_and_the_field(value: str, says: str):
    with pytest.raises(UsageError) as err:
        parse_test_machine(value)
    assert str(err.value).startswith(f"QA_TEST_MACHINE={value!r}: ") and says in str(err.value), err.value
    with pytest.raises(UsageError):  # the whole process: run_qa.py ends with exit 2 and this message
        read_device_facts({"QA_TEST_MACHINE": value})


def test_plan_machine_names_a_bad_made_up_cpu_and_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("QA_TEST_MACHINE", "cpu_flags=avx2")
    assert qa_hpc.plan.main(["--machine"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(
        "ERROR: QA_TEST_MACHINE='cpu_flags=avx2': cpu_vendor, cpu_model:"
    )


def test_without_qa_test_machine_the_cpu_is_this_machines():
    """/proc/cpuinfo's vendor and name, torch's own instruction sets; an empty QA_TEST_MACHINE is no CPU."""
    info = {}
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo.read().split("\n\n")[0].splitlines():
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    found = torch.cpu.get_capabilities()
    for env in ({}, {"QA_TEST_MACHINE": " "}):
        cpu = read_cpu(env)
        assert cpu.source == "/proc/cpuinfo" and cpu.vendor == info.get("vendor_id", "unknown")
        assert cpu.model.startswith(info.get("model name", "")) and " (family " in cpu.model
        assert cpu.flags == tuple(flag for flag in CPU_FLAGS if found.get(flag))
    assert read_cpu({"QA_TEST_MACHINE": AVX2_AMD.test_machine}) == parse_test_machine(AVX2_AMD.test_machine)


@pytest.mark.parametrize("kind", CPU_KINDS, ids=lambda kind: kind.name)
def test_the_machine_line_says_a_made_up_cpu_and_gives_its_words_back(kind: CpuKind):
    facts = read_device_facts({"QA_TEST_MACHINE": kind.test_machine})
    line = facts.machine_line()
    assert line.startswith("MACHINE cpu_model=") and line.endswith(" cpu_source=QA_TEST_MACHINE"), line
    words = [word for word in line.split() if word.split("=")[0] in ("cpu_model", "cpu_vendor", "cpu_flags")]
    assert parse_test_machine(" ".join(words)) == facts.cpu  # as QA_TEST_MACHINE takes them
    real = read_device_facts({}).machine_line()
    assert "cpu_source" not in real and f" cpus={facts.cpus} gpu=" in real


def test_a_cpuinfo_byte_that_is_not_utf8_still_names_the_cpu(tmp_path):
    """/proc/cpuinfo is read as text: a byte that is not UTF-8 in a brand string (0xe9, Latin-1's e-acute)
    raised UnicodeDecodeError and ended the run before its plan; it reads as the replacement character."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_bytes(
        b"vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: EPYC caf\xe9\n\n"
    )
    cpu = read_cpu({}, cpuinfo)
    assert (cpu.model, cpu.vendor) == ("EPYC caf\ufffd (family 25 model 17)", "AuthenticAMD")


@pytest.mark.parametrize(
    "flags, bf16",
    [
        ((), None),
        (("avx2", "fma3"), None),
        (("avx2", "avx512_f", "avx512_vnni"), None),  # AVX-512 without bf16: emulated, ~15x slower
        (("avx2", "avx512_f", "avx512_bf16"), "avx512_bf16"),
        (("avx2", "avx512_bf16", "amx_tile", "amx_bf16"), "amx_bf16"),  # AMX first: the faster of the two
        (("amx_tile", "amx_int8"), None),
    ],
)
def test_bf16_in_hardware_is_avx512_bf16_or_amx_bf16(flags: tuple[str, ...], bf16: str | None):
    assert CpuFacts(model="m", vendor="v", flags=flags).bf16 == bf16


@pytest.mark.parametrize("kind", CPU_KINDS, ids=lambda kind: kind.name)
def test_each_kind_of_cpu_gets_its_precision_and_dropout_masks_from_the_facts_run_qa_reads(kind: CpuKind):
    """What run_qa.py decides under QA_TEST_MACHINE (read_device_facts, then decide): the PLAN line says the
    made-up CPU in both reasons; --precision fp32 and --dropout_mask torch still win."""
    facts = read_device_facts({"QA_TEST_MACHINE": kind.test_machine})
    on_cpu = ["--output_dir", "o", "--use_cpu"]
    plan = decide(read_flags(on_cpu), facts)
    assert (plan.precision, plan.dropout_mask) == (kind.precision, kind.dropout_mask)
    line = plan.log_line()
    assert f" precision={kind.precision} ({kind.precision_reason}) " in line, line
    assert f" dropout_mask={kind.dropout_mask} ({kind.dropout_reason}) " in line, line
    asked = decide(read_flags([*on_cpu, "--precision", "fp32", "--dropout_mask", "torch"]), facts)
    assert (asked.precision, asked.dropout_mask) == ("fp32", "torch")
    assert "QA_TEST_MACHINE" not in asked.log_line()  # nothing was taken from the made-up CPU


@pytest.mark.parametrize(
    "held, precision",
    [
        (None, "bf16"),
        ("AVX2", "fp32"),
        ("avx512_core_vnni", "fp32"),  # oneDNN reads the level in any case
        ("AVX512_CORE_BF16", "bf16"),
        ("ALL", "bf16"),
    ],
)
@pytest.mark.parametrize("kind", [AVX512_BF16_AMD, AMX_INTEL], ids=lambda kind: kind.name)
def test_bf16_is_not_chosen_where_onednn_is_held_below_it(
    kind: CpuKind, held: str | None, precision: str, monkeypatch
):
    """ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16 keeps torch's bf16 matmuls off the CPU's bf16 instructions
    (~200x slower than fp32 on the AVX512-BF16 EPYC): auto picks fp32 there and says why; the CPU's flags
    stay what it has. Here torch finds the made-up CPU's instruction sets on this one; a QA_TEST_MACHINE
    is the whole CPU a test describes, held by nothing."""
    flags = parse_test_machine(kind.test_machine).flags
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict.fromkeys(flags, True))
    env = {"ONEDNN_MAX_CPU_ISA": held} if held else {}
    cpu = read_cpu(env)
    assert cpu.flags == flags
    plan = decide(read_flags(["--output_dir", "o", "--use_cpu"]), read_device_facts(env))
    assert plan.precision == precision
    if precision == "fp32":
        assert cpu.bf16_held_by == f"ONEDNN_MAX_CPU_ISA={held}"
        assert f"which ONEDNN_MAX_CPU_ISA={held} keeps oneDNN's matmuls from) " in plan.log_line()
    made_up = read_cpu({**env, "QA_TEST_MACHINE": kind.test_machine})
    assert made_up.fast_bf16 and made_up.bf16_held_by is None


@pytest.mark.parametrize(
    "env, asked",
    [
        ({}, None),
        # what Slurm and CUDA set where no GPU was given: nothing asked for one
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
        ({"SLURM_JOB_GPUS": "none"}, None),
        ({"SLURM_STEP_GPUS": "NoDevFiles"}, None),
        ({"SLURM_GPUS_ON_NODE": "0"}, None),
        ({"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES=0"),
        ({"SLURM_JOB_GPUS": "2,3", "SLURM_GPUS_ON_NODE": "2"}, "SLURM_JOB_GPUS=2,3, SLURM_GPUS_ON_NODE=2"),
    ],
)
def test_what_in_the_environment_asked_for_a_gpu(env: dict[str, str], asked: str | None):
    """The words a GPU job whose torch sees none is refused with (qa_hpc.plan.require_visible_gpu); a CPU
    job on a Slurm node, with its "no GPU" values, asked for none."""
    assert read_device_facts(env).gpus_requested == asked


@pytest.mark.parametrize(
    "slurm_cpus, cpus", [(None, 64), ("8", 8), ("128", 64), ("0", 64), ("", 64), ("x", 64)]
)
def test_usable_cpus_are_the_affinity_capped_by_slurms_cpus_per_task(
    monkeypatch, slurm_cpus: str | None, cpus: int
):
    """Slurm with task/none leaves the mask at the whole node (64 CPUs here, made up): the allocation is
    then only in SLURM_CPUS_PER_TASK."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr("qa_hpc.device.cgroup_cpu_quota", lambda: None)  # whatever this machine has
    env = {} if slurm_cpus is None else {"SLURM_CPUS_PER_TASK": slurm_cpus}
    assert read_device_facts(env).cpus == cpus


def _cgroups(tmp_path, own: str, mounts: list[tuple[str, str, str]], files: dict[str, str]):
    """A made-up /proc/self (its cgroup file: `own`; mountinfo: (root, type, options) mounted at
    tmp_path/m<i>) and the groups' files (path under tmp_path -> text)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(own)
    lines = [
        f"{30 + i} 23 0:{26 + i} {root} {tmp_path}/m{i} rw,relatime - {kind} cgroup {options}"
        for i, (root, kind, options) in enumerate(mounts)
    ]
    (proc / "mountinfo").write_text("25 1 0:20 / /proc rw - proc proc rw\n" + "\n".join(lines) + "\n")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return proc


V2 = ("/", "cgroup2", "rw")
V1_CPU = ("/", "cgroup", "rw,cpu,cpuacct")


@pytest.mark.parametrize(
    "own, mounts, files, cpus",
    [
        # a container in its own cgroup namespace (docker --cpus 1.5): its group is the mount's top
        ("0::/\n", [V2], {"m0/cpu.max": "150000 100000\n"}, 2),
        # a Kubernetes pod's container: no quota of its own, its pod's binds
        (
            "0::/kubepods/pod1/c1\n",
            [V2],
            {"m0/kubepods/pod1/cpu.max": "400000 100000", "m0/kubepods/pod1/c1/cpu.max": "max 100000"},
            4,
        ),
        # the smallest quota on the way up binds
        (
            "0::/a/b\n",
            [V2],
            {"m0/a/cpu.max": "200000 100000", "m0/a/b/cpu.max": "300000 100000"},
            2,
        ),
        # cgroup v1, cpu and cpuacct mounted together; the hybrid's v2 mount holds no quota
        (
            "4:cpu,cpuacct:/docker/abc\n0::/\n",
            [V1_CPU, V2],
            {"m0/docker/abc/cpu.cfs_quota_us": "300000", "m0/docker/abc/cpu.cfs_period_us": "100000"},
            3,
        ),
        (
            "4:cpu,cpuacct:/\n",
            [V1_CPU],
            {"m0/cpu.cfs_quota_us": "-1", "m0/cpu.cfs_period_us": "100000"},
            None,
        ),
        # a quota under 1 CPU still leaves one
        ("0::/\n", [V2], {"m0/cpu.max": "20000 100000"}, 1),
        # the group outside what the mount shows (another namespace's root): nothing read there
        ("0::/elsewhere\n", [("/mine", "cgroup2", "rw")], {"m0/cpu.max": "100000 100000"}, None),
        # no cpu controller mounted, no files
        ("3:memory:/x\n", [("/", "cgroup", "rw,memory")], {}, None),
    ],
    ids=["v2_container", "v2_pod", "v2_smallest", "v1", "v1_none", "v2_below_one", "outside", "none"],
)
def test_a_cgroup_cpu_quota_is_found_where_containers_put_it(tmp_path, own, mounts, files, cpus):
    """A container's --cpus or a Kubernetes limit leaves the affinity mask at every CPU of the host: threads
    by the mask alone would oversubscribe the quota (torch's default does). Read in the process's own group
    and each above it, v2 and v1, rounded up."""
    assert cgroup_cpu_quota(_cgroups(tmp_path, own, mounts, files)) == cpus


def test_the_plan_shares_out_the_cpus_a_quota_allows(monkeypatch):
    """The quota caps the CPUs of the process and of its launcher, and PLAN says whose count it is."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr("qa_hpc.device.cgroup_cpu_quota", lambda: 6)
    facts = read_device_facts({"TORCHELASTIC_RUN_ID": "r", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"})
    assert (facts.cpus, facts.launcher_cpus, facts.cpu_quota) == (6, 6, 6)
    plan = decide(read_flags(["--output_dir", "o", "--use_cpu"]), facts)
    assert plan.threads == 3
    assert "threads=3 (6 CPUs (a cgroup CPU quota's) / 2 process(es) on this node)" in plan.log_line()


@pytest.mark.parametrize("driver", ["580.65.06", None], ids=["nvml", "no-nvml"])
def test_a_gpu_process_reads_its_own_gpu_made_up_here(monkeypatch, driver: str | None):
    """The GPU side of read_device_facts under a made-up torch.cuda, cuDNN and NVML: local rank 3 of a node
    whose process sees 2 GPUs reads GPU 3 % 2 = 1; a driver library that refuses leaves the driver None."""
    gpus = {0: ((9, 0), "NVIDIA H200"), 1: ((8, 0), "NVIDIA A100-SXM4-80GB")}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: gpus[index][0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: gpus[index][1])
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)

    def driver_version() -> str:
        if driver is None:
            raise RuntimeError("NVML Shared Library Not Found")
        return driver

    nvml = types.SimpleNamespace(nvmlInit=lambda: None, nvmlSystemGetDriverVersion=driver_version)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    env = {"LOCAL_RANK": "3", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
    facts = read_device_facts({**env, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert (facts.cuda_available, facts.gpu_count, facts.capability) == (True, 2, (8, 0))
    assert (facts.gpu_name, facts.cudnn_version, facts.driver_version) == gpus[1][1:] + (91002, driver)
    assert (facts.world_size, facts.local_world_size, facts.gpus_requested) == (
        4,
        4,
        "CUDA_VISIBLE_DEVICES=0,1",
    )
    assert " gpu=NVIDIA_A100-SXM4-80GB " in facts.machine_line()


@pytest.fixture
def matmul_switches():
    """torch's precision switches (the legacy global one, the new global one, CUDA's, oneDNN's and cuDNN's
    for matmuls and convolutions), put back after the test."""
    backends = (
        torch.backends,
        torch.backends.cuda.matmul,
        torch.backends.mkldnn.matmul,
        torch.backends.cudnn,
        torch.backends.cudnn.conv,
    )
    before = [backend.fp32_precision for backend in backends]
    global_before = torch.get_float32_matmul_precision()
    yield backends[1]
    torch.set_float32_matmul_precision(global_before)
    for backend, value in zip(backends, before, strict=True):
        backend.fp32_precision = value


@pytest.mark.parametrize("on", [True, False], ids=["tf32", "fp32"])
def test_tf32_set_after_the_trainer_is_the_plans_whatever_transformers_and_accelerate_set(
    matmul_switches, on
):
    """transformers sets --tf32 through torch's new global switch, after which the legacy reading inductor's
    autotuning does (max-autotune) raises; accelerate then turns TF32 on with the legacy switch for a compiled
    fp32 run on CUDA. Set once the Trainer is built, the plan's TF32 holds, and the reading works. (The
    switches are torch's Python state, the same on a CPU build.)"""
    torch.backends.fp32_precision = "tf32"  # TrainingArguments(tf32=True), transformers 5.23 on torch >= 2.9
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()
    matmul_switches.allow_tf32 = True  # accelerate, for a compiled fp32 run on CUDA
    set_cuda_tf32(on)
    assert matmul_switches.fp32_precision == ("tf32" if on else "ieee")  # what EFFECTIVE reads
    assert torch.get_float32_matmul_precision() == ("high" if on else "highest")
