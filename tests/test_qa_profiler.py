"""The profiler callback: off by default, on it writes an op table and a Chrome trace per rank.

End to end: real tiny runs of run_qa.py (one process, and torchrun with two ranks) with
--profile, then the files are opened: the table's columns and rows, the trace's JSON
and its ProfilerStep#N spans for exactly the scheduled steps. The schedule edge cases
drive the callback with real torch work and the Trainer's own state objects.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from transformers import TrainerControl, TrainerState

from qa_hpc.observe.profiler import ProfilerCallback
from qa_hpc.settings.flags import ObservabilityArguments

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


def test_profiler_is_off_by_default_and_flags_parse():
    from fixtures.settings import plan_and_flags
    from qa_hpc.reliability.errors import UsageError

    plan, flags = plan_and_flags(["--output_dir", "x"])
    obs = flags.observe
    assert obs.profile is False and plan.profile_dir is None
    assert (obs.profile_wait, obs.profile_warmup, obs.profile_active, obs.profile_repeat) == (2, 100, 8, 1)
    plan, flags = plan_and_flags(["--output_dir", "x", "--profile", "--profile_wait", "1", "--profile_warmup", "3",
                                  "--profile_active", "4", "--profile_repeat", "2", "--profile_with_stack"])
    obs = flags.observe
    assert (obs.profile_wait, obs.profile_warmup, obs.profile_active, obs.profile_repeat, obs.profile_with_stack) == (
        1, 3, 4, 2, True)
    assert obs.profile_steps_needed == 16 and plan.profile_dir == "x/profiler"
    with pytest.raises(UsageError, match="profile_active"):
        plan_and_flags(["--output_dir", "x", "--profile", "--profile_active", "0"])


def test_no_profiler_callback_unless_asked(tmp_path):
    from fixtures.settings import plan_and_flags
    from qa_hpc.model import ModelShape
    from qa_hpc.observe.observability import Observability

    shape = ModelShape.of(torch.nn.Linear(2, 2))
    for flags_on, wanted in (([], False), (["--profile"], True)):
        plan, flags = plan_and_flags(["--output_dir", str(tmp_path), "--report_to", "none", *flags_on])
        obs = Observability(flags.observe, plan, flags.training, shape, 128)
        assert any(isinstance(c, ProfilerCallback) for c in obs.callbacks) == wanted


def _schedule(wait: int, warmup: int, active: int, repeat: int = 1) -> ObservabilityArguments:
    return ObservabilityArguments(profile=True, profile_wait=wait, profile_warmup=warmup, profile_active=active,
                                  profile_repeat=repeat)


def _drive(cb: ProfilerCallback, steps: int) -> None:
    """Real training-like work between the Trainer's step events."""
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state, control = TrainerState(max_steps=steps), TrainerControl()
    cb.on_train_begin(None, state, control)
    for _ in range(steps):
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
        state.global_step += 1
        cb.on_step_end(None, state, control)
    cb.on_train_end(None, state, control)


def test_training_shorter_than_the_window_keeps_what_it_has(tmp_path, caplog):
    cb = ProfilerCallback(_schedule(wait=1, warmup=1, active=3), str(tmp_path))
    with caplog.at_level(logging.INFO, logger="qa_hpc.observe.profiler"):
        _drive(cb, 3)
    trace = json.loads((tmp_path / "trace_rank0.json").read_text())
    assert _profiler_steps(trace) == ["ProfilerStep#3"]
    assert cb.written[0]["steps"] == [3]
    assert "ended inside a profiling window" in caplog.text


def test_training_shorter_than_the_warmup_writes_nothing_and_says_why(tmp_path, caplog):
    cb = ProfilerCallback(_schedule(wait=2, warmup=100, active=8), str(tmp_path))
    with caplog.at_level(logging.INFO, logger="qa_hpc.observe.profiler"):
        _drive(cb, 3)
    assert not list(tmp_path.glob("trace_*.json"))
    assert "wrote nothing" in caplog.text and "110 steps" in caplog.text


def test_repeat_writes_one_trace_per_cycle_then_stops(tmp_path):
    cb = ProfilerCallback(_schedule(wait=0, warmup=1, active=1, repeat=2), str(tmp_path))
    _drive(cb, 7)
    assert [w["steps"] for w in cb.written] == [[2], [4]]
    assert cb.prof is None  # stopped after the last cycle: steps 5-7 ran without the profiler
    assert _profiler_steps(json.loads((tmp_path / "trace_rank0_cycle2.json").read_text())) == ["ProfilerStep#4"]
    summary = (tmp_path / "profiler_summary.txt").read_text()
    assert "cycle 1: global steps 2-2" in summary and "cycle 2: global steps 4-4" in summary
