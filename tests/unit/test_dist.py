"""When this process started (qa_hpc.dist.process_start_time), which WALL_CLOCK_SECONDS counts from: read
in this very process. (The closing line of a real run, between its timed phases and its whole life as a test
measures it: tests/e2e/test_run_qa.py.) The exit code a rank notes for its job (exit_code_noted). What
the ranks disagree on (disagreement)."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import psutil
import pytest

import qa_hpc.dist
from qa_hpc.dist import (
    Launch,
    disagreement,
    exit_code_noted,
    launch_env,
    process_start_time,
    same_on_every_rank,
)


def test_start_is_this_process_start_to_the_tick() -> None:
    start = process_start_time()
    # psutil's figure is the boot time in whole seconds plus the start after boot: the same start, up to a
    # second early; with the boot time read from the boot clock instead, the same start to the tick
    by_psutil = psutil.Process().create_time()
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    assert start == pytest.approx(booted + by_psutil - psutil.boot_time(), abs=0.01)
    assert 0 <= start - by_psutil < 1.01
    assert start < time.time()


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Path("/proc/self/stat").read_text()
    pid, rest = real.split(" ", 1)
    odd = tmp_path / "stat"
    odd.write_text(f"{pid} (py) 1 (x) {rest.rsplit(')', 1)[1].lstrip()}")
    expected = process_start_time()
    monkeypatch.setattr(qa_hpc.dist, "PROC_SELF_STAT", str(odd))
    assert process_start_time() == pytest.approx(expected, abs=0.01)


def test_without_proc_the_start_is_psutils(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qa_hpc.dist, "PROC_SELF_STAT", str(tmp_path / "no-proc"))
    assert process_start_time() == psutil.Process().create_time()


@pytest.mark.parametrize(
    "body, code", [(lambda: None, 0), (lambda: sys.exit(2), 2), (lambda: 1 / 0, 1), (lambda: sys.exit(), 0)]
)
def test_a_rank_notes_its_exit_code_for_the_job(tmp_path: Path, body, code: int) -> None:
    """QA_EXIT_CODE_DIR/rank<R>: the code the process exits with (sys.exit's, or 1 for an exception that
    escapes); a folder that is gone leaves the exit as it was."""
    env = {"QA_EXIT_CODE_DIR": str(tmp_path), "RANK": "3"}
    with contextlib.suppress(SystemExit, ZeroDivisionError), exit_code_noted(env):
        body()
    assert (tmp_path / "rank3").read_text() == f"{code}\n"
    with (
        pytest.raises(SystemExit) as done,
        exit_code_noted({**env, "QA_EXIT_CODE_DIR": str(tmp_path / "gone")}),
    ):
        sys.exit(2)
    assert done.value.code == 2


def test_ranks_that_decide_apart_are_named_with_what_each_holds() -> None:
    """Where each rank decides from the files it sees (where training starts), a rank that sees another
    folder (a node-local --output_dir) is named with its value beside rank 0's; in one process, nothing is
    gathered."""
    assert disagreement("where training starts", [(False, "out/checkpoint-8")] * 4) is None
    values = [(False, "out/checkpoint-8"), (False, "out/checkpoint-8"), (False, None), (False, None)]
    assert disagreement("where training starts", values) == (
        "the ranks disagree on where training starts: rank 0 (False, 'out/checkpoint-8'), "
        "rank 2 (False, None), rank 3 (False, None)"
    )
    many = [1] + [2] * 5
    assert (
        disagreement("x", many)
        == "the ranks disagree on x: rank 0 1, rank 1 2, rank 2 2, rank 3 2 (and 2 more)"
    )
    # three named: none more
    assert disagreement("x", many[:4]) == "the ranks disagree on x: rank 0 1, rank 1 2, rank 2 2, rank 3 2"
    same_on_every_rank("x", object(), "no remedy needed")  # no process group: no collective, no error


@pytest.mark.parametrize(
    "env, launch",
    [
        ({}, Launch(0, 0, 1, 1)),  # no launcher: rank 0 of 1
        ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, Launch(3, 1, 8, 4)),
        # set but empty or not a number (a job script's leftover): as if unset, not a ValueError at start
        ({"RANK": "", "LOCAL_RANK": " ", "WORLD_SIZE": "two", "LOCAL_WORLD_SIZE": "-1"}, Launch(0, 0, 1, 1)),
    ],
)
def test_a_process_finds_its_place_from_what_its_launcher_set(env: dict[str, str], launch: Launch) -> None:
    assert launch_env(env) == launch
