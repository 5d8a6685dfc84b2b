"""Observability without a training run: FLOPs and MFU, the memory estimate and measurement, the profiler's
schedule driven with real torch work, and TensorBoard's tags read back with TensorBoard's own reader from
callbacks driven as the Trainer drives them."""

from __future__ import annotations

import json
import logging
import types

import numpy as np
import pytest
import torch
from fixtures.outputs import profiler_steps, scalars, tensorboard_events
from tensorboard.plugins.hparams import plugin_data_pb2
from torch.profiler import ProfilerActivity
from transformers import (
    AutoModelForQuestionAnswering,
    BartConfig,
    BertConfig,
    BertForQuestionAnswering,
    Trainer,
    TrainerControl,
    TrainerState,
    XLNetConfig,
)
from transformers.integrations import TensorBoardCallback

from qa_hpc.device import read_device_facts
from qa_hpc.errors import UsageError
from qa_hpc.flags import Flags, decide_and_build, read_flags
from qa_hpc.model import ModelShape
from qa_hpc.observe.efficiency import peak_tflops, train_efficiency, train_flops_per_sequence
from qa_hpc.observe.memory import anatomy_estimate, measure_process, memory_report
from qa_hpc.observe.profiler import ProfilerCallback
from qa_hpc.observe.run import finish_observability, observability_callbacks
from qa_hpc.observe.tensorboard import GPU_MEMORY, TensorBoard
from qa_hpc.plan import RunPlan
from qa_hpc.preemption import take_trained_state
from qa_hpc.record import Memory, Params


def _bert(**config) -> BertForQuestionAnswering:
    return BertForQuestionAnswering(BertConfig(**config))


# --- efficiency ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, precision, tf32, want",
    [
        ("NVIDIA A100-PCIE-40GB", "fp32", True, 156.0),
        ("NVIDIA A100-PCIE-40GB", "fp32", False, 19.5),
        ("NVIDIA H100 PCIe", "bf16", False, 756.0),
        ("NVIDIA H200 NVL", "bf16", False, 835.0),  # not the SXM H200's 989
        ("NVIDIA H200", "bf16", False, 989.0),
        ("NVIDIA L40", "bf16", False, 181.0),  # the longest name first
        ("NVIDIA L4", "bf16", False, 121.0),
        ("Some Future GPU", "bf16", False, None),  # A100 bf16 and cpu: below
    ],
)
def test_peak_table(name, precision, tf32, want):
    assert peak_tflops(name, precision, tf32) == want


@pytest.mark.parametrize(
    "config",
    [
        # transformer.word_embedding
        XLNetConfig(vocab_size=1000, d_model=64, n_layer=2, n_head=2, d_inner=128),
        BartConfig(  # model.shared, and learned positions under embed_positions
            vocab_size=1000,
            d_model=64,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
        ),
    ],
    ids=["xlnet", "bart"],
)
def test_the_flop_count_leaves_out_embedding_tables_not_named_embeddings(config):
    with torch.device("meta"):
        model = AutoModelForQuestionAnswering.from_config(config)
    # transformers' own count leaves out every nn.Embedding: a table costs no matmul FLOPs, whatever its name
    assert ModelShape.of(model).non_embedding_params == model.num_parameters(exclude_embeddings=True)


def test_train_efficiency_arithmetic():
    with torch.device("meta"):  # shapes only: no memory, no init time
        shape, lengths = ModelShape.of(_bert()), np.array([100, 200, 384])
    # BERT-base: 12 layers x 7.1M + pooler + QA head = ~85.5M non-embedding parameters, 12 layers of 768
    per_sequence = train_flops_per_sequence(np.array([384]), shape.non_embedding_params, 12, 768)[0]
    assert per_sequence == pytest.approx(212e9, rel=0.03)
    eff = train_efficiency(lengths, 2.0, 10.0, shape, "NVIDIA A100-SXM4-80GB", 4, "bf16", True)
    flops = 2 * sum(6 * shape.non_embedding_params * s + 12 * 12 * 768 * s * s for s in lengths)
    assert (eff["train_real_tokens"], eff["train_peak_tflops"]) == (2 * 684, 4 * 312.0)
    assert eff["train_tokens_per_second"] == pytest.approx(136.8)
    # features/s is the Trainer's own (train_samples_per_second), as HF's script reports it: not made again
    assert "train_samples_per_second" not in eff
    assert (eff["train_model_tflop"], eff["train_achieved_tflops"]) == pytest.approx(
        (flops / 1e12, flops / 1e13)
    )
    assert eff["train_mfu"] == pytest.approx(flops / 1e13 / (4 * 312.0))
    cpu = train_efficiency(lengths, 1.0, 10.0, shape, "cpu", 1, "fp32", False)
    assert "train_mfu" not in cpu and "train_peak_tflops" not in cpu and cpu["device_name"] == "cpu"


# --- memory -------------------------------------------------------------------------------------
def _tiny() -> BertForQuestionAnswering:
    return _bert(
        vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64
    )


def _reporting_run(tmp_path, *given: str) -> tuple[RunPlan, Flags, Trainer]:
    """A run of `given` flags reporting to TensorBoard in tmp_path/runs/r (fp32, no memory report): its plan,
    flags, and the Trainer of _tiny() with the run's callbacks."""
    argv = ["--output_dir", str(tmp_path), "--logging_dir", str(tmp_path / "runs" / "r"), *given]
    argv += ["--report_to", "tensorboard", "--precision", "fp32", "--memory_report", "false"]
    plan, flags = decide_and_build(read_flags(argv), read_device_facts())
    return (
        plan,
        flags,
        Trainer(model=_tiny(), args=flags.training, callbacks=observability_callbacks(flags, plan)),
    )


def _finish(trainer: Trainer, flags: Flags, plan: RunPlan, results: dict) -> None:
    """The run's end as run_qa.py reports it, 3 s of wall clock."""
    params = Params.of(flags, plan.precision)
    finish_observability(trainer, flags, plan, params, ModelShape.of(trainer.model), results, 3.0)


def _hparams(acc) -> dict:
    """The HPARAMS tab's parameters in the event files read back (`acc`), name -> value."""
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    return {name: value.ListFields()[0][1] for name, value in start.hparams.items()}


# _tiny() by hand (512 positions, 2 token types, no pooler): embeddings 100*32 + 512*32 + 2*32 + LN 64
# = 19,712; per layer QKV 3*(32*32+32) + out 1,056 + LN 64 + 32*64+64 + 64*32+32 + LN 64 = 8,544 (x3);
# qa_outputs 66 -> 45,410 params. At s=128, b=16 (s*b*h = 65,536), a=4:
#   16-bit activations: 3 layers x 65,536*(34 + 5*4*128/32) + embeddings 65,536*(2*2+1)
#                       = 22,740,992 B = 21.69 MiB
#   fp32 activations:   3 layers x 65,536*(66 + 9*4*128/32) + embeddings 65,536*(2*4+1)
#                       = 41,877,504 B = 39.94 MiB
#   checkpointed 16-bit: inputs 3*65,536*2 + one layer 7,471,104 + embeddings 327,680 = 8,192,000 B = 7.81 MiB
#                        + 45,410*18 B = 8.59 MiB
#   fp32 + AdamW 45,410*16 + 41,877,504 B = 40.63 MiB; bf16 + AdamW 45,410*18 + 22,740,992 B = 22.47 MiB
#   only qa_outputs trains: 45,410*4 + 66*(4+8) + 41,877,504 B = 40.11 MiB; fp32 with 8-bit Adam (2 B/param
#   states, though its name holds "adam" too): 45,410*10 + 41,877,504 B = 40.37 MiB
@pytest.mark.parametrize(
    "precision, optim, checkpointing, frozen, bytes_per_param, activations_mb, total_mb",
    [
        ("fp32", "adamw_torch_fused", False, False, (4, 4, 8), 39.9, 40.6),
        ("bf16", "adamw_torch", False, False, (6, 4, 8), 21.7, 22.5),
        ("bf16", "adamw_torch", True, False, (6, 4, 8), 7.8, 8.6),
        ("fp32", "adamw_torch", False, True, (4, 4, 8), 39.9, 40.1),
        ("fp32", "adamw_bnb_8bit", False, False, (4, 4, 2), 39.9, 40.4),
    ],
)
def test_anatomy_estimate(precision, optim, checkpointing, frozen, bytes_per_param, activations_mb, total_mb):
    model = _tiny()
    for p in model.bert.parameters() if frozen else []:
        p.requires_grad_(False)
    est = anatomy_estimate(
        ModelShape.of(model), precision, optim, 16, 128, gradient_checkpointing=checkpointing
    )
    assert (est["params"], est["trainable_params"]) == (45_410, 66 if frozen else 45_410)
    assert est["bytes_per_param"] == dict(
        zip(("weights", "gradients", "optimizer"), bytes_per_param), total=sum(bytes_per_param)
    )
    assert (est["activations_mb"], est["total_mb"]) == (activations_mb, total_mb)


# --- profiler -----------------------------------------------------------------------------------
def test_a_profiler_schedule_without_kept_steps_is_refused():
    with pytest.raises(UsageError, match="profile_active"):
        decide_and_build(
            read_flags(["--output_dir", "x", "--profile", "--profile_active", "0"]), read_device_facts()
        )


@pytest.mark.parametrize(
    ("schedule", "steps", "running", "written", "traces", "logged"),
    [
        # training shorter than the window keeps what it has
        (
            (1, 1, 3, 1),
            3,
            [1, 2],
            [[3]],
            {"trace_rank0.json": ["ProfilerStep#3"]},
            ["ended inside a profiling window"],
        ),
        (
            (2, 100, 8, 1),
            3,
            [1, 2],
            [],
            {},
            ["wrote nothing", "110 steps"],
        ),  # shorter than the warmup: says why
        # repeat writes one trace per cycle, then stops: steps 5-7 ran without the profiler
        (
            (0, 1, 1, 2),
            7,
            [1, 2, 3],
            [[2], [4]],
            {"trace_rank0.json": ["ProfilerStep#2"], "trace_rank0_cycle2.json": ["ProfilerStep#4"]},
            ["steps 2-2"],
        ),
    ],
)
def test_profiler_schedule(tmp_path, caplog, schedule, steps, running, written, traces, logged):
    """Real training-like work between the Trainer's step events."""
    schedule_flags = [
        x
        for flag, n in zip(("wait", "warmup", "active", "repeat"), schedule)
        for x in (f"--profile_{flag}", str(n))
    ]
    plan, flags = decide_and_build(
        read_flags(
            ["--output_dir", str(tmp_path), "--profile", "--do_train", "--report_to", "none", *schedule_flags]
        ),
        read_device_facts(),
    )
    assert [type(c) for c in observability_callbacks(flags, plan)] == [ProfilerCallback]  # no TensorBoard
    stale = tmp_path / "trace_rank0_cycle5.json"  # an earlier launch's, into the same folder
    stale.write_text("{}")
    cb, model = ProfilerCallback(flags.observe, str(tmp_path), on_gpu=False), torch.nn.Linear(32, 32)
    state, control, ran = TrainerState(max_steps=steps), TrainerControl(), []
    with caplog.at_level(logging.INFO, logger="qa_hpc.observe.profiler"):
        cb.on_train_begin(flags.training, state, control)
        for _ in range(steps):
            model(torch.randn(8, 32)).sum().backward()
            state.global_step += 1
            cb.on_step_end(flags.training, state, control)
            ran += [state.global_step] if cb.prof is not None else []
        cb.on_train_end(flags.training, state, control)
    assert ran == running and cb.written == written
    left = sorted(traces) if written else [stale.name]  # a launch that profiled nothing replaced nothing
    assert sorted(p.name for p in tmp_path.glob("trace_*.json")) == left
    for name, profiled in traces.items():
        assert profiler_steps(json.loads((tmp_path / name).read_text())) == profiled
    assert all(words in caplog.text for words in logged)
    if schedule[3] == 2:
        summary = (tmp_path / "profiler_summary.txt").read_text()
        assert "cycle 1: global steps 2-2" in summary and "cycle 2: global steps 4-4" in summary


# --- TensorBoard and the wiring -----------------------------------------------------------------
@pytest.mark.parametrize("gpu", [False, True], ids=["no-gpu", "gpu-made-up"])
def test_trainer_logs_land_under_the_readme_tags_in_one_event_file(tmp_path, monkeypatch, gpu: bool):
    """Driven as the Trainer drives it: two logging intervals (two training batches counted in each), the
    end of training, an evaluation, a prediction, on a node with a GPU (made up here:
    torch.cuda says there is one, and its allocator figures). Rank 0's GPU memory for a run on the GPU, none
    for a run on the node's CPU (--use_cpu)."""
    plan, flags = decide_and_build(
        read_flags(
            ["--output_dir", str(tmp_path), "--logging_dir", str(tmp_path / "runs" / "r"), "--use_cpu"]
        ),
        read_device_facts(),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for megabytes, name in enumerate(GPU_MEMORY, start=1):
        monkeypatch.setitem(GPU_MEMORY, name, lambda index, mb=megabytes: mb * 1024**2)
    args, (tb,) = flags.training, observability_callbacks(flags, plan)
    assert not tb.on_gpu  # --use_cpu: no GPU figures, whatever GPUs the node has
    if gpu:  # the callback of a run on the (made-up) GPU
        tb = TensorBoard(str(tmp_path / "runs" / "r"), on_gpu=True)
    state, control = TrainerState(), TrainerControl()
    tb.on_train_begin(args, state, control)
    mask = torch.tensor([[1] * 6 + [0] * 2] * 4)
    for step in (1, 2):
        for _ in range(2):  # the Trainer's training step counts each batch (evaluation has none)
            tb.count_batch({"input_ids": torch.randint(1, 100, (4, 8)), "attention_mask": mask})
        state.global_step = step
        tb.on_log(
            args,
            state,
            control,
            logs={"loss": 2.0 / step, "grad_norm": 1.5, "learning_rate": 1e-4, "epoch": step / 2},
        )
    tb.on_log(
        args,
        state,
        control,
        logs={
            "train_runtime": 3.0,
            "train_samples_per_second": 2.5,
            "train_loss": 1.5,
            "total_flos": 10.0,
            "epoch": 1.0,
        },
    )
    tb.on_train_end(args, state, control)
    tb.on_log(args, state, control, logs={"eval_exact_match": 25.0, "eval_f1": 40.0, "epoch": 1.0})
    tb.on_log(args, state, control, logs={"predict_runtime": 0.5, "predict_f1": 30.0, "epoch": 1.0})
    acc = tensorboard_events(tmp_path)
    tags = {tag: scalars(acc, tag) for tag in acc.Tags()["scalars"]}
    assert tags["train/loss"] == [(1, 2.0), (2, 1.0)]
    assert tags["train/epoch"] == [(1, 0.5), (2, 1.0)]  # the Trainer's number, once per interval only
    for tag in ("train/learning_rate", "train/grad_norm", "train/step_time_seconds"):
        assert [s for s, _ in tags[tag]] == [1, 2], tag
    assert [v for _, v in tags["train/real_token_fraction"]] == [0.75, 0.75]  # 48 of 64 tokens, eval left out
    for (_, seconds), (_, samples), (_, tokens) in zip(
        *(tags[f"train/{k}"] for k in ("step_time_seconds", "samples_per_second", "tokens_per_second"))
    ):
        assert (samples * seconds, tokens * seconds) == pytest.approx(
            (8, 48), rel=1e-4
        )  # per 1-step interval
    gpu_memory = {tag: values for tag, values in tags.items() if tag.startswith("train/gpu_memory")}
    assert gpu_memory == (
        {
            "train/gpu_memory_allocated_mb": [(1, 1.0), (2, 1.0)],
            "train/gpu_memory_reserved_mb": [(1, 2.0), (2, 2.0)],
            "train/gpu_memory_peak_allocated_mb": [(1, 3.0), (2, 3.0)],
        }
        if gpu
        else {}
    )
    assert tags["train_total/runtime"] == [(2, 3.0)] and tags["train_total/loss"] == [(2, 1.5)]
    assert tags["eval/exact_match"] == [(2, 25.0)] and tags["eval/f1"] == [(2, 40.0)]
    assert tags["predict/f1"] == [(2, 30.0)]
    assert not [
        t for t in tags if t.startswith("train/") and ("runtime" in t or "eval" in t or "predict" in t)
    ]


def test_a_cpu_run_on_a_gpu_node_profiles_the_cpu(tmp_path, monkeypatch):
    """--use_cpu where torch sees a GPU (made up): the profiler records and sorts CPU activity only."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    argv = ["--output_dir", str(tmp_path), "--profile", "--do_train", "--use_cpu", "--report_to", "none"]
    plan, flags = decide_and_build(read_flags(argv), read_device_facts())
    (profiler,) = observability_callbacks(flags, plan)
    assert profiler.activities == [ProfilerActivity.CPU] and profiler.sort_by == "self_cpu_time_total"


def _tensorboard_on_a_made_up_clock(tmp_path, monkeypatch) -> tuple:
    """Our TensorBoard callback as a CPU run builds it, its training begun at 0 s on a clock the test sets
    (`now[0]`): (callback, TrainingArguments, TrainerState, TrainerControl, now)."""
    plan, flags = decide_and_build(
        read_flags(
            ["--output_dir", str(tmp_path), "--logging_dir", str(tmp_path / "runs" / "r"), "--use_cpu"]
        ),
        read_device_facts(),
    )
    now = [0.0]
    monkeypatch.setattr("qa_hpc.observe.tensorboard.time.perf_counter", lambda: now[0])
    args, (tb,) = flags.training, observability_callbacks(flags, plan)
    state, control = TrainerState(), TrainerControl()
    tb.on_train_begin(args, state, control)
    return tb, args, state, control, now


def test_step_time_leaves_checkpoints_and_evaluations_out(tmp_path, monkeypatch):
    """A made-up clock: each interval's step time and throughput are the training time between two logs,
    less a checkpoint or an evaluation that came between (their seconds would count as steps)."""
    tb, args, state, control, now = _tensorboard_on_a_made_up_clock(tmp_path, monkeypatch)
    # (step, clock at its log, what follows the log and when it ends)
    steps = [
        (1, 2.0, None),
        (2, 3.0, ("save", 10.0)),
        (3, 11.5, None),
        (4, 12.5, ("evaluate", 20.5)),
        (5, 21.0, None),
    ]
    for step, logged_at, after in steps:
        tb.count_batch({"input_ids": torch.randint(1, 100, (4, 8)), "attention_mask": torch.ones(4, 8)})
        state.global_step, now[0] = step, logged_at
        tb.on_log(args, state, control, logs={"loss": 1.0, "learning_rate": 1e-4, "epoch": step / 5})
        if after is not None:
            event, now[0] = after
            getattr(tb, f"on_{event}")(args, state, control)
    acc = tensorboard_events(tmp_path)
    step_time = [(1, 2.0), (2, 1.0), (3, 1.5), (4, 1.0), (5, 0.5)]
    assert scalars(acc, "train/step_time_seconds") == step_time
    samples = scalars(acc, "train/samples_per_second")  # 4 training rows a step; TensorBoard keeps float32
    assert samples == [(step, pytest.approx(4 / t)) for step, t in step_time]


def test_a_checkpoint_inside_a_logging_interval_leaves_its_steps_and_samples_in(tmp_path, monkeypatch):
    """A made-up clock, logging every 3 steps, saving and evaluating after step 2 (not a logging step): the
    interval keeps all 3 steps and their samples and leaves out the seconds the checkpoint and the evaluation
    took. (Restarting the interval there kept step 1's and 2's samples over step 3's time alone: 3x the
    throughput.)"""
    tb, args, state, control, now = _tensorboard_on_a_made_up_clock(tmp_path, monkeypatch)
    # (step, clock at its end, what follows it and when that ends): steps of 1 s, 10 s of checkpoint and 5 s
    # of evaluation after step 2
    steps = [(1, 1.0, []), (2, 2.0, [("save", 12.0), ("evaluate", 17.0)]), (3, 18.0, [])]
    for step, ended_at, after in steps:
        tb.count_batch({"input_ids": torch.randint(1, 100, (4, 8)), "attention_mask": torch.ones(4, 8)})
        state.global_step, now[0] = step, ended_at
        tb.on_step_end(args, state, control)
        for event, done_at in after:
            now[0] = done_at
            getattr(tb, f"on_{event}")(args, state, control)
    tb.on_log(args, state, control, logs={"loss": 1.0, "learning_rate": 1e-4, "epoch": 1.0})
    acc = tensorboard_events(tmp_path)
    assert scalars(acc, "train/step_time_seconds") == [(3, 1.0)]
    assert scalars(acc, "train/samples_per_second") == [(3, pytest.approx(4.0))]  # 12 rows in 3 s


def test_finish_writes_the_memory_report_and_tensorboard_totals(tmp_path):
    argv = [
        "--output_dir",
        str(tmp_path),
        "--logging_dir",
        str(tmp_path / "runs" / "r"),
        "--do_train",
        "--max_seq_length",
        "128",
        "--doc_stride",
        "32",
        "--per_device_train_batch_size",
        "16",
        "--precision",
        "fp32",
    ]
    plan, flags = decide_and_build(read_flags(argv), read_device_facts())
    model = _tiny()
    trainer = Trainer(model=model, args=flags.training, callbacks=observability_callbacks(flags, plan))
    # --profile is off: no profiler; ours extends transformers' TensorBoard callback, which is not added
    # beside it
    assert [
        type(c)
        for c in trainer.callback_handler.callbacks
        if isinstance(c, (TensorBoardCallback, ProfilerCallback))
    ] == [TensorBoard]
    trainer.state.global_step = 4
    trainer.log({"loss": 0.75, "learning_rate": 1e-4})
    results = {"train_loss": 0.8, "eval_f1": 41.5, "eval_exact_match": 30.0}
    params = Params.of(flags, plan.precision)
    report = finish_observability(trainer, flags, plan, params, ModelShape.of(model), results, 12.5)

    assert json.loads((tmp_path / "memory.json").read_text()) == json.loads(json.dumps(report))
    assert report["world_size"] == 1 and report["estimate"]["total_mb"] == 40.6  # _tiny() by hand, above
    assert report["cpu"]["peak_rss_mb"] == report["max_over_ranks"]["cpu_peak_rss_mb"] > 0
    if torch.cuda.is_available():
        assert report["cuda"]["total_mb"] > 0
    else:
        assert (report["cuda"], report["note"]) == (None, "no CUDA device")
        assert report["measured_peak_mb"] == report["max_over_ranks"]["cpu_peak_rss_mb"]
    # what the run's record keeps of it (its closing lines: tests/unit/test_record.py)
    memory = Memory.of(report)
    assert (memory.estimate_mb, memory.estimate_bytes_per_param, memory.nodes) == (40.6, 16, 1)

    acc = tensorboard_events(tmp_path)
    hparams = _hparams(acc)
    assert [
        hparams[k]
        for k in ("per_device_train_batch_size", "total_train_batch_size", "max_seq_length", "precision")
    ] == [16, 16, 128, "fp32"]
    totals = {tag: scalars(acc, tag)[0][1] for tag in acc.Tags()["scalars"] if tag.startswith("hparam/")}
    assert totals["hparam/wall_clock_seconds"] == 12.5 and totals["hparam/final_loss"] == 0.75
    assert totals["hparam/eval_f1"] == 41.5
    assert totals["hparam/peak_memory_mb"] == pytest.approx(report["measured_peak_mb"])
    text = acc.Tensors("run_summary/text_summary")[0].tensor_proto.string_val[0].decode()
    for key in (
        "wall_clock_seconds",
        "final_loss",
        "per_device_train_batch_size",
        "epochs",
        "world_size",
        "precision",
    ):
        assert f"| {key} |" in text, key


@pytest.mark.parametrize("nvml", [True, False], ids=["nvml", "no-nvml"])
def test_a_gpu_process_measures_its_own_gpu_made_up_here(monkeypatch, tmp_path, nvml: bool):
    """measure_process under a made-up torch.cuda (this machine's side is in the tests above): the figures of
    the run's own device index, in MB; NVML missing on a node is a note, not an error; memory.json then holds
    the largest CUDA peaks over the ranks and sets the estimate beside the allocator's peak."""
    gib = 1024**3
    read = {"max_memory_allocated": 5, "max_memory_reserved": 6, "memory_allocated": 1, "memory_reserved": 2}
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: types.SimpleNamespace(total_memory=141 * gib, name=f"NVIDIA H200 #{index}"),
    )
    for name, gigabytes in read.items():
        monkeypatch.setattr(
            torch.cuda, name, lambda index, gigabytes=gigabytes: asked.append(index) or gigabytes * gib
        )

    def used(device: torch.device) -> int:
        if not nvml:
            raise RuntimeError("pynvml does not seem to be installed")
        return 7 * gib

    monkeypatch.setattr(torch.cuda, "device_memory_used", used)
    rank1 = measure_process(1, torch.device("cuda", 1))
    assert set(asked) == {1}  # the run's own GPU, not the current one
    assert rank1["cuda"] == {
        "device_index": 1,
        "device_name": "NVIDIA H200 #1",
        "total_mb": 141 * 1024.0,
        "peak_allocated_mb": 5 * 1024.0,
        "peak_reserved_mb": 6 * 1024.0,
        "allocated_mb": 1024.0,
        "reserved_mb": 2 * 1024.0,
    }
    if nvml:
        assert (rank1["nvml"], rank1["nvml_note"]) == ({"used_mb": 7 * 1024.0}, None)
    else:
        assert rank1["nvml"] is None and rank1["nvml_note"].startswith("NVML unavailable: pynvml")
    rank0 = {**rank1, "rank": 0, "cuda": {**rank1["cuda"], "device_index": 0, "peak_allocated_mb": 4096.0}}
    # a run on the CPU of a node with GPUs (--use_cpu) measures no GPU
    asked.clear()
    on_cpu = measure_process(0, torch.device("cpu"))
    assert (on_cpu["cuda"], on_cpu["nvml"], on_cpu["nvml_note"], asked) == (None, None, "no CUDA device", [])
    report = memory_report([rank0, rank1], {"total_mb": 2560.0}, str(tmp_path))
    assert report["cuda"]["device_index"] == 0  # the main process's figures at the top
    peaks = report["max_over_ranks"]
    assert (peaks["cuda_peak_allocated_mb"], peaks["cuda_peak_reserved_mb"]) == (5 * 1024.0, 6 * 1024.0)
    assert report["measured_source"] == "cuda peak allocated (max over ranks)"
    assert report["estimate_over_measured"] == 0.5
    assert json.loads((tmp_path / "memory.json").read_text()) == json.loads(json.dumps(report))


def test_an_evaluation_only_run_shows_no_training_parameters_in_tensorboard(tmp_path):
    """The HPARAMS tab says what the record says: a run that does not train shows no batch, epochs or
    learning rate, which would read as what it trained with."""
    plan, flags, trainer = _reporting_run(tmp_path, "--do_eval")
    _finish(trainer, flags, plan, {"eval_f1": 41.5})

    hparams = _hparams(tensorboard_events(tmp_path))
    assert sorted(hparams) == ["device", "max_seq_length", "model", "precision", "world_size"]


def test_an_evaluation_of_an_earlier_launchs_last_step_is_logged_at_that_step(tmp_path):
    """TRAINED_BEFORE: a launch that trains nothing evaluates the model an earlier launch trained to the
    last step; TensorBoard has that evaluation at the checkpoint's step (it was at step 0, before the
    earlier launch's own curves) and the checkpoint's last loss among the run's totals."""
    plan, flags, trainer = _reporting_run(tmp_path, "--do_train", "--do_eval")
    checkpoint = tmp_path / "checkpoint-30"
    checkpoint.mkdir()
    done = TrainerState(global_step=30, epoch=2.0, max_steps=30, log_history=[{"loss": 1.25, "step": 30}])
    done.save_to_json(str(checkpoint / "trainer_state.json"))
    take_trained_state(trainer.state, str(checkpoint))
    trainer.log({"eval_f1": 41.5})
    _finish(trainer, flags, plan, {"eval_f1": 41.5})

    acc = tensorboard_events(tmp_path)
    assert scalars(acc, "eval/f1") == [(30, 41.5)]
    assert scalars(acc, "hparam/final_loss") == [(30, 1.25)]
    assert trainer.state.log_history[-1] == {"eval_f1": 41.5, "epoch": 2.0, "step": 30}


@pytest.mark.parametrize("max_steps", [None, 6])
def test_a_run_that_max_steps_ends_says_so_in_the_hparams_tab(tmp_path, max_steps):
    """--max_steps overrides --num_train_epochs: a 6-step run showed only its epochs flag (3.0), as a full
    three-epoch run does."""
    given = ["--max_steps", str(max_steps)] if max_steps else []
    plan, flags, trainer = _reporting_run(tmp_path, "--do_train", *given)
    _finish(trainer, flags, plan, {})

    hparams = _hparams(tensorboard_events(tmp_path))
    assert (hparams["epochs"], hparams.get("max_steps")) == (3.0, max_steps)
