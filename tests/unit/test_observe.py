"""Observability without a training run: FLOPs and MFU, the memory estimate and measurement, the
profiler's schedule driven with real torch work, the token counter, and TensorBoard's tags read back
with TensorBoard's own reader from callbacks driven as the Trainer drives them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from transformers import BertConfig, BertForQuestionAnswering, Trainer, TrainerControl, TrainerState
from transformers.integrations import TensorBoardCallback

from fixtures.settings import plan_and_flags
from qa_hpc.features import real_lengths
from qa_hpc.model import ModelShape
from qa_hpc.observe import finish_observability, observability_callbacks
from qa_hpc.observe.efficiency import efficiency_lines, peak_tflops, train_efficiency, train_flops_per_sequence
from qa_hpc.observe.memory import anatomy_estimate, measure_process, optimizer_bytes_per_param
from qa_hpc.observe.profiler import ProfilerCallback
from qa_hpc.observe.tensorboard import TensorBoard, TokenCounter
from qa_hpc.errors import UsageError
from fixtures.outputs import profiler_steps


def _bert_base_on_meta() -> BertForQuestionAnswering:
    with torch.device("meta"):  # shapes only: no memory, no init time
        return BertForQuestionAnswering(BertConfig())


# --- efficiency ---------------------------------------------------------------------------------
def test_bert_base_costs_about_212_gflop_per_384_token_training_sequence():
    shape = ModelShape.of(_bert_base_on_meta())
    n = shape.non_embedding_params
    assert (shape.layers, shape.hidden, shape.heads) == (12, 768, 12)
    assert 84e6 < n < 87e6, n  # 12 layers x 7.1M + pooler + QA head
    flops = train_flops_per_sequence(np.array([384]), n, 12, 768)[0]
    assert flops == pytest.approx(6 * n * 384 + 12 * 12 * 768 * 384 * 384)
    assert 205e9 < flops < 215e9
    # two epochs of the 88,524 SQuAD train features at 384 tokens: about 37.6 PFLOP
    assert 18.5e15 * 2 < flops * 88524 * 2 < 19.2e15 * 2


@pytest.mark.parametrize("name, precision, tf32, want", [
    ("NVIDIA A100-SXM4-80GB", "bf16", False, 312.0), ("NVIDIA A100-PCIE-40GB", "fp32", True, 156.0),
    ("NVIDIA A100-PCIE-40GB", "fp32", False, 19.5), ("NVIDIA H100 80GB HBM3", "bf16", False, 989.0),
    ("NVIDIA H100 PCIe", "bf16", False, 756.0), ("NVIDIA H200", "fp16", False, 989.0), ("Tesla T4", "fp16", False, 65.0),
    ("NVIDIA GeForce RTX 4090", "bf16", False, 165.2), ("NVIDIA L40S", "bf16", False, 362.0),
    ("NVIDIA L40", "bf16", False, 181.0),  # not L4's 121 (names are matched longest key first)
    ("NVIDIA L4", "bf16", False, 121.0), ("cpu", "fp32", False, None), ("Some Future GPU", "bf16", False, None),
])
def test_peak_table(name, precision, tf32, want):
    assert peak_tflops(name, precision, tf32) == want


def test_real_lengths_from_arrow_and_lists_count_mask_ones():
    masks = [[1] * 5 + [0] * 3, [1] * 8, [1, 1], [1] * 3 + [0] * 5]
    ds = datasets.Dataset.from_dict({"attention_mask": masks})
    want = [5, 8, 2, 3]
    assert real_lengths(ds).tolist() == want
    assert real_lengths(ds.select([3, 0])).tolist() == [3, 5]
    assert real_lengths({"attention_mask": masks}).tolist() == want


def test_train_efficiency_arithmetic():
    shape = ModelShape.of(_bert_base_on_meta())
    lengths = np.array([100, 200, 384])
    eff = train_efficiency(lengths, 2.0, 10.0, shape, "NVIDIA A100-SXM4-80GB", 4, "bf16", True)
    n = shape.non_embedding_params
    flops = 2 * sum(6 * n * s + 12 * 12 * 768 * s * s for s in lengths)
    assert eff["train_real_tokens"] == 2 * 684
    assert eff["train_tokens_per_second"] == pytest.approx(136.8)
    assert eff["train_samples_per_second"] == pytest.approx(0.6)
    assert eff["train_model_tflop"] == pytest.approx(flops / 1e12)
    assert eff["train_achieved_tflops"] == pytest.approx(flops / 10 / 1e12)
    assert eff["train_peak_tflops"] == 4 * 312.0
    assert eff["train_mfu"] == pytest.approx(flops / 10 / 1e12 / (4 * 312.0))
    lines = efficiency_lines(eff)
    assert lines[0].startswith("TRAIN_TOKENS_PER_SECOND=136.8")
    assert any(line.startswith("MFU=0.") for line in lines)
    cpu = train_efficiency(lengths, 1.0, 10.0, shape, "cpu", 1, "fp32", False)
    assert "train_mfu" not in cpu and "train_peak_tflops" not in cpu
    assert any(line.startswith("MFU=n/a") for line in efficiency_lines(cpu))


# --- memory -------------------------------------------------------------------------------------
def _tiny() -> BertForQuestionAnswering:
    return BertForQuestionAnswering(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3,
                                               num_attention_heads=4, intermediate_size=64))


# _tiny() by hand (512 positions, 2 token types, no pooler):
#   embeddings 100*32 + 512*32 + 2*32 + LayerNorm 2*32 = 3,200 + 16,384 + 64 + 64  = 19,712
#   per layer: QKV 3*(32*32+32) = 3,168; out 32*32+32 = 1,056; LN 64; 32*64+64 = 2,112;
#              64*32+32 = 2,080; LN 64                                 -> 8,544 (x3 = 25,632)
#   qa_outputs 32*2+2                                                             =     66
#   params                                                                        = 45,410
# At s=128, b=16 (s*b*h = 128*16*32 = 65,536), a=4:
#   16-bit activations: per layer 65,536*(34 + 5*4*128/32) = 65,536*114 = 7,471,104 (x3 = 22,413,312)
#                       + embeddings 65,536*(2*2+1) = 327,680                 -> 22,740,992 B = 21.69 MiB
#   fp32 activations:   per layer 65,536*(66 + 9*4*128/32) = 65,536*210 = 13,762,560 (x3 = 41,287,680)
#                       + embeddings 65,536*(2*4+1) = 589,824                 -> 41,877,504 B = 39.94 MiB
#   checkpointed 16-bit: layer inputs 3*65,536*2 = 393,216 + one layer 7,471,104 + embeddings 327,680
#                                                                              -> 8,192,000 B = 7.81 MiB
#   fp32 + AdamW total:  45,410*16 = 726,560 + 41,877,504 = 42,604,064 B = 40.63 MiB
#   bf16 + AdamW total:  45,410*18 = 817,380 + 22,740,992 = 23,558,372 B = 22.47 MiB
PARAMS, S, B = 45_410, 128, 16


def test_bytes_per_param_follow_precision_and_optimizer():
    model = _tiny()
    fp32 = anatomy_estimate(ModelShape.of(model), "fp32", "adamw_torch_fused", B, S)
    mixed = anatomy_estimate(ModelShape.of(model), "bf16", "adamw_torch", B, S)
    assert fp32["params"] == fp32["trainable_params"] == PARAMS
    assert fp32["bytes_per_param"] == {"weights": 4, "gradients": 4, "optimizer": 8, "total": 16}
    assert mixed["bytes_per_param"] == {"weights": 6, "gradients": 4, "optimizer": 8, "total": 18}
    assert (fp32["activations_mb"], fp32["total_mb"]) == (39.9, 40.6)
    assert (mixed["activations_mb"], mixed["total_mb"]) == (21.7, 22.5)
    assert mixed["weights_mb"] == 0.3  # 45,410*6 = 272,460 B
    checkpointed = anatomy_estimate(ModelShape.of(model), "bf16", "adamw_torch", B, S, gradient_checkpointing=True)
    assert checkpointed["activations_mb"] == 7.8
    assert optimizer_bytes_per_param("adamw_bnb_8bit") == 2 and optimizer_bytes_per_param("sgd") == 0
    assert optimizer_bytes_per_param("adafactor") == 4
    frozen = _tiny()
    for p in frozen.bert.parameters():
        p.requires_grad_(False)
    est = anatomy_estimate(ModelShape.of(frozen), "fp32", "adamw_torch", B, S)
    # only qa_outputs (66 params) trains: no gradients or AdamW states for the other 45,344
    assert (est["params"], est["trainable_params"]) == (PARAMS, 66)
    assert est["total_mb"] == 40.1  # 45,410*4 + 66*(4+8) + 41,877,504 = 42,059,936 B = 40.11 MiB


def test_measure_process_on_this_machine():
    figures = measure_process(0)
    assert figures["cpu"]["peak_rss_mb"] > 0
    if torch.cuda.is_available():
        assert figures["cuda"]["total_mb"] > 0
    else:
        assert figures["cuda"] is None and figures["nvml"] is None and figures["nvml_note"] == "no CUDA device"


# --- profiler -----------------------------------------------------------------------------------
def test_profiler_flags_reach_the_plan_and_bad_schedules_are_refused():
    plan, flags = plan_and_flags(["--output_dir", "x", "--profile", "--profile_wait", "1", "--profile_warmup", "3",
                                  "--profile_active", "4", "--profile_repeat", "2", "--profile_with_stack"])
    # (wait 1 + warmup 3 + active 4) x repeat 2
    assert (flags.observe.profile_steps_needed, flags.observe.profile_with_stack) == (16, True)
    assert plan.profile_dir == "x/profiler"
    with pytest.raises(UsageError, match="profile_active"):
        plan_and_flags(["--output_dir", "x", "--profile", "--profile_active", "0"])


def _profiler(tmp_path: Path, wait: int, warmup: int, active: int, repeat: int = 1) -> ProfilerCallback:
    _, flags = plan_and_flags(["--output_dir", str(tmp_path), "--profile", "--profile_wait", str(wait),
                               "--profile_warmup", str(warmup), "--profile_active", str(active),
                               "--profile_repeat", str(repeat)])
    return ProfilerCallback(flags.observe, str(tmp_path))


def _drive(cb: ProfilerCallback, steps: int, tmp_path: Path) -> list[int]:
    """Real training-like work between the Trainer's step events; returns the steps after which it still ran."""
    _, flags = plan_and_flags(["--output_dir", str(tmp_path), "--report_to", "none"])
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state, control, running = TrainerState(max_steps=steps), TrainerControl(), []
    cb.on_train_begin(flags.training, state, control)
    for _ in range(steps):
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
        state.global_step += 1
        cb.on_step_end(flags.training, state, control)
        running += [state.global_step] if cb.prof is not None else []
    cb.on_train_end(flags.training, state, control)
    return running


@pytest.mark.parametrize(("schedule", "steps", "running", "written", "traces", "logged"), [
    # training shorter than the window keeps what it has
    ((1, 1, 3, 1), 3, None, [[3]], {"trace_rank0.json": ["ProfilerStep#3"]}, ["ended inside a profiling window"]),
    # shorter than the warmup: writes nothing and says why
    ((2, 100, 8, 1), 3, None, None, {}, ["wrote nothing", "110 steps"]),
    # repeat writes one trace per cycle, then stops: steps 5-7 ran without the profiler
    ((0, 1, 1, 2), 7, [1, 2, 3], [[2], [4]], {"trace_rank0_cycle2.json": ["ProfilerStep#4"]}, []),
])
def test_profiler_schedule(tmp_path, caplog, schedule, steps, running, written, traces, logged):
    cb = _profiler(tmp_path, *schedule)
    with caplog.at_level(logging.INFO, logger="qa_hpc.observe.profiler"):
        ran = _drive(cb, steps, tmp_path)
    assert running is None or ran == running
    assert written is None or cb.written == written
    for name, profiled in traces.items():
        assert profiler_steps(json.loads((tmp_path / name).read_text())) == profiled
    if not traces:
        assert not list(tmp_path.glob("trace_*.json"))
    assert all(words in caplog.text for words in logged)
    if schedule[3] == 2:
        summary = (tmp_path / "profiler_summary.txt").read_text()
        assert "cycle 1: global steps 2-2" in summary and "cycle 2: global steps 4-4" in summary


# --- TensorBoard and the wiring -----------------------------------------------------------------
def test_token_counter_counts_attention_mask_of_training_forwards():
    model = BertForQuestionAnswering(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=32))
    counter = TokenCounter()
    counter.attach(model)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    ids = torch.randint(1, 50, mask.shape)
    model.train()
    model(input_ids=ids, attention_mask=mask)
    model(input_ids=ids, attention_mask=mask)
    model.eval()
    model(input_ids=ids, attention_mask=mask)  # evaluation forwards are not counted
    assert counter.take(torch.device("cpu")) == (6, 30, 2 * 10)
    assert counter.take(torch.device("cpu")) == (0, 0, 0)
    counter.detach()


@pytest.mark.parametrize("extra, profiler, tensorboard", [
    ([], False, True),  # the qa-hpc default --report_to tensorboard; --profile off
    (["--profile"], True, True),
    (["--report_to", "none"], False, False),
])
def test_a_component_that_is_off_is_not_created_and_tensorboard_is_made_once(tmp_path, extra, profiler, tensorboard):
    plan, flags = plan_and_flags(["--output_dir", str(tmp_path), *extra])
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=flags.training, callbacks=observability_callbacks(flags, plan))
    made = trainer.callback_handler.callbacks
    assert any(isinstance(c, ProfilerCallback) for c in made) == profiler
    # ours extends transformers' callback, and transformers does not add its own beside it
    assert [type(c) for c in made if isinstance(c, TensorBoardCallback)] == ([TensorBoard] if tensorboard else [])


def _events(log_dir: Path) -> EventAccumulator:
    files = list(log_dir.glob("events.out.tfevents.*"))
    assert len(files) == 1, f"one event file expected, found {files}"
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_trainer_logs_land_under_the_readme_tags_in_one_event_file(tmp_path):
    """Driven as the Trainer drives it: two logging intervals, the end of training, an evaluation, a prediction."""
    plan, flags = plan_and_flags(["--output_dir", str(tmp_path), "--logging_dir", str(tmp_path / "tb"),
                                  "--use_cpu"])
    args, (tb,) = flags.training, observability_callbacks(flags, plan)
    model = _tiny()
    state, control = TrainerState(), TrainerControl()
    tb.on_train_begin(args, state, control, model=model)
    mask = torch.tensor([[1] * 6 + [0] * 2] * 4)
    for step in (1, 2):
        model.train()
        model(input_ids=torch.randint(1, 100, mask.shape), attention_mask=mask)
        state.global_step = step
        tb.on_log(args, state, control, logs={"loss": 2.0 / step, "grad_norm": 1.5, "learning_rate": 1e-4,
                                              "epoch": step / 2})
    tb.on_log(args, state, control, logs={"train_runtime": 3.0, "train_samples_per_second": 2.5, "train_loss": 1.5,
                                          "total_flos": 10.0, "epoch": 1.0})
    tb.on_train_end(args, state, control)
    tb.on_log(args, state, control, logs={"eval_exact_match": 25.0, "eval_f1": 40.0, "epoch": 1.0})
    tb.on_log(args, state, control, logs={"predict_runtime": 0.5, "predict_f1": 30.0, "epoch": 1.0})
    acc = _events(tmp_path / "tb")
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert scalars["train/loss"] == [(1, 2.0), (2, 1.0)]
    assert scalars["train/epoch"] == [(1, 0.5), (2, 1.0)]  # the Trainer's number, once per interval only
    for tag in ("train/learning_rate", "train/grad_norm", "train/step_time_seconds", "train/samples_per_second",
                "train/tokens_per_second"):
        assert [s for s, _ in scalars[tag]] == [1, 2], tag
    assert [v for _, v in scalars["train/real_token_fraction"]] == [0.75, 0.75]
    assert [k for k in scalars if k.startswith("train/gpu_memory")] == (
        ["train/gpu_memory_allocated_mb", "train/gpu_memory_reserved_mb", "train/gpu_memory_peak_allocated_mb"]
        if torch.cuda.is_available() else [])
    assert scalars["train_total/runtime"] == [(2, 3.0)] and scalars["train_total/loss"] == [(2, 1.5)]
    assert scalars["eval/exact_match"] == [(2, 25.0)] and scalars["eval/f1"] == [(2, 40.0)]
    assert scalars["predict/f1"] == [(2, 30.0)]
    assert not [t for t in scalars if t.startswith("train/") and ("runtime" in t or "eval" in t or "predict" in t)]


def test_finish_writes_memory_report_lines_and_tensorboard_totals(tmp_path):
    plan, flags = plan_and_flags(["--output_dir", str(tmp_path), "--logging_dir", str(tmp_path / "tb"),
                                  "--do_train", "--max_seq_length", "128", "--doc_stride", "32",
                                  "--per_device_train_batch_size", "16", "--precision", "fp32"])
    model = _tiny()
    trainer = Trainer(model=model, args=flags.training, callbacks=observability_callbacks(flags, plan))
    trainer.state.global_step = 4
    trainer.log({"loss": 0.75, "learning_rate": 1e-4})
    results = {"train_loss": 0.8, "eval_f1": 41.5, "eval_exact_match": 30.0}
    lines, report = finish_observability(trainer, flags, plan, ModelShape.of(model), results, 12.5)

    assert json.loads((tmp_path / "memory.json").read_text()) == json.loads(json.dumps(report))
    assert report["world_size"] == 1 and report["estimate"]["total_mb"] == 40.6  # _tiny() by hand, above
    keys = [line.split("=", 1)[0] for line in lines]
    assert keys[-5:] == ["RUN_NODES", "RUN_WORLD_SIZE", "RUN_DEVICE", "RUN_PRECISION", "OUTPUT_DIR"]
    assert "MEMORY_CPU_PEAK_RSS_MB" in keys and "MEMORY_ESTIMATE_MB=40.6" in lines
    assert f"OUTPUT_DIR={tmp_path}" in lines and "RUN_WORLD_SIZE=1" in lines

    acc = _events(tmp_path / "tb")
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hparams = {k: v.ListFields()[0][1] for k, v in start.hparams.items()}
    assert hparams["per_device_train_batch_size"] == 16 and hparams["max_seq_length"] == 128
    assert hparams["world_size"] == 1 and hparams["precision"] == plan.precision
    totals = {tag: acc.Scalars(tag)[0].value for tag in acc.Tags()["scalars"] if tag.startswith("hparam/")}
    assert totals["hparam/wall_clock_seconds"] == 12.5 and totals["hparam/final_loss"] == 0.75
    assert totals["hparam/eval_f1"] == 41.5 and totals["hparam/peak_memory_mb"] == pytest.approx(report["measured_peak_mb"])
    text = acc.Tensors("run_summary/text_summary")[0].tensor_proto.string_val[0].decode()
    for key in ("wall_clock_seconds", "final_loss", "per_device_train_batch_size", "epochs", "world_size", "precision"):
        assert f"| {key} |" in text, key
