"""The settings plan for every device, decided on a CPU from made-up device facts (each row's outcome written
from README's "How precision, threads and devices are chosen"); the read-back check; --precision reaching
evaluation."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
import types

import datasets
import pytest
import torch
import transformers
from fixtures.procs import tiny_flags
from transformers import AutoModelForQuestionAnswering, Trainer

from qa_hpc import attention
from qa_hpc.device import CpuFacts, DeviceFacts, read_device_facts
from qa_hpc.errors import UsageError
from qa_hpc.flags import (
    batch_lines,
    build_flags,
    decide_and_build,
    read_flags,
    refuse_uneven_batches,
    training_batches,
    unused_flags,
)
from qa_hpc.plan import (
    COMPILE_AWAITS_COUNT,
    COMPILE_PAYS_FROM_BATCHES,
    FlagValues,
    PlanError,
    decide,
    decide_after_compile_failed,
)

CACHE = "/scratch/hf_cache/qa_hpc_compile"  # where the compile's caches go: resolved before the plan
TWO_EPOCHS = 7377  # batches of bert-base's 2 epochs of SQuAD at batch 24: a training run the compile pays for
# every flag at its default, as run_qa.py parses them and decide_and_build resolves them
DEFAULTS = {**read_flags([]), "compile_cache_dir": CACHE}


def ask(**given: object) -> FlagValues:
    """The parsed flags with these given."""
    return {**DEFAULTS, **given}


GPUS = {
    "A100": (8, 0),
    "H100": (9, 0),
    "H200": (9, 0),
    "B200": (10, 0),
    "B300": (10, 3),
    "SM101": (10, 1),
    "RTX4090": (8, 9),
    "V100": (7, 0),
    "T4": (7, 5),
    "CPU": None,
    "AVX512BF16": None,
    "AMX": None,
}
CPU_BF16 = {"AVX512BF16": "avx512_bf16", "AMX": "amx_bf16"}  # CPUs that do bf16 GEMMs in hardware


def facts(
    device: str,
    ranks: int = 1,
    cpus: int = 32,
    launcher_cpus: int | None = None,
    omp: int | None = None,
    accelerate: str | None = None,
    launcher: str | None = None,
    gpus_visible: int | None = None,  # None: one per rank
    asked: str | None = None,
    vendor: str = "AuthenticAMD",
    torch_version: str = "2.13.0",
    torch_cuda: str = "13.0",
    cudnn: int | None = 91900,
    modules: tuple[str, ...] = ("flash_attn",),  # on a GPU node
) -> DeviceFacts:
    cuda = GPUS[device] is not None
    return DeviceFacts(
        cuda_available=cuda,
        gpu_count=(gpus_visible or ranks) if cuda else 0,
        capability=GPUS[device],
        gpu_name=f"NVIDIA {device}" if cuda else None,
        cpus=cpus,
        launcher_cpus=launcher_cpus,
        world_size=ranks,
        local_world_size=ranks,
        launcher=launcher or ("accelerate" if accelerate else "torchrun" if ranks > 1 else "python"),
        omp_num_threads=omp,
        accelerate_mixed_precision=accelerate,
        gpus_requested=asked,
        torch_version=torch_version,
        torch_cuda=torch_cuda if cuda else None,
        cudnn_version=cudnn if cuda else None,
        modules=frozenset(modules if cuda else ()),
        cpu=CpuFacts(
            model="made-up CPU", vendor=vendor, flags=("avx2", "fma3", *CPU_BF16.get(device, "").split())
        ),
    )


def rows(table: str, columns: int) -> list[list[str]]:
    """Whitespace-separated columns; the last one keeps its spaces (a refusal's words); '-' is not given;
    a first column "A100,V100" is one row per device."""
    return [
        [device, *rest.split(None, columns - 2)]
        for line in table.strip().splitlines()
        for devices, rest in [line.split(None, 1)]
        for device in devices.split(",")
    ]


def decided(request: FlagValues, device_facts: DeviceFacts, want: str):
    """The plan, or None after checking the refusal when want is '!' + words of the message."""
    if not want.startswith("!"):
        return decide(request, device_facts)
    with pytest.raises(PlanError, match=want[1:]):
        decide(request, device_facts)
    return None


# device | --precision | HF flag | accelerate mixed_precision | expected precision, or "!" + words of the
# refusal
PRECISION_TABLE = """
A100,H100,AVX512BF16,AMX auto - - bf16
V100,T4            auto - -    fp16
CPU                auto - -    fp32
A100,H100,V100,T4,CPU,AMX fp32 - - fp32
A100,V100,T4       fp16 - -    fp16
CPU,AMX            fp16 - -    !not supported on CPU
A100,H100,CPU,AVX512BF16 bf16 - - bf16
V100,T4            bf16 - -    !compute capability 8.0
A100,CPU           auto bf16 - bf16
A100,V100          auto fp16 - fp16
V100,T4            auto bf16 - !compute capability 8.0
CPU                auto fp16 - !not supported on CPU
A100               fp32 bf16 - !contradicts --bf16
A100               fp16 bf16 - !contradicts --bf16
A100               bf16 fp16 - !contradicts --fp16
A100               bf16 bf16 - bf16
V100               fp16 fp16 - fp16
A100,H100,V100,CPU,AVX512BF16 auto - no fp32
A100,V100,T4       auto - fp16 fp16
A100,CPU           auto - bf16 bf16
V100               auto - bf16 !compute capability 8.0
CPU                auto - fp16 !not supported on CPU
A100               auto - fp8  !not supported here
A100               fp32 - bf16 fp32
A100               bf16 - no   bf16
V100               fp32 - fp16 fp32
A100               auto fp16 bf16 fp16
A100               auto bf16 no   bf16
CPU,AMX            fp32 - bf16 fp32
"""


@pytest.mark.parametrize("ranks", [1, 4])
@pytest.mark.parametrize("device, precision, hf, accelerate, want", rows(PRECISION_TABLE, 5))
def test_precision_for_every_device(device, precision, hf, accelerate, want, ranks):
    request = ask(precision=precision, bf16=hf == "bf16", fp16=hf == "fp16")
    plan = decided(
        request, facts(device, ranks=ranks, accelerate=None if accelerate == "-" else accelerate), want
    )
    if plan is not None:
        assert plan.precision == want
        fields = plan.training_fields(None)
        assert (fields["bf16"], fields["fp16"]) == (want == "bf16", want == "fp16")
        # TrainingArguments reads ACCELERATE_MIXED_PRECISION when --bf16/--fp16 are off: it must say the
        # plan's
        env = {} if accelerate == "-" else {"ACCELERATE_MIXED_PRECISION": accelerate}
        told = {k: v for k, v in plan.environment(env).items() if k in env}
        assert told == {k: {"fp32": "no"}.get(want, want) for k in env}


# device | --tf32 | --speed_defaults | --precision | expected TF32, or "!" + refusal
TF32_TABLE = """
A100,H100      -     true  auto on
A100           -     true  bf16 on
V100,T4,CPU    -     true  auto off
A100           -     false auto off
A100,H100      -     true  fp32 off
A100           true  true  fp32 on
A100           false true  auto off
A100           true  false auto on
V100,CPU       true  true  auto !compute capability 8.0
CPU            false true  auto off
"""


@pytest.mark.parametrize("device, tf32, defaults, precision, want", rows(TF32_TABLE, 5))
def test_tf32_for_every_device(device, tf32, defaults, precision, want):
    """--precision fp32 is true fp32: TF32 off (and the MFU against the fp32 peak, which reads plan.tf32).
    Without --speed_defaults the dataloader workers are as asked (0) too."""
    given = None if tf32 == "-" else tf32 == "true"
    plan = decided(
        ask(tf32=given, speed_defaults=defaults == "true", precision=precision), facts(device), want
    )
    if plan is not None:
        assert plan.tf32 == (want == "on")
        # TrainingArguments gets tf32 only where it means something (it refuses True off Ampere)
        assert plan.training_fields(given)["tf32"] == (plan.tf32 if device != "CPU" else given)
        assert defaults == "true" or plan.dataloader_num_workers == 0


# device | CPUs | processes on the node | OMP_NUM_THREADS | launcher | --num_threads |
# --dataloader_num_workers ('-': not given) | threads | workers  (a launcher's OMP_NUM_THREADS=1 is its
# default: torchrun and accelerate export 1 when unset)
THREADS_TABLE = """
CPU  2  1 -  python     0 - 2  0
CPU  32 4 -  torchrun   0 - 8  0
CPU  32 4 1  torchrun   0 - 8  0
CPU  32 1 1  accelerate 0 - 32 0
CPU  32 1 1  python     0 - 1  0
CPU  32 4 2  torchrun   0 - 2  0
CPU  32 4 -  torchrun   3 - 3  0
CPU  32 1 12 python     0 - 12 0
CPU  32 1 -  python     0 2 30 2
CPU  2  1 -  python     0 4 1  4
CPU  2  1 -  python     0 0 2  0
A100 32 1 -  python     0 - 28 4
A100 32 1 1  accelerate 0 - 28 4
A100 32 1 -  python     0 6 26 6
A100 32 1 -  python     0 0 32 0
H200 16 1 -  python     0 0 16 0
A100 32 4 -  torchrun   0 - 4  4
A100 8  4 -  torchrun   0 - 1  1
A100 4  4 -  torchrun   0 - 1  0
V100 32 4 32 torchrun   0 - 32 4
"""


@pytest.mark.parametrize(
    "device, cpus, ranks, omp, launcher, asked, given_workers, threads, workers", rows(THREADS_TABLE, 9)
)
def test_threads_and_workers(device, cpus, ranks, omp, launcher, asked, given_workers, threads, workers):
    plan = decide(
        ask(
            num_threads=int(asked),
            dataloader_num_workers=None if given_workers == "-" else int(given_workers),
        ),
        facts(
            device, ranks=int(ranks), cpus=int(cpus), omp=None if omp == "-" else int(omp), launcher=launcher
        ),
    )
    assert (plan.threads, plan.dataloader_num_workers) == (int(threads), int(workers))


@pytest.mark.parametrize(
    "cpus, launcher_cpus, threads, workers, reason",
    [
        (8, 32, 4, 4, "32 CPUs / 4 process(es) on this node - 4 dataloader workers"),  # exclusive: its 8
        (16, 32, 4, 4, "32 CPUs / 4 process(es) on this node - 4 dataloader workers"),  # a NUMA node, 2 GPUs
        (4, 32, 1, 3, "32 CPUs / 4 process(es) on this node, at most the 4 this process is bound to - 3 "),
        (32, 32, 4, 4, "32 CPUs / 4 process(es) on this node - 4 dataloader workers"),  # not bound
    ],
    ids=["exclusive", "numa-node", "bound-to-fewer", "unbound"],
)
def test_a_process_bound_to_cpus_of_its_own_is_not_divided_again(
    cpus, launcher_cpus, threads, workers, reason
):
    """torchrun --numa-binding (job_ddp.sh's default on GPU nodes) starts each of a node's 4 processes on
    CPUs near its GPU: its mask is then its share already (or its NUMA node's, shared with another GPU's
    process), and the node's CPUs are its launcher's. Divided by 4 again, a worker bound to 8 CPUs got 1
    loader worker and 1 thread."""
    plan = decide(ask(), facts("A100", ranks=4, cpus=cpus, launcher_cpus=launcher_cpus))
    assert (plan.threads, plan.dataloader_num_workers) == (threads, workers)
    assert f"threads={threads} ({reason}" in plan.log_line()


@pytest.mark.parametrize(
    "device_facts, words",
    [  # a GPU job whose torch sees no GPU; one process on several GPUs
        (
            facts("CPU", asked="CUDA_VISIBLE_DEVICES=0, SLURM_JOB_GPUS=0"),
            [
                "asked for a GPU (CUDA_VISIBLE_DEVICES=0, SLURM_JOB_GPUS=0)",
                "torch 2.13.0",
                "CPU-only build",
                "torch.cuda.is_available()=False",
                "--use_cpu",
            ],
        ),
        (facts("A100", gpus_visible=4), ["torchrun --nproc_per_node=4"]),
    ],
)
def test_a_gpu_setup_that_cannot_run_is_refused_unless_the_cpu_is_asked_for(device_facts, words):
    with pytest.raises(PlanError) as err:
        decide(ask(), device_facts)
    assert all(w in str(err.value) for w in words), err.value
    assert decide(ask(use_cpu=True), device_facts).device == "cpu"  # on purpose
    assert decide(ask(), facts("A100", ranks=4, gpus_visible=4)).world_size == 4  # one process per GPU


def test_reporting_tensorboard_is_ours_and_profile_dir():
    plan = decide(
        ask(report_to=["tensorboard", "wandb"], output_dir="o", profile=True, do_train=True), facts("CPU")
    )
    assert plan.tensorboard and plan.report_to == ("wandb",) and plan.profile_dir == "o/profiler"
    fields = plan.training_fields(None)
    assert fields["report_to"] == ["wandb"] and fields["use_cpu"] is True
    off = decide(ask(report_to="none"), facts("A100"))
    assert not off.tensorboard and off.profile_dir is None and off.training_fields(None)["use_cpu"] is False
    # "all", as transformers reads it: every integration installed, ours for TensorBoard (its own callback
    # wrote event files beside a PLAN saying tensorboard=off)
    every = decide(ask(report_to="all"), facts("CPU"))
    assert every.tensorboard and not {"all", "tensorboard"} & set(every.training_fields(None)["report_to"])


@pytest.mark.parametrize(
    "device_facts, given, parts",
    [  # a stop vote syncs a GPU: sparse on several of them
        (
            facts("H100", ranks=4),
            {},
            (
                "PLAN device=cuda(NVIDIA H100)",
                "precision=bf16 (auto: GPU sm_90 has bf16)",
                "tf32=on",
                "threads=4 (32 CPUs / 4 process(es) on this node - 4 dataloader workers)",
                "dataloader_workers=4 (auto: GPU: collation beside the step, up to 4 per process; "
                "0 measured 0.76x on one H200)",
                "world_size=4",
                "launcher=torchrun",
                "stop_vote_every=10",
                "dropout_mask=torch (auto: GPU)",
                "pad_to_buckets=off attn_backend=flash,efficient,math (auto: torch 2.13 runs cuDNN attention "
                "first on sm_90 (cuDNN 91900) and it plans every new batch shape; shapes vary: cuDNN off)",
                "compile=off (auto: 4 processes: measured on one GPU only) cuda_graphs=off (auto: 4 "
                "processes: measured on one GPU only)",
            ),
        ),
        (
            facts("H200"),
            {"do_train": True},
            (
                "pad_to_buckets=128,192,256,320,384 (auto: CUDA graphs, one per shape: 5 widths from 384/3 "
                "to 384) attn_backend=all (auto: batch shapes fixed: cuDNN plans each shape once)",
                "compile=on (backend=inductor mode=reduce-overhead dynamic=True recompile_limit=torch "
                f"scope=model cache={CACHE}: auto: one GPU process, 7377 training batches: one H200: 14.5 ms "
                "a step against 44 eager, ~130 s to compile; 1.39x over 2 epochs; auto: CUDA graphs record "
                "each shape: one graph compiled, its sizes symbolic over 6 batch shapes per pass) "
                "cuda_graphs=on (auto: GPU, fixed batch shapes, one process: a step replays graphs, not "
                "kernel by kernel)",
            ),
        ),
        (
            facts("H200"),
            {
                "pad_to_buckets": "on",
                "torch_compile": True,
                "compile_shapes": "static",
                "compile_scope": "regions",
                "compile_cache_dir": "/kept/compile",
            },
            (
                "pad_to_buckets=128,192,256,320,384 (on: 5 widths from 384/3 to 384, multiples of 8) "
                "attn_backend=all (auto: batch shapes fixed: cuDNN plans each shape once)",
                "compile=on (backend=inductor mode=reduce-overhead dynamic=False recompile_limit=14 "
                "scope=regions cache=/kept/compile: 6 batch shapes per pass, one graph each) cuda_graphs=on "
                "(auto: GPU, fixed batch shapes, one process: a step replays graphs, not kernel by kernel)",
            ),
        ),
        (
            facts("H200"),
            {"do_train": True, "speed_defaults": False},
            ("pad_to_buckets=off", "compile=off (auto: --speed_defaults false)"),
        ),
        (
            facts("H200"),
            {"do_eval": True},
            ("pad_to_buckets=off", "compile=off (auto: no --do_train: the compile pays over training steps)"),
        ),
        (
            facts("H200"),
            {"torch_compile": False},
            (
                "pad_to_buckets=off",
                "compile=off (--torch_compile false) cuda_graphs=off (--torch_compile false)",
            ),
        ),
        (
            facts("CPU"),
            {"pad_to_buckets": "64,128,384", "torch_compile": True, "torch_compile_mode": "reduce-overhead"},
            (
                "dataloader_workers=0 world_size=1",
                "pad_to_buckets=64,128,384 attn_backend=all (auto: CPU: torch's own choice (flash or math))",
                "compile=on (backend=inductor mode=reduce-overhead dynamic=False recompile_limit=10 "
                f"scope=model cache={CACHE}: 4 batch shapes per pass, one graph each) cuda_graphs=off (CPU: "
                "CUDA graphs need a GPU)",
            ),
        ),
        (
            facts("A100"),
            {"torch_compile": True, "pad_to_buckets": "off", "dataloader_num_workers": 0},
            (
                "dataloader_workers=0 (--dataloader_num_workers 0)",
                "attn_backend=all (auto: torch 2.13 does not run cuDNN attention first here)",
                "compile=on (backend=inductor mode=default dynamic=auto recompile_limit=torch "
                f"scope=model cache={CACHE}: batch shapes vary: torch makes them dynamic; --pad_to_buckets "
                "fixes them) cuda_graphs=off (auto: batch shapes vary: a graph recorded per shape; "
                "--pad_to_buckets fixes them)",
            ),
        ),
        (
            facts("AVX512BF16"),
            {},
            (
                "PLAN device=cpu precision=bf16 (auto: CPU has avx512_bf16) tf32=off threads=32 (32 CPUs",
                "dropout_mask=bulk (auto: AuthenticAMD CPU, where torch draws masks one element at a time)",
            ),
        ),
        (facts("AMX"), {}, ("precision=bf16 (auto: CPU has amx_bf16)",)),
        (
            facts("CPU"),
            {},
            ("precision=fp32 (auto: CPU has no amx_bf16 or avx512_bf16)", "stop_vote_every=1"),
        ),
        (facts("CPU", ranks=4), {}, ("stop_vote_every=1",)),
        (facts("A100"), {}, ("stop_vote_every=1",)),
        (
            facts("CPU", vendor="GenuineIntel"),
            {},
            ("dropout_mask=torch (auto: Intel CPU, where torch draws masks in",),
        ),
        (facts("CPU"), {"dropout_mask": "torch"}, ("dropout_mask=torch (--dropout_mask torch)",)),
        (facts("A100"), {"speed_defaults": False}, ("dataloader_workers=0 (--speed_defaults false)",)),
        (
            facts("CPU", vendor="GenuineIntel"),
            {"dropout_mask": "bulk"},
            ("dropout_mask=bulk (--dropout_mask bulk)",),
        ),
        (
            facts("CPU"),
            {"attn_implementation": "eager"},
            (
                "dropout_mask=torch (auto: --attn_implementation eager keeps its own attention)",
                "attn_backend=n/a",
            ),
        ),
    ],
)
def test_plan_log_line_names_every_decision(device_facts, given, parts):
    plan = decide(ask(**given), device_facts, TWO_EPOCHS)
    assert all(part in plan.log_line() for part in parts), plan.log_line()
    assert f"dropout_mask={plan.dropout_mask} (" in plan.log_line()


def test_more_processes_than_gpus_on_a_node_are_refused():
    """Two ranks on one GPU: NCCL stops with a duplicate-GPU traceback once the model is built."""
    with pytest.raises(PlanError, match="^4 processes on this node, but torch sees 1 GPU: "):
        decide(ask(), facts("A100", ranks=4, gpus_visible=1))
    assert decide(ask(), facts("A100", ranks=4)).world_size == 4  # one GPU each
    assert decide(ask(use_cpu=True), facts("A100", ranks=4, gpus_visible=1)).device == "cpu"


def test_bulk_masks_are_refused_beside_an_attention_asked_for_by_name_or_a_compile():
    # bulk masks route attention through their own SDPA call: the eager attention asked for would not run
    with pytest.raises(PlanError, match="--dropout_mask bulk .* contradicts --attn_implementation eager"):
        decide(ask(dropout_mask="bulk", attn_implementation="eager"), facts("CPU"))
    # drawn between the graphs, they broke a compiled run into many graphs (slower than eager)
    for device in ("CPU", "H200"):
        with pytest.raises(PlanError, match="^--dropout_mask bulk draws masks outside the compiled graphs"):
            decide(ask(dropout_mask="bulk", torch_compile=True), facts(device), TWO_EPOCHS)
    # a compile not asked for stays off for them (it was refused once the batches were counted)
    plan = decide(ask(do_train=True, dropout_mask="bulk"), facts("H200"), TWO_EPOCHS)
    assert not plan.torch_compile and plan.dropout_mask == "bulk", plan.log_line()
    assert plan.compile_reason == "auto: --dropout_mask bulk, which a compile cannot take"


def test_a_gpu_process_with_one_cpu_gets_no_workers_and_is_told_why():
    plan = decide(ask(), facts("H100", cpus=1))
    assert plan.dataloader_num_workers == 0
    assert plan.workers_reason == "auto: GPU: no CPU to spare beside the process's own (1 CPU per process)"


@pytest.mark.parametrize(
    "given, says",
    [
        ({"dataloader_num_workers": -1}, "--dataloader_num_workers -1: give a number >= 0"),
        ({"num_threads": -3}, "--num_threads -3: give a number >= 0"),  # was ignored
        ({"per_device_eval_batch_size": 0}, "--per_device_eval_batch_size 0: give a number >= 1"),
        ({"per_device_train_batch_size": -1}, "--per_device_train_batch_size -1: give a number >= 1"),
        ({"gradient_accumulation_steps": 0}, "--gradient_accumulation_steps 0: give a number >= 1"),
        ({"bf16_full_eval": True}, "--bf16_full_eval casts the model itself for evaluation, outside"),
        ({"fp16_full_eval": True}, "--fp16_full_eval casts the model itself for evaluation, outside"),
        ({"dataloader_drop_last": True, "do_eval": True}, "--dataloader_drop_last drops the last batch"),
        ({"dataloader_drop_last": True, "do_predict": True}, "--dataloader_drop_last drops the last batch"),
        (
            {"dataloader_drop_last": True, "do_train": True, "eval_strategy": "epoch"},
            "--dataloader_drop_last drops the last batch",
        ),
    ],
)
def test_what_no_run_can_have_or_the_plan_would_not_say_is_refused(given, says):
    """Each was a traceback from torch or transformers, ignored, or (the full-eval casts) an evaluation in
    half precision under a PLAN and EFFECTIVE saying fp32."""
    with pytest.raises(PlanError, match=f"^{re.escape(says)}"):
        decide(ask(**given), facts("CPU"))


def test_a_training_that_does_not_evaluate_may_drop_its_last_batch():
    assert decide(ask(dataloader_drop_last=True, do_train=True), facts("CPU")).device == "cpu"


def test_uneven_batches_are_refused_in_a_run_of_several_processes(tmp_path):
    """--accelerator_config even_batches false: 2 gloo processes training 9 features at 4 waited --ddp_timeout
    for the step one never took, and evaluating 13 questions, the gather aborted (SIGABRT); refused. One
    process has nothing to even out."""
    uneven = read_flags(["--output_dir", str(tmp_path), "--accelerator_config", '{"even_batches": false}'])
    _, flags = decide_and_build(uneven, facts("CPU"))
    assert not flags.training.accelerator_config.even_batches
    refuse_uneven_batches(flags.training, world_size=1)
    with pytest.raises(
        UsageError, match=r"^--accelerator_config even_batches false gives the processes unequal"
    ):
        refuse_uneven_batches(flags.training, world_size=2)
    _, even = decide_and_build(read_flags(["--output_dir", str(tmp_path)]), facts("CPU"))
    refuse_uneven_batches(even.training, world_size=2)
    # as run_qa.py builds its flags: refused for the plan's processes
    two = dataclasses.replace(facts("CPU"), world_size=2, local_world_size=2)
    with pytest.raises(UsageError, match=r"^--accelerator_config even_batches false"):
        decide_and_build(uneven, two)


@pytest.mark.parametrize(
    "given, named",
    [
        ({"torch_compile_backend": "eager"}, "--torch_compile_backend eager"),
        ({"torch_compile_mode": "reduce-overhead"}, "--torch_compile_mode reduce-overhead"),
    ],
)
def test_compile_turned_off_and_configured_at_once_is_refused(given, named):
    """A backend or mode alone turns the compile on (as in TrainingArguments); beside --torch_compile false it
    compiled, the false unsaid."""
    with pytest.raises(PlanError, match=f"^--torch_compile false contradicts {named}, which compiles"):
        decide(ask(torch_compile=False, **given), facts("CPU"))
    assert decide(ask(**given), facts("CPU")).torch_compile


@pytest.mark.parametrize(
    "device, implementation, precision, modules, words",
    [
        ("H100", "flash_attention_2", "auto", ("flash_attn",), None),
        ("H100", "flash_attention_2", "auto", ("kernels",), None),  # transformers takes the hub's kernel
        ("H100", "flash_attention_4", "fp16", ("flash_attn",), None),
        ("B200", "flash_attention_4", "auto", ("kernels",), None),
        # transformers refuses FlashAttention 4 below 9.0 as the model loads
        ("A100", "flash_attention_4", "auto", ("flash_attn",), "9.0 or newer; this run is on a GPU sm_80"),
        ("RTX4090", "flash_attention_4", "auto", ("flash_attn",), "9.0 or newer; this run is on a GPU sm_89"),
        ("A100", "flash_attention_3", "auto", ("flash_attn_interface",), None),
        ("H100", "flash_attention_2", "auto", (), "needs one of the Python modules flash_attn, kernels"),
        ("H100", "flash_attention_3", "auto", ("flash_attn",), "the Python modules flash_attn_interface, "),
        ("H100", "flash_attention_2", "fp32", ("flash_attn",), "runs in bf16 or fp16 only"),
        ("V100", "flash_attention_2", "auto", ("flash_attn",), "8.0 or newer; this run is on a GPU sm_70"),
        ("CPU", "flash_attention_2", "auto", ("flash_attn",), "8.0 or newer; this run is on a CPU"),
        ("CPU", "eager", "auto", (), None),
        ("CPU", "flex_attention", "auto", (), None),
        ("H100", "foo", "auto", (), "--attn_implementation foo: give one of sdpa, eager, flex_attention, "),
    ],
)
def test_an_attention_the_run_cannot_take_is_refused_before_the_model_loads(
    device, implementation, precision, modules, words
):
    """Each was a traceback once the model loaded or at its first step (FlashAttention without a module
    that provides it, on a CPU or a GPU before Ampere, in fp32; a name transformers does not have); the
    modules are a fact of the machine."""
    request = ask(attn_implementation=implementation, precision=precision)
    if words is None:
        assert decide(request, facts(device, modules=modules)).attn_backend == attention.NOT_SDPA
        return
    with pytest.raises(PlanError, match=re.escape(words)):
        decide(request, facts(device, modules=modules))


def test_the_attention_flags_help_names_every_implementation_the_plan_takes():
    """`--help` listed three of the six (flex_attention and FlashAttention 3 and 4 were taken, unnamed)."""
    from dataclasses import fields

    from qa_hpc.flags import SpeedArguments
    from qa_hpc.plan import ATTENTION_IMPLEMENTATIONS

    (field,) = [f for f in fields(SpeedArguments) if f.name == "attn_implementation"]
    for implementation in ATTENTION_IMPLEMENTATIONS:
        assert f"'{implementation}'" in field.metadata["help"], implementation


def test_flags_given_whose_subject_the_plan_leaves_off_are_named():
    """Each was dropped without a word (PLAN compile=off and no other trace of --compile_cache_dir, say)."""
    given = ["--output_dir", "o", "--compile_cache_dir", "/c", "--compile_scope", "regions"]
    given += ["--profile_active", "3", "--logging_dir", "tb", "--attn_backend", "flash"]
    off = read_flags([*given, "--report_to", "none", "--attn_implementation", "eager"])
    assert unused_flags(off, decide(off, facts("CPU"))) == [
        "--compile_scope regions (compile off)",
        "--compile_cache_dir /c (compile off)",
        "--profile_active 3 (no --profile)",
        "--logging_dir tb (no --report_to tensorboard)",
        "--attn_backend flash (--attn_implementation eager calls no SDPA)",
    ]
    on = read_flags([*given, "--report_to", "tensorboard", "--torch_compile", "--profile", "--do_train"])
    assert unused_flags(on, decide(on, facts("CPU"))) == []
    # the profiler records training steps: an evaluation alone has none (it made an empty folder)
    evaluation = read_flags(["--output_dir", "o", "--do_eval", "--profile", "--profile_active", "3"])
    plan = decide(evaluation, facts("CPU"))
    assert plan.profile_dir is None and "profile=off" in plan.log_line()
    assert unused_flags(evaluation, plan) == [
        "--profile True (no --do_train: the profiler records training steps)",
        "--profile_active 3 (no --do_train: the profiler records training steps)",
    ]
    # an evaluation evaluates --model_name_or_path: a checkpoint named to resume from was not evaluated
    checkpoint = read_flags(["--output_dir", "o", "--do_eval", "--resume_from_checkpoint", "o/checkpoint-9"])
    assert unused_flags(checkpoint, decide(checkpoint, facts("CPU"))) == [
        "--resume_from_checkpoint o/checkpoint-9 (no --do_train: the model is --model_name_or_path's; give "
        "the checkpoint there)"
    ]
    defaults = read_flags(["--output_dir", "o", "--report_to", "none"])
    assert unused_flags(defaults, decide(defaults, facts("CPU"))) == []


@pytest.mark.parametrize(
    "device, precision, says",
    [
        (
            "A100",
            "auto",
            "auto: GPU sm_80 in bf16: measured on sm_9x in bf16 only; --torch_compile to compile",
        ),
        ("V100", "auto", "auto: GPU sm_70 in fp16: measured on sm_9x in bf16 only"),
        ("H100", "fp32", "auto: GPU sm_90 in fp32: measured on sm_9x in bf16 only"),
    ],
)
def test_the_compiled_default_stays_where_it_was_measured(device, precision, says):
    """Compile and CUDA graphs by default only on the GPUs and precision they were measured to pay on (one
    H200, bf16): elsewhere eager, saying why, until a measurement there."""
    plan = decide(ask(do_train=True, precision=precision), facts(device), TWO_EPOCHS)
    assert not plan.torch_compile and not plan.cuda_graphs, plan.log_line()
    assert plan.compile_reason.startswith(says), plan.log_line()


def test_a_compile_mode_torch_does_not_know_is_refused():
    """torch.compile's error for it ended in a fall-back to eager that blamed the backend."""
    with pytest.raises(
        PlanError, match="^--torch_compile_mode nosuch: give one of default, .*reduce-overhead"
    ):
        decide(ask(torch_compile_mode="nosuch"), facts("CPU"))


@pytest.mark.parametrize(
    "ranks, accumulation, max_steps, want",
    [  # the BASELINE: 88,524 features, 2 epochs
        (
            1,
            1,
            -1,
            [
                "PLAN_BATCH global_batch=24 (24 per device x 1 processes x 1 accumulation) "
                "optimizer_steps=7378 learning_rate=4e-05"
            ],
        ),  # 2 x ceil(88524 / 24)
        (
            8,
            1,
            -1,
            [
                "global_batch=192 (24 per device x 8 processes x 1 accumulation) optimizer_steps=924 ",
                "PLAN_SCALING global_batch_ratio=8 (x the 1-device run's 24 at the same "
                "learning_rate=4e-05): to keep the 1-device recipe: --per_device_train_batch_size 3 "
                "--gradient_accumulation_steps 1; to scale the learning rate on purpose (linear rule): "
                "--learning_rate 0.00032",
            ],
        ),  # 2 x ceil(ceil(88524 / 8) / 24)
        (
            5,
            2,
            -1,
            [
                "global_batch=240 (24 per device x 5 processes x 2 accumulation) optimizer_steps=738 ",
                "a global batch of 48 cannot be split over 5 processes",
            ],
        ),  # 2 x ceil(ceil(ceil(88524 / 5) / 24) / 2)
        (1, 1, 10, ["optimizer_steps=10 "]),
    ],
)
def test_batch_lines_say_the_global_batch_steps_and_how_to_keep_the_1_device_recipe(
    ranks, accumulation, max_steps, want
):
    args = types.SimpleNamespace(
        per_device_train_batch_size=24,
        world_size=ranks,
        learning_rate=4e-5,
        gradient_accumulation_steps=accumulation,
        num_train_epochs=2.0,
        max_steps=max_steps,
    )
    lines = batch_lines(args, 88_524)
    assert len(lines) == len(want) and all(part in line for line, part in zip(lines, want))


@pytest.mark.parametrize(
    "ranks, accumulation, epochs, max_steps, want",
    [
        # bert-base's 2 epochs of SQuAD's 88,524 features at 24: 3,689 batches an epoch (gpu_speed's
        # projection, 7,377, divides both epochs' features at once)
        (1, 1, 2.0, -1, 7_378),
        (5, 4, 2.0, -1, 1_476),  # 2 x 738 batches: an epoch's 185th step has 2 of them (not 370 steps x 4)
        (1, 4, 0.5, -1, 1_845),  # half an epoch of 3,689 batches, rounded up
        (1, 2, 2.0, 10, 20),  # --max_steps: its steps, each of the accumulated batches
    ],
)
def test_the_training_batches_are_each_forward_and_backward_pass_of_one_process(
    ranks, accumulation, epochs, max_steps, want
):
    """What the compile decision counts: a process's batches over the run, as its dataloader gives them."""
    args = types.SimpleNamespace(
        per_device_train_batch_size=24,
        world_size=ranks,
        gradient_accumulation_steps=accumulation,
        num_train_epochs=epochs,
        max_steps=max_steps,
    )
    assert training_batches(args, 88_524) == want


# device | torch | CUDA of torch's build | cuDNN ('-': none) | batch shapes (off: dynamic padding, on:
# buckets, max: --pad_to_max_length) | --attn_implementation | --attn_backend | the kernels SDPA may run, or
# "!" + refusal
# (torch >= 2.10 runs cuDNN's attention first on sm_9x/sm_10x with cuDNN > 9.15.0; CUDA < 13 builds only at
# minor 0 and 3: check_prefer_cudnn_attention in torch's sdp_utils.cpp)
ATTN_TABLE = """
H100,H200,B200,B300 2.13.0 13.0 91900 off - auto flash,efficient,math
H100,B300 2.13.0 12.8 91900 off - auto flash,efficient,math
SM101   2.13.0 12.8 91900 off - auto all
SM101   2.13.0 13.0 91900 off - auto flash,efficient,math
H100    2.10.0 13.0 91900 off - auto flash,efficient,math
H100    2.9.1  12.8 91900 off - auto all
H100    2.13.0 13.0 91500 off - auto all
H100    2.13.0 13.0 -     off - auto all
H100    2.13.0 13.0 91900 on  - auto all
H100    2.13.0 13.0 91900 max - auto all
A100,RTX4090,V100,T4 2.13.0 13.0 91900 off - auto all
CPU,AVX512BF16 2.13.0 - - off - auto all
H100    2.13.0 13.0 91900 off sdpa auto flash,efficient,math
H100,CPU 2.13.0 13.0 91900 off eager auto n/a
H100    2.13.0 13.0 91900 off flash_attention_2 cudnn n/a
H100,CPU 2.13.0 13.0 91900 off - all all
H100    2.13.0 13.0 91900 off - cudnn,math cudnn,math
H100,CPU 2.13.0 13.0 91900 off - math,flash flash,math
A100    2.13.0 13.0 91900 on  - flash,efficient,cudnn,math all
CPU     2.13.0 13.0 91900 off - efficient,cudnn !a CPU has only the flash and math SDPA kernels; name one
H100    2.13.0 13.0 91900 off - flash,fast !from flash, efficient, cudnn, math \\(unknown: fast\\)
"""


@pytest.mark.parametrize(
    "device, torch_version, cuda, cudnn, shapes, implementation, backend, want", rows(ATTN_TABLE, 8)
)
def test_the_attention_kernels_for_every_device(
    device, torch_version, cuda, cudnn, shapes, implementation, backend, want
):
    request = ask(
        attn_backend=backend,
        attn_implementation=None if implementation == "-" else implementation,
        pad_to_buckets="on" if shapes == "on" else "off",
        pad_to_max_length=shapes == "max",
    )
    device_facts = facts(
        device, torch_version=torch_version, torch_cuda=cuda, cudnn=None if cudnn == "-" else int(cudnn)
    )
    plan = decided(request, device_facts, want)
    if plan is not None:
        assert plan.attn_backend == want


# device | processes | --torch_compile | --torch_compile_backend | --torch_compile_mode | --compile_shapes |
# --pad_to_buckets (max: --pad_to_max_length) | compile | mode | dynamic | recompile limit | CUDA graphs
# ('-': not given, or none)
COMPILE_TABLE = """
CPU  1 -  -         -    -       on   off - - - off
CPU  1 -  -         -    -       auto off - - - off
H100 1 -  -         -    -       auto on reduce-overhead True - on
H200 1 -  -         -    -       auto on reduce-overhead True - on
A100 1 -  -         -    -       auto off - - - off
B200 1 -  -         -    -       auto off - - - off
V100 1 -  -         -    -       auto off - - - off
A100 1 on -         -    -       auto on reduce-overhead True - on
H100 1 -  -         -    -       on   on reduce-overhead True - on
H100 1 -  -         -    static  auto on reduce-overhead False 14 on
H100 1 -  -         -    -       off  off - - - off
H100 1 -  -         -    -       max  off - - - off
H100 4 -  -         -    -       auto off - - - off
H100 1 off -        -    -       auto off - - - off
H100 1 on -         -    -       auto on reduce-overhead True - on
H100 4 on -         -    -       auto on default - - off
H100 1 on aot_eager -    -       auto on default - - off
H100 1 on -         default -    auto on default - - off
CPU  1 on -         -    -       auto on default - - off
CPU  1 on -         -    -       off on default - - off
CPU  1 on -         -    -       on  on default False 14 off
CPU  1 on aot_eager -    -       on  on default False 14 off
CPU  1 -  eager     -    -       max on default False 6 off
CPU  1 -  -         reduce-overhead - on on reduce-overhead False 14 off
CPU  1 on -         -    static  on  on default False 14 off
CPU  1 on -         -    dynamic on  on default True - off
CPU  1 on -         -    dynamic off on default True - off
H100 1 on -         -    -       on  on reduce-overhead True - on
H100 1 on -         -    -       max on reduce-overhead True - on
H100 1 on -         -    -       off on default - - off
H100 4 on -         -    -       on  on default False 14 off
H100 1 on aot_eager -    -       on  on default False 14 off
H100 1 on -         default -    on  on default False 14 off
H100 1 on -         max-autotune-no-cudagraphs - on on max-autotune-no-cudagraphs False 14 off
H100 1 on -         max-autotune - off on max-autotune - - on
H100 4 on -         reduce-overhead - on on reduce-overhead True - on
H100 1 on -         -    dynamic on  on reduce-overhead True - on
H100 1 on -         -    dynamic off on default True - off
H100 1 on -         -    static  max on reduce-overhead False 6 on
H100 1 on cudagraphs -    -       on  on default False 14 on
H100 1 on cudagraphs -    static  on  on default False 14 on
H100 1 on cudagraphs -    -       max on default False 6 on
CPU  1 on cudagraphs -    dynamic on  on default True - off
"""


@pytest.mark.parametrize(
    "device, ranks, given, backend, mode, compile_shapes, shapes, on, want_mode, dynamic, limit, graphs",
    rows(COMPILE_TABLE, 12),
)
def test_compile_and_cuda_graphs_for_every_device(
    device, ranks, given, backend, mode, compile_shapes, shapes, on, want_mode, dynamic, limit, graphs
):
    """Not asked, compiled on one GPU process over buckets (--pad_to_buckets auto: on there), off on a CPU,
    with several processes or varying shapes; CUDA graphs on a GPU with inductor over fixed shapes in one
    process, or where a mode asks for them, with one graph of symbolic sizes under them; else static graphs
    with room for every fixed shape (training's and evaluation's: 5 buckets + a short batch each at 384, or
    384 + a short batch; prediction's short batch and one spare); what TrainingArguments gets."""
    request = ask(
        do_train=True,
        torch_compile={"-": None, "on": True, "off": False}[given],
        torch_compile_backend=None if backend == "-" else backend,
        torch_compile_mode=None if mode == "-" else mode,
        compile_shapes="auto" if compile_shapes == "-" else compile_shapes,
        pad_to_buckets="off" if shapes == "max" else shapes,
        pad_to_max_length=shapes == "max",
    )
    plan = decide(request, facts(device, ranks=int(ranks), gpus_visible=int(ranks)), TWO_EPOCHS)
    shown = {None: "-", True: "on", False: "off"}
    assert plan.torch_compile == (on == "on")
    assert (plan.compile_mode or "-", str(shown.get(plan.compile_dynamic, plan.compile_dynamic))) == (
        want_mode,
        {"False": "off", "True": "on"}.get(dynamic, dynamic),
    )
    assert (str(plan.recompile_limit or "-"), shown[plan.cuda_graphs]) == (limit, graphs)
    fields = plan.training_fields(None)
    assert (fields["torch_compile"], fields["torch_compile_mode"]) == (plan.torch_compile, plan.compile_mode)
    want_backend = (backend if backend != "-" else "inductor") if plan.torch_compile else None
    assert fields["torch_compile_backend"] == plan.compile_backend == want_backend
    # accelerate's TorchDynamoPlugin reads `dynamic` and regional compilation from the environment only;
    # torch its caches' folder
    told = {
        "False": {"ACCELERATE_DYNAMO_USE_DYNAMIC": "false"},
        "True": {"ACCELERATE_DYNAMO_USE_DYNAMIC": "true"},
    }.get(dynamic, {})
    if plan.torch_compile:
        told = {
            **told,
            "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "false",
            "TORCHINDUCTOR_CACHE_DIR": CACHE,
        }
    assert plan.environment({}) == told


@pytest.mark.parametrize(
    "given, says",
    [
        (
            {"torch_compile_backend": "cudagraphs", "compile_shapes": "dynamic"},
            "--torch_compile_backend cudagraphs replays one CUDA graph for every batch shape",
        ),
        (
            {"torch_compile_backend": "cudagraphs", "pad_to_buckets": "off"},
            "--torch_compile_backend cudagraphs replays one CUDA graph for every batch shape",
        ),
        (
            {"torch_compile_backend": "cudagraphs", "torch_compile_mode": "reduce-overhead"},
            "--torch_compile_mode reduce-overhead is inductor's; --torch_compile_backend cudagraphs takes no",
        ),
        (
            {"torch_compile_backend": "aot_eager", "torch_compile_mode": "max-autotune"},
            "--torch_compile_mode max-autotune is inductor's; --torch_compile_backend aot_eager takes no",
        ),
    ],
)
def test_a_compile_torch_would_fail_on_a_gpu_is_refused(given, says):
    """Dynamo's cudagraphs backend keys its CUDA graphs on the integer sizes it compiled for: over symbolic
    sizes or varying shapes one recording is replayed for every width and fails at the second (the trace on
    a CPU records nothing, so only the GPU would have shown it). A mode is inductor's: another backend's
    compile failed on it, and the run went on eagerly."""
    with pytest.raises(PlanError, match=f"^{re.escape(says)}"):
        decide(ask(do_train=True, torch_compile=True, **given), facts("H200"), TWO_EPOCHS)


# device | --torch_compile | --torch_compile_backend | --torch_compile_mode | --gradient_accumulation_steps |
# compile | CUDA graphs | words of PLAN's compile part, or "!" + words of the refusal
ACCUMULATION_TABLE = """
H200 - -          -               1 on  on  auto: GPU, fixed batch shapes, one process
H200 - -          -               4 off off auto: --gradient_accumulation_steps 4: CUDA graphs replayed
H200 on -         -               4 on  off auto: --gradient_accumulation_steps 4: CUDA graphs replayed
H200 on -         reduce-overhead 2 -   -   !--torch_compile_mode reduce-overhead records CUDA graphs
H200 on -         max-autotune    2 -   -   !--gradient_accumulation_steps 2 CUDA graphs replayed
H200 on -         max-autotune-no-cudagraphs 2 on off --torch_compile_mode max-autotune-no-cudagraphs
H200 on cudagraphs -              1 on  on  --torch_compile_backend cudagraphs
H200 on cudagraphs -              2 -   -   !--torch_compile_backend cudagraphs records CUDA graphs
H200 on aot_eager -               2 on  off auto: --gradient_accumulation_steps 2: CUDA graphs
CPU  on -         reduce-overhead 4 on  off CPU: CUDA graphs need a GPU
"""


@pytest.mark.parametrize(
    "device, given, backend, mode, accumulation, on, graphs, words", rows(ACCUMULATION_TABLE, 8)
)
def test_cuda_graphs_never_beside_gradient_accumulation(
    device, given, backend, mode, accumulation, on, graphs, words
):
    """torch's CUDA graph trees overwrite the gradients accumulated between micro-batches (wrong gradients,
    or a backward that raises): not asked, neither the compile measured with them nor the graphs; asked for by
    a mode or backend that records them, refused before anything loads. Other backends never get inductor's
    mode that records them (the cudagraphs backend takes none)."""
    request = ask(
        do_train=True,
        torch_compile={"-": None, "on": True}[given],
        torch_compile_backend=None if backend == "-" else backend,
        torch_compile_mode=None if mode == "-" else mode,
        gradient_accumulation_steps=int(accumulation),
    )
    if words.startswith("!"):
        with pytest.raises(PlanError, match=words[1:]):
            decide(request, facts(device), TWO_EPOCHS)
        return
    plan = decide(request, facts(device), TWO_EPOCHS)
    assert (plan.torch_compile, plan.cuda_graphs) == (on == "on", graphs == "on"), plan.log_line()
    assert words in plan.log_line(), plan.log_line()
    if backend != "-" and plan.torch_compile:
        assert plan.compile_mode == "default"  # torch hands a mode to inductor only; others take no keyword


# device | --torch_compile | training batches counted ('-': not given, or not yet counted) | compile | why
COUNT_TABLE = """
H200 -     3999 off auto: 3999 training batches, fewer than the 4000 over which the compile is won back
H200 -     4000 on  auto: one GPU process, 4000 training batches: one H200
H200 -     7377 on  auto: one GPU process, 7377 training batches: one H200
H200 true  -    on  mode=reduce-overhead dynamic=True recompile_limit=torch scope=model cache=
H200 true  12   on  mode=reduce-overhead dynamic=True recompile_limit=torch scope=model cache=
H200 false 7377 off --torch_compile false
H200 -     -    off auto: decided once the training batches are counted
CPU  -     -    off auto: CPU: eager
CPU  -     7377 off auto: CPU: eager
"""


@pytest.mark.parametrize("device, given, batches, on, why", rows(COUNT_TABLE, 5))
def test_the_compile_not_given_waits_for_the_batch_count_and_pays_only_over_enough(
    device, given, batches, on, why
):
    """A training run's compile, not given, where only the count is left to decide (one GPU process), is
    decided once its batches are counted (run_qa decides the plan again then): on where the measured cold
    compile is won back by the faster steps (COMPILE_PAYS_FROM_BATCHES), off for fewer (MiniLM's 752-batch
    recipe: 137 s compiled against 68 s eager on one H200); buckets and CUDA graphs go with it. Given, as
    given, whatever the count; a CPU's plan never waits."""
    assert COMPILE_PAYS_FROM_BATCHES == 4000
    request = ask(do_train=True, torch_compile={"-": None, "true": True, "false": False}[given])
    plan = decide(request, facts(device), None if batches == "-" else int(batches))
    assert plan.awaits_batch_count == (why == COMPILE_AWAITS_COUNT)
    assert plan.torch_compile == (on == "on") and plan.cuda_graphs == (on == "on")
    assert bool(plan.pad_to_buckets) == (on == "on")  # --pad_to_buckets auto: on under CUDA graphs
    assert why in plan.log_line(), plan.log_line()


def test_a_compiler_that_failed_leaves_the_eager_plan_saying_why():
    """Where the compiler cannot work (found before training), the run takes the plan --torch_compile false
    gives: the buckets --pad_to_buckets auto chose for the CUDA graphs go with the compile (eager over them:
    0.97x on one H200), and the attention kernels are those for varying shapes; PLAN says why."""
    request = ask(do_train=True)
    compiled = decide(request, facts("H200"), TWO_EPOCHS)
    assert compiled.torch_compile and compiled.pad_to_buckets and compiled.attn_backend == "all"
    eager = decide_after_compile_failed(request, facts("H200"), compiled.compile_backend)
    assert eager == dataclasses.replace(
        decide(ask(do_train=True, torch_compile=False), facts("H200")),
        compile_reason="fallback=eager: --torch_compile_backend inductor failed here",
        cuda_graphs_reason="fallback=eager",
    )
    assert (eager.pad_to_buckets, eager.attn_backend) == ((), "flash,efficient,math")
    line = eager.log_line()
    assert "compile=off (fallback=eager: --torch_compile_backend inductor failed here) " in line
    assert "cuda_graphs=off (fallback=eager)" in line and "pad_to_buckets=off attn_backend=flash," in line


@pytest.mark.parametrize(
    "given, words",
    [
        (
            {"pad_to_buckets": "100,384"},
            "--pad_to_buckets 100,384: give auto, off, on, or comma-separated widths",
        ),
        ({"pad_to_buckets": "128,256"}, "the largest equal to --max_seq_length \\(384\\)"),
        (
            {"pad_to_buckets": "on", "pad_to_max_length": True},
            "--pad_to_buckets on contradicts --pad_to_max_length",
        ),
    ],
)
def test_a_bad_bucket_request_is_a_usage_error(given, words):
    with pytest.raises(PlanError, match=words) as err:
        decide(ask(**given), facts("H100"))
    assert isinstance(err.value, UsageError)  # exit 2


# device | --dataloader_num_workers | --dataloader_persistent_workers | workers | persistent ('-': not given)
PERSISTENT_TABLE = """
CPU  -  -     0 off no dataloader workers
H100 -  -     4 on  auto: workers forked once per split, not once per pass
CPU  2  -     2 on  auto: workers forked once per split, not once per pass
H100 4  false 4 off --dataloader_persistent_workers false
H100 0  -     0 off no dataloader workers
CPU  2  true  2 on  --dataloader_persistent_workers true
CPU  -  true  - !   --dataloader_persistent_workers true needs dataloader workers
"""


@pytest.mark.parametrize("device, workers, persistent, want_workers, on, reason", rows(PERSISTENT_TABLE, 6))
def test_dataloader_workers_persist_wherever_there_are_some(
    device, workers, persistent, want_workers, on, reason
):
    """A pass that forks new workers while the last pass's threads end can deadlock its child (CPython before
    gh-112275): workers are kept from pass to pass unless the flag says otherwise; asked for without
    workers, it is refused."""
    request = ask(
        dataloader_num_workers=None if workers == "-" else int(workers),
        dataloader_persistent_workers=None if persistent == "-" else persistent == "true",
    )
    if on == "!":
        with pytest.raises(UsageError, match=reason):
            decide(request, facts(device))
        return
    plan = decide(request, facts(device))
    assert (plan.dataloader_num_workers, plan.persistent_workers) == (int(want_workers), on == "on")
    assert f"persistent_workers={on} ({reason})" in plan.log_line()
    assert plan.training_fields(None)["dataloader_persistent_workers"] is (on == "on")


@pytest.mark.parametrize("given, where", [(None, "device"), (True, "device"), (False, "off")])
def test_the_loss_filter_runs_on_the_device_and_the_trainers_own_check_never(given, where):
    """--logging_nan_inf_filter (transformers' flag, default true) is honoured by QuestionAnsweringTrainer
    without a host sync per step; the Trainer's own check, which waits for every step's loss, stays off."""
    plan = decide(ask() if given is None else ask(logging_nan_inf_filter=given), facts("H100"))
    said = "true" if given is None else str(given).lower()
    assert plan.loss_filter == where
    assert plan.log_line().endswith(f" loss_filter={where} (--logging_nan_inf_filter {said})")
    assert plan.training_fields(None)["logging_nan_inf_filter"] is False


def test_static_graphs_over_varying_shapes_are_a_usage_error():
    """A graph per sequence length of dynamic padding would pass torch's recompile limit and run eagerly."""
    request = ask(torch_compile=True, compile_shapes="static", pad_to_buckets="off")
    with pytest.raises(UsageError, match="--compile_shapes static needs fixed batch shapes"):
        decide(request, facts("H100"))
    assert decide({**request, "pad_to_buckets": "on"}, facts("H100")).compile_dynamic is False


# --- what really runs, read back and checked against the plan ----------------------------------------------
def test_the_trainer_gets_the_parsed_flags_plus_the_plan_and_any_difference_stops_the_run(
    tiny_bert, demo_files, tmp_path, process_settings
):
    """Built and read back in process: the settings path of run_qa.setup, the Trainer, the effective
    settings."""
    import run_qa
    from qa_hpc.preemption import StopRequest

    argv = tiny_flags(
        tiny_bert,
        tmp_path / "out",
        "--do_train",
        "--train_file",
        str(demo_files["train"]),
        "--max_steps",
        "1",
        "--num_threads",
        "1",
    )
    device_facts = read_device_facts()
    values = read_flags(argv)
    plan, flags = decide_and_build(values, device_facts)
    run = run_qa.setup(values, flags, plan, device_facts, StopRequest())
    assert run.effective.threads == torch.get_num_threads() == 1
    assert run.plan is plan and run.trainer.args is flags.training is run.args  # a CPU's plan never waits
    # the parsed TrainingArguments (no plan) with the plan's fields put in: what the Trainer must get
    expected = {**build_flags(values, {}).training.to_dict(), **plan.training_fields(values["tf32"])}
    expected["dataloader_pin_memory"] = False  # TrainingArguments itself turns pinned memory off on the CPU
    assert run.trainer.args.to_dict() == expected
    run.effective.check(plan)  # the same: no error
    assert run.effective.loss_filter == "device" and run.trainer.loss_filter
    with pytest.raises(
        RuntimeError,
        match="settings: precision: planned fp32, effective bf16; param_dtype: planned "
        "float32, effective float16; threads: planned 1, effective 8; loss_filter: planned device, "
        "effective host$",
    ):
        changed = {"precision": "bf16", "param_dtype": "float16", "threads": 8, "loss_filter": "host"}
        dataclasses.replace(run.effective, **changed).check(plan)


def test_a_setting_that_did_not_take_stops_the_run_and_is_recorded_with_both(
    tiny_bert, demo_files, tmp_path, monkeypatch, capsys, process_settings
):
    """run_qa's entry point, its model and Trainer built, reading back a setting other than planned: the
    rank and pid in one ERROR line, then the RuntimeError's traceback (exit 1), and run_summary.json says
    failed, with the plan, what was really used and the difference. Logging and signal handlers stay the
    test process's; nothing trains."""
    import run_qa
    from qa_hpc.effective import Effective
    from qa_hpc.outputs import SUMMARY_FILE
    from qa_hpc.record import RunRecord

    read_back = Effective.read
    monkeypatch.setattr(run_qa, "setup_logging", lambda args: None)
    monkeypatch.setattr(run_qa.StopRequest, "install", lambda self: None)
    monkeypatch.setattr(
        run_qa.Effective, "read", lambda trainer: dataclasses.replace(read_back(trainer), threads=8)
    )
    out = tmp_path / "out"
    train = ("--do_train", "--train_file", str(demo_files["train"]), "--num_threads", "1", "--use_cpu")
    monkeypatch.setattr(sys, "argv", ["run_qa.py", *tiny_flags(tiny_bert, out, *train)])
    with pytest.raises(RuntimeError, match="settings: threads: planned 1, effective 8$"):
        run_qa.cli()
    error = f"ERROR: rank 0 (pid {os.getpid()}) failed: RuntimeError: the run would not use the planned"
    assert capsys.readouterr().err.splitlines()[-1].startswith(error)  # after the progress bars
    recorded = RunRecord.load(out / SUMMARY_FILE)
    assert (recorded.status, recorded.exit_code) == ("failed", 1)
    assert recorded.error.endswith("threads: planned 1, effective 8"), recorded.error
    assert (recorded.plan.threads, recorded.effective.threads) == (1, 8)
    assert not (out / "trainer_state.json").exists()  # stopped before training


def test_a_plan_waiting_for_the_batch_count_is_decided_again_and_logged_once_they_are_counted(
    tiny_bert, demo_files, tmp_path, caplog, process_settings
):
    """run_qa.setup given the plan a GPU process decides before its data is read (the compile waiting for the
    training batches; made up here, on a CPU): once the data is featurized, the plan is decided again with
    them counted, the flags built again with it, and PLAN logged once, then, with the final decision. The
    progress bars stay as the first flags had them (TRANSFORMERS_VERBOSITY=error: none), though the log level
    they were derived from is info by then."""
    import run_qa
    from qa_hpc.preemption import StopRequest

    train = ("--do_train", "--train_file", str(demo_files["train"]), "--num_threads", "1", "--use_cpu")
    device_facts = read_device_facts()
    # no --disable_tqdm given (tiny_flags gives it): transformers derives it from its log level
    values = {**read_flags(tiny_flags(tiny_bert, tmp_path / "out", *train)), "disable_tqdm": None}
    verbosity = transformers.logging.get_verbosity()
    try:
        transformers.logging.set_verbosity_error()  # as TRANSFORMERS_VERBOSITY=error sets it
        plan, flags = decide_and_build(values, device_facts)
        waiting = dataclasses.replace(
            plan, compile_reason=COMPILE_AWAITS_COUNT, cuda_graphs_reason=COMPILE_AWAITS_COUNT
        )
        transformers.logging.set_verbosity_info()  # as run_qa.setup_logging sets it on the main process
        with caplog.at_level(logging.INFO, logger="run_qa"):
            run = run_qa.setup(values, flags, waiting, device_facts, StopRequest())
    finally:
        transformers.logging.set_verbosity(verbosity)
    assert run.plan == plan and not run.plan.awaits_batch_count  # this CPU's plan: compile off, not waiting
    run.effective.check(run.plan)  # the flags built again are the ones the Trainer uses
    assert run.flags is not flags and run.trainer.args is run.flags.training is run.args
    assert flags.training.disable_tqdm and run.args.disable_tqdm
    said = [record.getMessage() for record in caplog.records if record.name == "run_qa"]
    assert [line for line in said if line.startswith("PLAN ")] == [plan.log_line()]
    assert said.index(plan.log_line()) > min(
        i for i, line in enumerate(said) if line.startswith("DISTRIBUTED")
    )


@pytest.mark.parametrize("precision, want", [("bf16", "bfloat16"), ("fp32", "float32")])
def test_precision_applies_to_evaluation(tiny_bert, tmp_path, precision, want):
    """bf16 is autocast in the eval forward too (its matmuls run in bf16); fp32 stays fp32."""
    _, flags = decide_and_build(
        read_flags(["--output_dir", str(tmp_path / "o"), "--report_to", "none", "--precision", precision]),
        read_device_facts(),
    )
    model, seen = AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert)), []
    model.bert.encoder.layer[0].attention.self.query.register_forward_hook(
        lambda m, i, o: seen.append(str(o.dtype))
    )
    Trainer(model=model, args=flags.training).predict(
        datasets.Dataset.from_dict({"input_ids": [[101, 2000, 102] * 4], "attention_mask": [[1] * 12]})
    )
    assert seen == [f"torch.{want}"]


def test_a_json_flags_file_is_held_to_the_command_lines_names_and_choices(tmp_path):
    good, bad_choice, unknown = (tmp_path / f"{name}.json" for name in ("good", "bad_choice", "unknown"))
    good.write_text('{"output_dir": "out", "precision": "bf16", "num_threads": 2, "ddp_backend": null}')
    bad_choice.write_text('{"output_dir": "out", "precision": "fp8"}')
    unknown.write_text('{"output_dir": "out", "precison": "bf16"}')
    values = read_flags([str(good)])
    assert (values["precision"], values["num_threads"], values["doc_stride"]) == ("bf16", 2, 128)
    # strings are what the command line would make of them: "false" is no compile, "2" two threads
    strings = tmp_path / "strings.json"
    given = {"torch_compile": "false", "num_threads": "2", "bf16": "true", "speed_defaults": "false"}
    strings.write_text(json.dumps({"output_dir": "out", **given}))
    assert {k: read_flags([str(strings)])[k] for k in given} == {  # a switch on by default too
        "torch_compile": False,
        "num_threads": 2,
        "bf16": True,
        "speed_defaults": False,
    }
    strings.write_text('{"output_dir": "out", "num_threads": "two"}')
    with pytest.raises(
        UsageError, match=rf"^{strings}: key 'num_threads': 'two' is not a value of this flag"
    ):
        read_flags([str(strings)])
    choices = "auto, fp32, bf16, fp16"
    with pytest.raises(UsageError, match=rf"^{bad_choice}: key 'precision': 'fp8' is not one of {choices}$"):
        read_flags([str(bad_choice)])
    with pytest.raises(UsageError, match=rf"^{unknown}: unknown keys \(not flags of run_qa.py\): precison$"):
        read_flags([str(unknown)])


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8' (choose from "),
        (["--learning_rate"], "argument --learning_rate/--learning-rate: expected one argument"),
        (
            ["--num_train_epochs", "two"],
            "argument --num_train_epochs/--num-train-epochs: invalid float value",
        ),
        (["--no_such_flag", "1"], "unknown arguments (not flags of run_qa.py): --no_such_flag 1"),
        # argparse would take a prefix of a flag for the flag, which a JSON file of flags refuses
        (["--learning_rat", "1e-4"], "unknown arguments (not flags of run_qa.py): --learning_rat 1e-4"),
    ],
)
def test_a_bad_command_line_is_one_usage_error_not_the_usage_text(argv, says):
    """argparse's own complaints end the run as any bad input does (one ERROR line, exit 2), not with the
    usage text of every flag."""
    with pytest.raises(UsageError) as err:
        read_flags(["--output_dir", "out", *argv])
    assert str(err.value).startswith(says), err.value


@pytest.mark.parametrize("name", ["train_file", "validation_file", "test_file"])
def test_an_empty_data_file_name_is_a_usage_error(name, process_settings):
    """--validation_file "" (a job script's unset variable) read the current folder: 'is a directory',
    naming neither the flag nor a file."""
    with pytest.raises(UsageError, match=f"^--{name} is empty: give a data file, or leave the flag out$"):
        decide_and_build(read_flags(["--output_dir", "out", f"--{name}", ""]), read_device_facts())


def test_a_json_file_of_flags_is_read_alone():
    """Flags after the file were taken for unknown arguments, the file's name among them."""
    with pytest.raises(UsageError, match=r"^a JSON file of flags is read alone: run_qa.py args.json; put "):
        read_flags(["args.json", "--max_steps", "2"])


@pytest.mark.parametrize("name", ["max_train_samples", "max_eval_samples", "max_predict_samples"])
def test_a_question_limit_below_one_is_a_usage_error(name, process_settings):
    """0 (or less) selects no question: the run used to fail later, in the features, with a traceback."""
    with pytest.raises(UsageError, match=f"^--{name} must be at least 1 .*, got 0$"):
        decide_and_build(read_flags(["--output_dir", "out", f"--{name}", "0"]), read_device_facts())
