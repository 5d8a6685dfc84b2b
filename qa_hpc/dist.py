"""Who this process is before the process group exists (after: accelerate's PartialState, as the Trainer
asks), when it started, and the few collectives a run makes: no-ops in one process, so callers never
branch on it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.distributed as dist

from qa_hpc.errors import UsageError

Launch = NamedTuple(
    "Launch", [("rank", int), ("local_rank", int), ("world_size", int), ("local_world_size", int)]
)
# where Linux keeps this process's start: field 22, in clock ticks after boot
PROC_SELF_STAT = "/proc/self/stat"


def launch_env(env: Mapping[str, str] = os.environ) -> Launch:
    """This process's place as its launcher (torchrun, accelerate launch) set it: rank 0 of 1 without one."""

    def number(name: str, default: int) -> int:
        return int(env[name]) if env.get(name, "").strip().isdigit() else default

    return Launch(
        number("RANK", 0), number("LOCAL_RANK", 0), number("WORLD_SIZE", 1), number("LOCAL_WORLD_SIZE", 1)
    )


def process_start_time() -> float:
    """When this process started, as unix time: WALL_CLOCK_SECONDS counts from there, the interpreter's
    start-up and the imports included."""
    if not os.path.exists(PROC_SELF_STAT):
        import psutil

        return psutil.Process().create_time()
    with open(PROC_SELF_STAT, encoding="utf-8", errors="replace") as fh:
        stat = fh.read()
    # the fields after the command name (field 2, in parentheses, may hold spaces and parentheses):
    # after_name[0] is field 3, so the start, field 22, is after_name[19]
    after_name = stat.rsplit(")", 1)[1].split()
    started_after_boot = int(after_name[19]) / os.sysconf("SC_CLK_TCK")
    # against the boot clock now, not psutil's create_time: that adds the boot time in whole seconds, up
    # to a second early, and the wall clock would then count time before the process existed
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot)


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest rank's `value`, on every rank (one all_reduce; no device sync in one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return int(box.item())


def same_on_every_rank(what: str, value: object, remedy: str) -> None:
    """Raise UsageError on every rank (exit 2) where the ranks hold different `value`s of `what`, naming
    them and the `remedy`: one all_gather_object; nothing in one process. For what each rank decides from
    the files it sees."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    values: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    if message := disagreement(what, values):
        raise UsageError(f"{message}; {remedy}")


def disagreement(what: str, values: list[object]) -> str | None:
    """What the ranks (by index) disagree on, in words; None where they agree."""
    if all(value == values[0] for value in values):
        return None
    differ = [rank for rank, value in enumerate(values) if value != values[0]]
    return (
        f"the ranks disagree on {what}: rank 0 {values[0]!r}, "
        + ", ".join(f"rank {rank} {values[rank]!r}" for rank in differ[:3])
        + (f" (and {len(differ) - 3} more)" if len(differ) > 3 else "")
    )


@contextmanager
def first_on_each_filesystem() -> Iterator[None]:
    """The body on global rank 0 first, then on every other node's first rank, then on the rest: one writer
    per cache file both on a shared filesystem and on node-local disks. (accelerate's local_main_process_first
    would have every node's first rank write the same shared file at once.)"""
    # not at import: the job scripts' `plan --gpu-count` needs none of it
    from accelerate import PartialState

    state = PartialState()
    if state.is_main_process:
        turn = 0
    elif state.is_local_main_process:
        turn = 1
    else:
        turn = 2
    for wave in range(3):
        if wave == turn:
            yield
        if wave < 2:
            state.wait_for_everyone()


@contextmanager
def exit_code_noted(env: Mapping[str, str] = os.environ) -> Iterator[None]:
    """Around a process's whole life (sys.exit inside): its exit code in the file QA_EXIT_CODE_DIR/rank<R>
    where that variable is set. torchrun exits 1 whatever its ranks' codes; job_ddp.sh reads these to report
    the run's own (a usage error's 2, an out-of-memory's 3), as a single process reports it."""
    code = 1  # an exception that escapes: Python's exit status
    try:
        yield
        code = 0
    except SystemExit as done:  # sys.exit(N), argparse's usage error and --help
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
        raise
    finally:
        if folder := env.get("QA_EXIT_CODE_DIR"):
            # a folder gone or unwritable must not replace the run's own exit with a traceback: the job then
            # reports the launcher's code
            with (
                contextlib.suppress(OSError),
                open(os.path.join(folder, f"rank{launch_env(env).rank}"), "w") as f,
            ):
                f.write(f"{code}\n")


def end_process_group() -> None:
    """End the group at the end of a run (NCCL warns about one left behind): after gc, so its last
    reference drops here and not in a DDP reducer (the Trainer is in reference cycles), and a barrier."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
