"""Observability of real runs (the shared plain and 2-rank runs of tests/e2e/conftest.py), read back.

TensorBoard: every scalar the README names is there at the logging steps, read with TensorBoard's own reader;
loss, learning rate and grad norm equal trainer_state.json; samples and real tokens per second, multiplied back
by the interval's time, add up to what run_qa counted before training (under DDP: across both ranks); eval EM/F1
equal eval_results.json; the run's totals are in the HPARAMS plugin and a text summary; only rank 0 writes.
Profiler: the op table's columns and rows, the Chrome trace's ProfilerStep#N spans for exactly the scheduled
steps, one trace per rank. Memory: memory.json and the MEMORY_* lines, the estimate checked against numbers
worked out by hand, the measured peaks against what the machine allows, every rank present.
"""

from __future__ import annotations

import json
import re

import psutil
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from fixtures.outputs import profiler_steps
from fixtures.runs import DDP_BATCH, Run

MB = 1024 * 1024

TRAIN_TAGS = [
    "train/loss", "train/learning_rate", "train/grad_norm", "train/step_time_seconds",
    "train/samples_per_second", "train/tokens_per_second",
]
GPU_TAGS = ["train/gpu_memory_allocated_mb", "train/gpu_memory_reserved_mb"]
EVAL_TAGS = ["eval/exact_match", "eval/f1"]


def _accumulator(run: Run) -> EventAccumulator:
    dirs = [p for p in (run.out / "runs").iterdir() if p.is_dir()]
    assert len(dirs) == 1, f"expected one TensorBoard run dir, found {dirs}"
    files = list(dirs[0].glob("events.out.tfevents.*"))
    assert len(files) == 1, f"one writer (rank 0) expected, found {files}"
    acc = EventAccumulator(str(dirs[0]), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _series(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _train_token_counts(run: Run) -> tuple[int, int]:
    """features and real tokens of the train split, as run_qa logged them before training."""
    m = re.search(r"TOKENS split=train features=(\d+) real_tokens=(\d+)", run.text)
    return int(m.group(1)), int(m.group(2))


def _interval_totals(acc: EventAccumulator) -> tuple[float, float]:
    """Samples and real tokens summed over the logging intervals (rate x step time x steps)."""
    samples = tokens = 0.0
    previous = 0
    step_times = _series(acc, "train/step_time_seconds")
    for (step, step_time), (_, sps), (_, tps) in zip(
        step_times, _series(acc, "train/samples_per_second"), _series(acc, "train/tokens_per_second")
    ):
        elapsed = step_time * (step - previous)
        previous = step
        samples += sps * elapsed
        tokens += tps * elapsed
    return samples, tokens


def test_every_scalar_is_written_at_the_logging_steps(plain: Run):
    run = plain.ok()
    acc = _accumulator(run)
    tags = set(acc.Tags()["scalars"])
    expected = TRAIN_TAGS + EVAL_TAGS + (GPU_TAGS if torch.cuda.is_available() else [])
    missing = [t for t in expected if t not in tags]
    assert not missing, f"missing scalars {missing}; have {sorted(tags)}"
    if not torch.cuda.is_available():
        assert not any(t.startswith("train/gpu_memory") for t in tags)
    for tag in TRAIN_TAGS:
        assert [s for s, _ in _series(acc, tag)] == list(range(1, 19)), tag  # --logging_steps 1, 18 steps
    # loss, learning rate and grad norm are the Trainer's own numbers
    state = json.loads((run.out / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "loss" in e]
    for tag, key in (("train/loss", "loss"), ("train/learning_rate", "learning_rate"), ("train/grad_norm", "grad_norm")):
        assert [v for _, v in _series(acc, tag)] == pytest.approx([e[key] for e in logged], rel=1e-6), tag
    eval_results = json.loads((run.out / "eval_results.json").read_text())
    assert _series(acc, "eval/exact_match")[-1][1] == pytest.approx(eval_results["eval_exact_match"])
    assert _series(acc, "eval/f1")[-1][1] == pytest.approx(eval_results["eval_f1"])


def test_throughput_adds_up_to_the_tokens_fed(plain: Run):
    run = plain.ok()
    acc = _accumulator(run)
    features, real_tokens = _train_token_counts(run)
    samples, tokens = _interval_totals(acc)
    # two epochs, every step inside a logged interval: each feature and each real token exactly twice
    assert samples == pytest.approx(2 * features, rel=1e-6)
    assert tokens == pytest.approx(2 * real_tokens, rel=1e-6)
    for _, fraction in _series(acc, "train/real_token_fraction"):
        assert 0.5 < fraction <= 1.0
    for _, step_time in _series(acc, "train/step_time_seconds"):
        assert 0 < step_time < 60


def test_ddp_counts_every_rank_and_only_rank0_writes(ddp: Run):
    run = ddp.ok()
    acc = _accumulator(run)  # asserts a single event file
    state = json.loads((run.out / "trainer_state.json").read_text())
    steps = state["global_step"]
    assert [s for s, _ in _series(acc, "train/loss")] == list(range(1, steps + 1))
    features, real_tokens = _train_token_counts(run)
    samples, tokens = _interval_totals(acc)
    # both ranks ran `steps` full batches (accelerate fills the last batch with wrapped-around
    # features so ranks stay in step), so the all-reduced count is world x steps x batch
    assert samples == pytest.approx(2 * steps * DDP_BATCH, rel=1e-6)
    assert samples > features / 2  # more than one rank's share: the count is summed over ranks
    assert real_tokens <= tokens + 1e-3 and tokens <= samples * 128 + 1e-3


def test_run_totals_as_hparams_and_text(plain: Run):
    run = plain.ok()
    acc = _accumulator(run)
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hparams = {k: v.ListFields()[0][1] for k, v in start.hparams.items()}
    assert hparams["world_size"] == 1 and hparams["precision"] == "fp32"
    assert hparams["per_device_train_batch_size"] == 8 and hparams["epochs"] == 2
    kv = run.kv()
    wall = _series(acc, "hparam/wall_clock_seconds")[0][1]
    assert abs(wall - float(kv["WALL_CLOCK_SECONDS"])) <= 1.0
    assert _series(acc, "hparam/final_loss")[0][1] == pytest.approx(_series(acc, "train/loss")[-1][1])
    assert _series(acc, "hparam/eval_f1")[0][1] == pytest.approx(float(kv["eval_f1"]), abs=1e-4)
    text = acc.Tensors("run_summary/text_summary")[0].tensor_proto.string_val[0].decode()
    for key in ("wall_clock_seconds", "final_loss", "per_device_train_batch_size", "epochs", "world_size", "precision"):
        assert f"| {key} |" in text, key


CPU_COLUMNS = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls"]
MEMORY_COLUMNS = ["CPU Mem", "Self CPU Mem"]
CUDA_COLUMNS = ["Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg"]
UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _header_and_rows(table: str) -> tuple[list[str], list[list[str]]]:
    """Split torch's key_averages table into its header cells and data rows (2+ spaces separate cells)."""
    lines = [ln for ln in table.splitlines() if ln.strip() and not ln.startswith("#")]
    rules = [i for i, ln in enumerate(lines) if set(ln.strip()) <= {"-", " "}]
    header = re.split(r"\s{2,}", lines[rules[0] + 1].strip())
    rows = [re.split(r"\s{2,}", ln.strip()) for ln in lines[rules[1] + 1: rules[2]]]
    return header, rows


def _seconds(cell: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)(us|ms|s)", cell).groups()
    return float(number) * UNIT[unit]


def test_table_has_the_known_columns_and_rows(plain: Run):
    run = plain.ok()
    text = (run.out / "profiler" / "profiler_summary.txt").read_text(encoding="utf-8")
    assert "global steps 3-4" in text and "include the profiler's own overhead" in text
    header, rows = _header_and_rows(text)
    expected = CPU_COLUMNS + MEMORY_COLUMNS + (CUDA_COLUMNS if torch.cuda.is_available() else [])
    for column in expected:
        assert column in header, f"{column!r} missing from {header}"
    names = [r[0] for r in rows]
    # the ops of a BERT training step: matmuls, the fused AdamW update, layer norm, softmax
    assert {"aten::mm", "aten::addmm"} <= set(names), names
    assert any("adam" in n for n in names) and any("layer_norm" in n for n in names)
    calls = [int(r[header.index("# of Calls")]) for r in rows]
    assert all(c >= 1 for c in calls)
    if not torch.cuda.is_available():
        # sorted by self CPU time, largest first
        self_cpu = [_seconds(r[header.index("Self CPU")]) for r in rows]
        assert self_cpu == sorted(self_cpu, reverse=True)
        assert "sorted by self_cpu_time_total" in text
    log = run.text
    assert "PROFILED_STEPS=3-4" in log and "include profiler overhead" in log
    assert "will keep global steps 3-4" in log


def test_trace_is_chrome_json_of_the_profiled_steps(plain: Run):
    run = plain.ok()
    trace = json.loads((run.out / "profiler" / "trace_rank0.json").read_text(encoding="utf-8"))
    events = trace["traceEvents"]
    assert len(events) > 100
    assert profiler_steps(trace) == ["ProfilerStep#3", "ProfilerStep#4"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    mm = [e for e in events if e.get("name") == "aten::mm" and e.get("ph") == "X"]
    assert mm, "no aten::mm in the trace"
    # every matmul lies inside one of the two profiled step spans
    for op in mm:
        assert any(s["ts"] <= op["ts"] and op["ts"] + op["dur"] <= s["ts"] + s["dur"] + 1 for s in steps)
    # --profile_record_shapes and --profile_memory reached the profiler
    assert any("Input Dims" in (e.get("args") or {}) for e in mm)
    assert any(e.get("name") == "[memory]" for e in events)


def test_every_rank_writes_its_own_trace(ddp: Run):
    run = ddp.ok()
    prof = run.out / "profiler"
    for rank in (0, 1):
        trace = json.loads((prof / f"trace_rank{rank}.json").read_text(encoding="utf-8"))
        assert profiler_steps(trace) == ["ProfilerStep#2"]
    assert (prof / "profiler_summary.txt").is_file() and (prof / "profiler_summary_rank1.txt").is_file()
    # the gloo collectives of DDP show up in the trace
    names = {e.get("name", "") for e in json.loads((prof / "trace_rank1.json").read_text())["traceEvents"]}
    assert any("gloo" in n or "allreduce" in n.lower() or "all_reduce" in n for n in names)


def test_memory_json_fields_are_present_and_sane(plain: Run):
    run = plain.ok()
    report = json.loads((run.out / "memory.json").read_text())
    rss = report["cpu"]["peak_rss_mb"]
    assert 50 < rss < psutil.virtual_memory().total / MB
    assert report["max_over_ranks"]["cpu_peak_rss_mb"] == rss
    assert [r["rank"] for r in report["ranks"]] == [0] and report["world_size"] == 1
    if torch.cuda.is_available():
        cuda = report["cuda"]
        assert 0 < cuda["peak_allocated_mb"] <= cuda["peak_reserved_mb"] <= cuda["total_mb"]
        assert report["nvml"] is None or report["nvml"]["used_mb"] >= cuda["peak_reserved_mb"] * 0.5
    else:
        assert report["cuda"] is None and report["nvml"] is None
        assert report["note"] == "no CUDA device"
        assert report["measured_source"].startswith("cpu peak RSS")

    # the estimate, by hand, for the tiny BERT of conftest.build_tiny_bert (vocab 30522, h=64, 2 layers,
    # 2 heads, intermediate 128, 512 positions) at s=128, b=8, fp32 + AdamW:
    #   embeddings 30522*64 + 512*64 + 2*64 + LayerNorm 2*64                = 1,986,432
    #   per layer: QKV 3*(64*64+64) + out 64*64+64 + LN 128 + 64*128+128
    #              + 128*64+64 + LN 128 = 12,480+4,160+128+8,320+8,256+128  =    33,472 (x2 = 66,944)
    #   qa_outputs 64*2+2                                                   =       130
    #   params                                                              = 2,053,506
    #   weights 4 B/param = 8,214,024 B = 7.83 MiB; AdamW 8 B/param = 16,428,048 B = 15.67 MiB
    #   activations: s*b*h = 128*8*64 = 65,536; per layer 65,536*(66 + 9*2*128/64) = 65,536*102
    #                = 6,684,672 (x2 = 13,369,344) + embeddings 65,536*9 = 589,824 -> 13,959,168 B = 13.31 MiB
    #   total 2,053,506*16 + 13,959,168 = 46,815,264 B = 44.65 MiB
    est = report["estimate"]
    assert est["params"] == est["trainable_params"] == 2_053_506
    assert est["bytes_per_param"] == {"weights": 4, "gradients": 4, "optimizer": 8, "total": 16}
    assert (est["weights_mb"], est["gradients_mb"], est["optimizer_mb"]) == (7.8, 7.8, 15.7)
    assert est["activations_mb"] == 13.3
    assert est["total_mb"] == 44.6
    assert report["measured_peak_mb"] == rss


def test_memory_lines_in_the_log_and_wall_clock_last(plain: Run):
    run = plain.ok()
    report = json.loads((run.out / "memory.json").read_text())
    kv = run.kv()
    assert float(kv["MEMORY_CPU_PEAK_RSS_MB"]) == pytest.approx(report["cpu"]["peak_rss_mb"], abs=0.05)
    assert float(kv["MEMORY_ESTIMATE_MB"]) == pytest.approx(report["estimate"]["total_mb"], abs=0.05)
    assert kv["MEMORY_ESTIMATE_BYTES_PER_PARAM"] == "16"
    if torch.cuda.is_available():
        assert float(kv["MEMORY_CUDA_PEAK_ALLOCATED_MB"]) == report["max_over_ranks"]["cuda_peak_allocated_mb"]
    else:
        assert kv["MEMORY_CUDA"] == "none (no CUDA device)"
    assert kv["RUN_WORLD_SIZE"] == "1" and kv["RUN_NODES"] == "1" and kv["RUN_PRECISION"] == "fp32"
    keys = [ln.split("=", 1)[0] for ln in run.text.splitlines() if ln.split("=", 1)[0].isidentifier() and "=" in ln]
    assert keys[-1] == "WALL_CLOCK_SECONDS"


def test_every_rank_is_in_the_report(ddp: Run):
    run = ddp.ok()
    report = json.loads((run.out / "memory.json").read_text())
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    peaks = [r["cpu"]["peak_rss_mb"] for r in report["ranks"]]
    assert all(p > 50 for p in peaks)
    assert report["max_over_ranks"]["cpu_peak_rss_mb"] == max(peaks)
    assert run.kv()["RUN_NODES"] == "1" and run.kv()["RUN_WORLD_SIZE"] == "2"
