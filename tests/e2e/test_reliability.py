"""Reliability of real processes, each failure made real by the kernel: a stop signal checkpoints, exits 75
and the same command resumes exactly; a writer killed mid-write (SIGXFSZ under RLIMIT_FSIZE) never leaves a
cut file; a full disk (EFBIG under a file-size limit, as ENOSPC) and out-of-memory (RLIMIT_AS) end with their
own exit code. (The same stop under torchrun: tests/e2e/test_ddp.py.)
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pytest
from fixtures.ahead import started_ahead
from fixtures.outputs import temp_files
from fixtures.procs import (
    PYTHON,
    REPO,
    RUN_QA,
    LoggedProcess,
    files_under,
    offline_env,
    ok,
    one_error_line,
    run,
    run_qa,
    tiny_flags,
)
from fixtures.runs import Run, assert_resumed_exactly, plain_flags, read

from qa_hpc.atomic_io import write_json_atomic
from qa_hpc.errors import EXIT_IOERR, EXIT_OOM, EXIT_PREEMPTED
from qa_hpc.outputs import LAUNCH_MARK


def test_sigterm_checkpoints_exits_75_and_resumes_exactly(
    plain: Run, tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
) -> None:
    """The plain run's training, signalled once it trains; the same command resumes it exactly."""
    out = tmp_path / "run"
    args = [*plain_flags(tiny_bert, demo_files, out), "--report_to", "none"]
    first = LoggedProcess([PYTHON, RUN_QA, *args], tmp_path / "first.log")
    try:
        first.wait_for(r"\{'loss'", count=2)  # it is training
        os.kill(first.proc.pid, signal.SIGTERM)
        code = first.proc.wait(timeout=300)
    finally:
        first.kill_all()
    log = first.text()
    stopped = re.search(r"PREEMPTED signal=SIGTERM global_step=(\d+) checkpoint=(\S+)", log)
    assert code == EXIT_PREEMPTED and stopped, log[-3000:]
    step = int(stopped.group(1))
    assert 2 <= step < read(plain.ok().out / "trainer_state.json")["global_step"]
    checkpoint = out / f"checkpoint-{step}"
    assert {
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
        "model.safetensors",
    } <= set(os.listdir(checkpoint))
    # nothing but the checkpoint, the launch's mark and the run's record, which says it was preempted: no
    # results
    kept = ("run_summary.json", LAUNCH_MARK)
    assert all(f.startswith(f"checkpoint-{step}/") or f in kept for f in files_under(out)), files_under(out)
    record = read(out / "run_summary.json")
    assert (record["status"], record["exit_code"]) == ("preempted", EXIT_PREEMPTED)
    assert record["stopped"] == {"signal": "SIGTERM", "global_step": step, "checkpoint": str(checkpoint)}

    assert_resumed_exactly(out, plain.out, log, ok(run_qa(args)), step)
    # the resumed launch's speed is its own (the features after the checkpoint over its own train_runtime),
    # as the Trainer counts it, not the whole run's features over the last launch's time
    results = read(out / "run_summary.json")["results"]
    trainer = read(out / "train_results.json")
    assert results["train_samples_per_second"] == pytest.approx(trainer["train_samples_per_second"], rel=0.01)
    resumed = read(out / "eval_results.json")
    uninterrupted = read(plain.out / "eval_results.json")
    for key in ("eval_exact_match", "eval_f1", "eval_examples", "eval_samples"):
        assert resumed[key] == pytest.approx(uninterrupted[key])
    assert_resumed_runs_get_no_speedup_on_a_time(plain.out, out, step, tmp_path)


def assert_resumed_runs_get_no_speedup_on_a_time(whole: Path, resumed: Path, step: int, tmp: Path) -> None:
    """The record says where the last launch resumed, and the run tables compare its rates, not its time:
    its train_runtime is that launch's alone, so a speedup on it would flatter the run."""
    from qa_hpc.tools import collect_results, report

    assert read(resumed / "run_summary.json")["results"]["train_resumed_from_step"] == step
    assert read(whole / "run_summary.json")["results"]["train_resumed_from_step"] == 0
    table, _ = collect_results.read_runs([str(whole), str(resumed)])
    rows = {Path(d).name: i for i, d in enumerate(table["output_dir"])}
    base = collect_results.pick_baseline(table, None, "train_runtime")[0]
    assert base == rows[whole.name]
    on_time = collect_results.add_speedup(table, base, "train_runtime")
    assert pd.isna(on_time.at[rows[resumed.name], "speedup"])
    md = collect_results.to_markdown(on_time, base, "train_runtime")
    assert (
        f"| ok, resumed from step {step} |" in md
        and "a resumed run's train_runtime is its last launch's" in md
    )
    on_rate = collect_results.add_speedup(table, base, "train_samples_per_second")
    assert on_rate.at[rows[resumed.name], "speedup"] > 0
    named = collect_results.pick_baseline(table, resumed.name, "train_runtime")
    assert (
        named[0] is None
        and f"resumed from step {step}: its train_runtime covers that launch alone" in named[1]
    )
    assert report.main([str(whole), str(resumed), "--out", str(tmp / "report")]) == 0
    md = (tmp / "report" / "report.md").read_text(encoding="utf-8")
    assert f"its last launch resumed from step {step}" in md
    label = table.at[rows[resumed.name], "run"]
    header, _, *lines = md[md.index("## Comparison") :].splitlines()[2:]
    # its times are said to be its last launch's
    named_row = f"| {label} (times: its last launch, from step {step}) |"
    compared = next(line for line in lines if line.startswith(named_row))
    cells = dict(zip(header.strip("| ").split(" | "), compared.strip("| ").split(" | ")))
    assert (cells["speedup"], cells["efficiency"]) == ("n/a", "n/a"), cells
    assert report.main([str(resumed), str(whole), "--out", str(tmp / "report2")]) == 2


# A writer that reaches a file-size limit mid-write: write_json_atomic itself, and the functions run_qa.py
# writes its state and results with (the stand-in trainer has what they read). argv: directory, what, limit,
# kill|ignore.
WRITER = """
import resource, signal, sys, types
from qa_hpc.atomic_io import OutputError, write_json_atomic
out, what, limit, on_limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if what != "predictions":
    from transformers import TrainerState
    from qa_hpc.record import save_results, save_trainer_state
    history = [{"loss": 1.0, "step": i, "note": "x" * 200} for i in range(8000)]
    state = TrainerState(global_step=7, log_history=history)
    trainer = types.SimpleNamespace(
        state=state,
        args=types.SimpleNamespace(output_dir=out),
        is_world_process_zero=lambda: True,
        log_metrics=lambda split, metrics: None,
    )
# Python ignores SIGXFSZ: past the limit a write fails with EFBIG, as on a full disk;
# SIG_DFL: the kernel kills there
signal.signal(signal.SIGXFSZ, signal.SIG_DFL if on_limit == "kill" else signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    if what == "predictions":
        # ~4.5 MB
        write_json_atomic(out + "/eval_predictions.json", {f"q{i}": "x" * 200 for i in range(20000)})
    elif what == "state":
        # ~2 MB
        save_trainer_state(trainer)
    else:
        save_results(trainer, "eval", {f"eval_m{i}": 0.5 for i in range(15000)})
except OutputError as err:
    print(err)
    sys.exit(74)
"""
OLD_PREDICTIONS = {"q1": "old answer"}
OLD_STATE = {"global_step": 3, "log_history": [{"loss": 2.0, "step": 3}]}
OLD_TRAIN = {f"train_m{i}": 0.25 for i in range(20000)}
NEW_EVAL = {f"eval_m{i}": 0.5 for i in range(15000)}


@pytest.mark.parametrize(
    "what, on_limit, limit, before, written, cut",
    [
        # EFBIG half-way through the temp file: OutputError naming file and reason, the old file intact, no
        # temp left
        ("predictions", "ignore", 1 << 20, {"eval_predictions.json": OLD_PREDICTIONS}, {}, None),
        # killed mid-write: the old file intact, the partial temp file beside it
        ("state", "kill", 1 << 20, {"trainer_state.json": OLD_STATE}, {}, "trainer_state.json"),
        # eval_results.json (~0.4 MB) is written, then all_results.json (old metrics + new, ~0.9 MB) is cut
        (
            "results",
            "kill",
            700_000,
            {"all_results.json": OLD_TRAIN, "eval_results.json": {"eval_f1": 1.0}},
            {"eval_results.json": NEW_EVAL},
            "all_results.json",
        ),
    ],
    ids=["write-fails", "killed-trainer-state", "killed-results"],
)
def test_a_writer_stopped_mid_write_leaves_whole_files_old_or_new(
    what, on_limit, limit, before, written, cut, tmp_path: Path
) -> None:
    for name, content in before.items():
        (tmp_path / name).write_text(json.dumps(content))
    proc = run([PYTHON, "-c", WRITER, tmp_path, what, limit, on_limit], timeout=300)
    assert {name: read(tmp_path / name) for name in before} == {**before, **written}
    left = temp_files(tmp_path)
    if cut is None:
        ok(proc, 74)
        assert f"cannot write {tmp_path / next(iter(before))}: File too large" in proc.stdout and left == []
        return
    # killed by the kernel mid-write
    assert proc.returncode == -signal.SIGXFSZ, proc.stderr[-3000:]
    assert (
        len(left) == 1 and left[0].startswith(f".{cut}.") and (tmp_path / left[0]).stat().st_size == limit
    ), left
    # the next write (e.g. the resumed run's) removes the dead one's temp
    write_json_atomic(tmp_path / cut, NEW_EVAL)
    assert temp_files(tmp_path) == [] and read(tmp_path / cut) == NEW_EVAL


# --- resources: a full disk, too little memory -------------------------------------------------------------


def _limit(which: int, nbytes: int):
    return lambda: resource.setrlimit(which, (nbytes, nbytes))


def test_disk_full_while_saving_a_checkpoint(
    tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = tiny_flags(
        tiny_bert,
        out,
        "--do_train",
        "--do_eval",
        "--train_file",
        str(demo_files["train"]),
        "--validation_file",
        str(demo_files["validation"]),
        "--max_train_samples",
        "4",
        "--max_eval_samples",
        "4",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
    )
    # the tiny model's weights are ~8 MB: the checkpoint cannot be written under a 4 MiB limit
    log = ok(run_qa(args, preexec_fn=_limit(resource.RLIMIT_FSIZE, 4 << 20)), EXIT_IOERR)
    assert one_error_line(log).startswith(f"ERROR: cannot write {out}/checkpoint-2: File too large"), log[
        -3000:
    ]
    # training had finished its steps; nothing claims success and no JSON is truncated: the run's record
    # says it failed, with the exit code and the reason
    assert not any(f.endswith("results.json") for f in files_under(out))
    summary = read(out / "run_summary.json")
    assert (summary["status"], summary["exit_code"]) == ("failed", EXIT_IOERR)
    assert "File too large" in summary["error"] and "checkpoint-2" in summary["error"]


# run_qa.py as `python run_qa.py ARGS`, printing the process's peak address space (VmPeak) on exit
VMPEAK_WRAPPER = """import atexit, runpy, sys
def peak():
    for line in open('/proc/self/status'):
        if line.startswith('VmPeak:'):
            print('VMPEAK_KB=' + line.split()[1], file=sys.stderr, flush=True)
atexit.register(peak)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""
# address space allowed beyond the small-batch run's peak
MARGIN = 512 << 20


class OutOfMemoryRuns(NamedTuple):
    small: subprocess.CompletedProcess
    small_peak: int  # bytes of address space; 0 when the small run did not say
    big: subprocess.CompletedProcess | None  # None when the small run failed
    big_out: Path


def out_of_memory_runs(tiny_bert: Path, tmp: Path) -> OutOfMemoryRuns:
    """160 features at --max_seq_length 512: one step at batch 2 (its peak address space measured), then at
    batch 160 under that peak + MARGIN."""
    from qa_hpc.tools.make_demo_data import generate_squad

    train = tmp / "train.json"
    train.write_text(json.dumps(generate_squad(80, seed=1)))
    # fewer glibc arenas: less address space reserved per thread, less noise; the checkout on the path, as
    # `python run_qa.py` has it (the wrapper runs the script by path)
    env = offline_env(MALLOC_ARENA_MAX="2", PYTHONPATH=str(REPO))

    def fit(batch: int, out: str, limit: int | None = None) -> subprocess.CompletedProcess:
        # 512/128 win over tiny_flags' 128/32
        args = tiny_flags(
            tiny_bert,
            tmp / out,
            "--train_file",
            str(train),
            "--do_train",
            "--max_seq_length",
            "512",
            "--doc_stride",
            "128",
            "--pad_to_max_length",
            "--attn_implementation",
            "eager",
            "--max_steps",
            "1",
            "--per_device_train_batch_size",
            str(batch),
            "--save_strategy",
            "no",
            "--features_cache_dir",
            str(tmp / "cache"),
        )
        return run(
            [PYTHON, "-c", VMPEAK_WRAPPER, RUN_QA, *args],
            timeout=300,
            env=env,
            cwd=str(tmp),
            preexec_fn=_limit(resource.RLIMIT_AS, limit) if limit else None,
        )

    small = fit(2, "small")
    said = re.search(r"^VMPEAK_KB=(\d+)$", small.stderr, re.M)
    if small.returncode or not said:
        return OutOfMemoryRuns(small, 0, None, tmp / "big")
    peak = int(said.group(1)) * 1024
    return OutOfMemoryRuns(small, peak, fit(160, "big", peak + MARGIN), tmp / "big")


@pytest.fixture(scope="module", autouse=True)
def out_of_memory(request, tiny_bert: Path, tmp_path_factory) -> Iterator[Future | None]:
    """out_of_memory_runs, started with the module: its two processes (one after the other) run beside the
    module's other tests, which run one process at a time (a process's peak address space is its own)."""
    tests = ["test_out_of_memory_under_an_address_space_limit_exits_3_naming_the_batch"]
    tmp = tmp_path_factory.mktemp("oom")
    with started_ahead(request, tests, out_of_memory_runs, tiny_bert, tmp) as job:
        yield job


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="VmPeak is read from /proc (Linux)")
def test_out_of_memory_under_an_address_space_limit_exits_3_naming_the_batch(out_of_memory: Future):
    """160 features at --max_seq_length 512 in one batch: eager attention keeps 160 x 2 heads x 512 x 512 fp32
    scores (320 MiB) x 3 tensors x 2 layers for backward, ~1.9 GiB, nearly 4x the margin;
    a batch of 2 needs 24 MiB."""
    small, peak, big, big_out = out_of_memory.result()
    assert "TOKENS split=train features=160 " in ok(small) and peak, small.stderr[-3000:]
    assert big.returncode == EXIT_OOM, (
        f"exit {big.returncode}, small-batch peak {peak >> 20} MiB\n{big.stderr[-3000:]}"
    )
    assert one_error_line(big.stderr).startswith(
        "ERROR: out of memory on cpu during train with --per_device_train_batch_size 160 "
        "--gradient_accumulation_steps 1 --max_seq_length 512; try --per_device_train_batch_size 80 "
        "--gradient_accumulation_steps 2 (same effective batch of 160 per device)"
    ), big.stderr[-3000:]
    summary = read(big_out / "run_summary.json")
    assert (summary["status"], summary["exit_code"]) == ("failed", EXIT_OOM)
