"""The profiler callback: off by default, on it writes an op table and a Chrome trace per rank.

End to end: real tiny runs of run_qa.py (one process, and torchrun with two ranks) with
--profile, then the files are opened: the table's columns and rows, the trace's JSON
and its ProfilerStep#N spans for exactly the scheduled steps. The schedule edge cases
drive the callback with real torch work and the Trainer's own state objects.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from observe_runs import ok_run

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


def _profiler_steps(trace: dict) -> list[str]:
    return sorted({e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")})


@pytest.mark.e2e
def test_table_has_the_known_columns_and_rows(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("single", tmp_path_factory, tiny_bert, demo_files)
    text = (run.out_dir / "profiler" / "profiler_summary.txt").read_text(encoding="utf-8")
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


@pytest.mark.e2e
def test_trace_is_chrome_json_of_the_profiled_steps(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("single", tmp_path_factory, tiny_bert, demo_files)
    trace = json.loads((run.out_dir / "profiler" / "trace_rank0.json").read_text(encoding="utf-8"))
    events = trace["traceEvents"]
    assert len(events) > 100
    assert _profiler_steps(trace) == ["ProfilerStep#3", "ProfilerStep#4"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    mm = [e for e in events if e.get("name") == "aten::mm" and e.get("ph") == "X"]
    assert mm, "no aten::mm in the trace"
    # every matmul lies inside one of the two profiled step spans
    for op in mm:
        assert any(s["ts"] <= op["ts"] and op["ts"] + op["dur"] <= s["ts"] + s["dur"] + 1 for s in steps)
    # --profile_record_shapes and --profile_memory reached the profiler
    assert any("Input Dims" in (e.get("args") or {}) for e in mm)
    assert any(e.get("name") == "[memory]" for e in events)


@pytest.mark.e2e
def test_every_rank_writes_its_own_trace(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("ddp", tmp_path_factory, tiny_bert, demo_files)
    prof = run.out_dir / "profiler"
    for rank in (0, 1):
        trace = json.loads((prof / f"trace_rank{rank}.json").read_text(encoding="utf-8"))
        assert _profiler_steps(trace) == ["ProfilerStep#2"]
    assert (prof / "profiler_summary.txt").is_file() and (prof / "profiler_summary_rank1.txt").is_file()
    # the gloo collectives of DDP show up in the trace
    names = {e.get("name", "") for e in json.loads((prof / "trace_rank1.json").read_text())["traceEvents"]}
    assert any("gloo" in n or "allreduce" in n.lower() or "all_reduce" in n for n in names)
