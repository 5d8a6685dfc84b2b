"""Observability of real runs (the shared plain and 2-rank runs of tests/fixtures/shared_runs.py), read back
with TensorBoard's own reader and from the profiler's and memory report's files: what only a real training
shows (the logging steps, the Trainer's own numbers, counts that add up across ranks, the profiled ops and
spans, measured peaks). How each figure is computed is tested without a run in tests/unit/test_observe.py.
"""

from __future__ import annotations

import re

import psutil
import pytest
import torch
from fixtures.outputs import profiler_steps, scalars, tensorboard_events
from fixtures.runs import DDP_BATCH, Run, read

CUDA = torch.cuda.is_available()
TRAIN_TAGS = [
    "train/loss",
    "train/learning_rate",
    "train/grad_norm",
    "train/step_time_seconds",
    "train/samples_per_second",
    "train/tokens_per_second",
]
GPU_TAGS = ["train/gpu_memory_allocated_mb", "train/gpu_memory_reserved_mb"]


def _train_token_counts(run: Run) -> tuple[int, ...]:
    """features and real tokens of the train split, as run_qa logged them before training."""
    return tuple(
        map(int, re.search(r"TOKENS split=train features=(\d+) real_tokens=(\d+)", run.text).groups())
    )


def _interval_totals(acc) -> tuple[float, float]:
    """Samples and real tokens summed over the logging intervals (rate x step time x steps)."""
    samples = tokens = 0.0
    previous = 0
    for (step, step_time), (_, sps), (_, tps) in zip(
        *(
            scalars(acc, f"train/{name}")
            for name in ("step_time_seconds", "samples_per_second", "tokens_per_second")
        )
    ):
        elapsed = step_time * (step - previous)
        previous = step
        samples += sps * elapsed
        tokens += tps * elapsed
    return samples, tokens


def test_every_scalar_is_written_at_the_logging_steps_and_adds_up(plain: Run):
    acc = tensorboard_events(plain.ok().out)
    tags = set(acc.Tags()["scalars"])
    missing = set(TRAIN_TAGS + ["eval/exact_match", "eval/f1"] + (GPU_TAGS if CUDA else [])) - tags
    assert not missing and (CUDA or not any(t.startswith("train/gpu_memory") for t in tags)), (missing, tags)
    for tag in TRAIN_TAGS:
        assert [s for s, _ in scalars(acc, tag)] == list(range(1, 19)), tag  # --logging_steps 1, 18 steps
    # loss, learning rate and grad norm are the Trainer's own numbers
    logged = [e for e in read(plain.out / "trainer_state.json")["log_history"] if "loss" in e]
    for key in ("loss", "learning_rate", "grad_norm"):
        assert [v for _, v in scalars(acc, f"train/{key}")] == pytest.approx(
            [e[key] for e in logged], rel=1e-6
        ), key
    eval_results = read(plain.out / "eval_results.json")
    for key in ("exact_match", "f1"):
        assert scalars(acc, f"eval/{key}")[-1][1] == pytest.approx(eval_results[f"eval_{key}"])
    # two epochs, every step inside a logged interval: each feature and each real token exactly twice
    features, real_tokens = _train_token_counts(plain)
    assert _interval_totals(acc) == pytest.approx((2 * features, 2 * real_tokens), rel=1e-6)
    assert all(0.5 < fraction <= 1.0 for _, fraction in scalars(acc, "train/real_token_fraction"))
    assert all(0 < step_time < 60 for _, step_time in scalars(acc, "train/step_time_seconds"))
    # the run's totals (the HPARAMS tab's layout: tests/unit): its own wall clock, last loss and results
    kv = plain.kv()
    assert abs(scalars(acc, "hparam/wall_clock_seconds")[0][1] - float(kv["WALL_CLOCK_SECONDS"])) <= 1.0
    assert scalars(acc, "hparam/final_loss")[0][1] == pytest.approx(scalars(acc, "train/loss")[-1][1])
    assert scalars(acc, "hparam/eval_f1")[0][1] == pytest.approx(float(kv["eval_f1"]), abs=1e-4)


def _header_and_rows(table: str) -> tuple[list[str], list[list[str]]]:
    """Split torch's key_averages table into its header cells and data rows (2+ spaces separate cells)."""
    lines = [ln for ln in table.splitlines() if ln.strip() and not ln.startswith("#")]
    rules = [i for i, ln in enumerate(lines) if set(ln.strip()) <= {"-", " "}]
    header = re.split(r"\s{2,}", lines[rules[0] + 1].strip())
    return header, [re.split(r"\s{2,}", ln.strip()) for ln in lines[rules[1] + 1 : rules[2]]]


def _seconds(cell: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)(us|ms|s)", cell).groups()
    return float(number) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def test_profiler_table_and_trace_cover_the_scheduled_steps(plain: Run):
    text = (plain.ok().out / "profiler" / "profiler_summary.txt").read_text(encoding="utf-8")
    assert "global steps 3-4" in text and "include the profiler's own overhead" in text
    assert "PROFILED_STEPS=3-4" in plain.text and "include profiler overhead" in plain.text
    assert "will keep global steps 3-4" in plain.text
    header, rows = _header_and_rows(text)
    columns = [
        "Name",
        "Self CPU %",
        "Self CPU",
        "CPU total %",
        "CPU total",
        "CPU time avg",
        "# of Calls",
        "CPU Mem",
        "Self CPU Mem",
    ] + (["Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg"] if CUDA else [])
    assert set(columns) <= set(header), header  # the memory columns: --profile_memory reached the profiler
    names = [r[0] for r in rows]
    # the ops of a BERT training step: matmuls, the fused AdamW update, layer norm, softmax
    assert {"aten::mm", "aten::addmm"} <= set(names), names
    assert any("adam" in n for n in names) and any("layer_norm" in n for n in names)
    assert all(int(r[header.index("# of Calls")]) >= 1 for r in rows)
    if not CUDA:  # sorted by self CPU time, largest first
        self_cpu = [_seconds(r[header.index("Self CPU")]) for r in rows]
        assert self_cpu == sorted(self_cpu, reverse=True) and "sorted by self_cpu_time_total" in text

    trace = read(plain.out / "profiler" / "trace_rank0.json")
    events = trace["traceEvents"]
    assert len(events) > 100 and profiler_steps(trace) == ["ProfilerStep#3", "ProfilerStep#4"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    mm = [e for e in events if e.get("name") == "aten::mm" and e.get("ph") == "X"]
    # every matmul lies inside one of the two profiled step spans
    assert mm and all(
        any(s["ts"] <= op["ts"] and op["ts"] + op["dur"] <= s["ts"] + s["dur"] + 1 for s in steps)
        for op in mm
    )
    # --profile_record_shapes and --profile_memory reached the profiler
    assert any("Input Dims" in (e.get("args") or {}) for e in mm) and any(
        e.get("name") == "[memory]" for e in events
    )


def test_memory_report_lines_and_estimate(plain: Run):
    """Real peaks and their KEY=value lines (the estimate's arithmetic and the report's layout:
    tests/unit)."""
    report = read(plain.ok().out / "memory.json")
    kv = plain.kv()
    rss = report["cpu"]["peak_rss_mb"]
    assert 50 < rss < psutil.virtual_memory().total / 2**20
    assert report["max_over_ranks"]["cpu_peak_rss_mb"] == rss == report["measured_peak_mb"]
    if CUDA:
        cuda = report["cuda"]
        assert 0 < cuda["peak_allocated_mb"] <= cuda["peak_reserved_mb"] <= cuda["total_mb"]
        assert report["nvml"] is None or report["nvml"]["used_mb"] >= cuda["peak_reserved_mb"] * 0.5
        assert (
            float(kv["MEMORY_CUDA_PEAK_ALLOCATED_MB"]) == report["max_over_ranks"]["cuda_peak_allocated_mb"]
        )
    else:
        assert report["cuda"] is None and report["nvml"] is None and report["note"] == "no CUDA device"
        assert report["measured_source"].startswith("cpu peak RSS")
        assert kv["MEMORY_CUDA"] == "none (no CUDA device)"
    assert float(kv["MEMORY_CPU_PEAK_RSS_MB"]) == pytest.approx(rss, abs=0.05)
    assert float(kv["MEMORY_ESTIMATE_MB"]) == pytest.approx(report["estimate"]["total_mb"], abs=0.05)
    assert (kv["MEMORY_ESTIMATE_BYTES_PER_PARAM"], kv["RUN_NODES"], kv["RUN_PRECISION"]) == (
        "16",
        "1",
        "fp32",
    )


def test_ddp_counts_every_rank_rank0_alone_writes_scalars_each_rank_its_trace(ddp: Run):
    acc = tensorboard_events(ddp.ok().out)  # asserts a single event file
    steps = read(ddp.out / "trainer_state.json")["global_step"]
    assert [s for s, _ in scalars(acc, "train/loss")] == list(range(1, steps + 1))
    features, real_tokens = _train_token_counts(ddp)
    samples, tokens = _interval_totals(acc)
    # both ranks ran `steps` full batches (accelerate fills the last batch with wrapped-around
    # features so ranks stay in step), so the all-reduced count is world x steps x batch
    assert samples == pytest.approx(2 * steps * DDP_BATCH, rel=1e-6)
    assert samples > features / 2  # more than one rank's share: the count is summed over ranks
    assert real_tokens <= tokens + 1e-3 and tokens <= samples * 128 + 1e-3

    prof = ddp.out / "profiler"
    for rank in (0, 1):
        assert profiler_steps(read(prof / f"trace_rank{rank}.json")) == ["ProfilerStep#2"]
    assert (prof / "profiler_summary.txt").is_file() and (prof / "profiler_summary_rank1.txt").is_file()
    # the gloo collectives of DDP show up in the trace
    names = {e.get("name", "") for e in read(prof / "trace_rank1.json")["traceEvents"]}
    assert any("gloo" in n or "allreduce" in n.lower() or "all_reduce" in n for n in names)

    report = read(ddp.out / "memory.json")
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    peaks = [r["cpu"]["peak_rss_mb"] for r in report["ranks"]]
    assert all(p > 50 for p in peaks) and report["max_over_ranks"]["cpu_peak_rss_mb"] == max(peaks)
    assert (ddp.kv()["RUN_NODES"], ddp.kv()["RUN_WORLD_SIZE"]) == ("1", "2")
