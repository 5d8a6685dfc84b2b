"""One rank of a 2-process torchrun job dies or freezes: the job ends non-zero in bounded time, naming it.

Real torchrun runs on CPU (gloo). The dead rank is killed by its pid, which run_qa
logs at start (`RANK_PID rank=N pid=P`). A frozen rank (SIGSTOP: a hung node or
file system) is caught by the collective timeout, --ddp_timeout, which run_qa
passes to the gloo process group as well as to NCCL.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from fixtures.procs import free_port
from fixtures.runqa import PYTHON, REPO, LoggedProcess, tiny_flags

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(os.name != "posix", reason="signals and torchrun on POSIX")]


def _start(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path, *extra: str) -> LoggedProcess:
    flags = [
        *tiny_flags(tiny_bert, tmp_path / "out"), "--do_train", "--train_file", str(demo_files["train"]),
        "--max_train_samples", "8", "--per_device_train_batch_size", "4", "--num_train_epochs", "200",
        "--logging_steps", "1", "--save_strategy", "no", *extra,
    ]
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(REPO / "run_qa.py"), *flags]
    return LoggedProcess(cmd, tmp_path / "torchrun.log")


def _pids(run: LoggedProcess) -> dict[int, int]:
    run.wait_for(r"RANK_PID rank=1 ", timeout=300)
    run.wait_for(r"RANK_PID rank=0 ", timeout=300)
    return {int(r): int(p) for r, p in re.findall(r"RANK_PID rank=(\d+) local_rank=\d+ pid=(\d+)", run.text())}


def _cleanup(run: LoggedProcess, pids: dict[int, int]) -> None:
    run.kill_all()
    for pid in pids.values():  # workers may live in their own sessions
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_killed_rank_ends_the_job_and_is_named(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path) -> None:
    run = _start(tiny_bert, demo_files, tmp_path)
    pids: dict[int, int] = {}
    try:
        pids = _pids(run)
        run.wait_for(r"\{'loss'", count=2)  # both ranks are in the training loop
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        code = run.wait(timeout=180)
        elapsed = time.monotonic() - t0
    finally:
        _cleanup(run, pids)
    log = run.text()
    assert code != 0, log[-4000:]
    assert elapsed < 120, f"took {elapsed:.0f}s to notice a dead rank"
    # the launcher's failure report names the rank, its pid and the signal
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", log), log[-4000:]
    assert f"pid: {pids[1]}" in log and "SIGKILL" in log


def test_frozen_rank_hits_the_collective_timeout(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path) -> None:
    timeout = 10
    run = _start(tiny_bert, demo_files, tmp_path, "--ddp_timeout", str(timeout))
    pids: dict[int, int] = {}
    try:
        pids = _pids(run)
        run.wait_for(r"\{'loss'", count=2)
        os.kill(pids[1], signal.SIGSTOP)  # alive but silent, sockets open: only a timeout can tell
        t0 = time.monotonic()
        code = run.wait(timeout=300)
        elapsed = time.monotonic() - t0
    finally:
        _cleanup(run, pids)
    log = run.text()
    assert code != 0, log[-4000:]
    # rank 0 gives up after --ddp_timeout (not the 1800 s default), says so, and the launcher stops the job
    assert elapsed < 150, f"took {elapsed:.0f}s"
    failed = re.search(r"ERROR: rank 0 \(pid (\d+)\) failed: (.*)", log)
    assert failed and int(failed.group(1)) == pids[0], log[-4000:]
    assert re.search(r"[Tt]imed out|[Tt]imeout", failed.group(2)), failed.group(0)
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)", log)
