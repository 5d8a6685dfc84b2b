"""The distributed helpers of a run: one answer to "is this distributed?", and the few collectives used.

Every helper is a no-op in a single process, so callers never branch on it. Collectives
(broadcast_from_main, any_rank, gather_to_main, first_on_each_filesystem's barriers) must be
called on every rank.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True when a process group of more than one rank is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def backend() -> str | None:
    """The process group's backend (nccl, gloo), or None without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_backend()
    return None


def env_rank() -> int:
    """This process's global rank as the launcher set it (0 without a launcher), usable before any setup."""
    return int(os.environ.get("RANK", "0"))


def broadcast_from_main(obj: Any) -> Any:
    """Send a picklable object from rank 0 to every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(flag: bool, device: Any) -> bool:
    """True on every rank when the flag is set on any rank (one all_reduce)."""
    if not is_distributed():
        return flag
    box = torch.tensor([1 if flag else 0], dtype=torch.int64, device=device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return bool(box.item())


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """values summed over ranks, in place."""
    if is_distributed():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def gather_to_main(local: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's object, in rank order (all_gather_object: every rank gets the list)."""
    if not is_distributed():
        return [local]
    boxes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(boxes, local)
    return boxes


def barrier() -> None:
    if is_distributed():
        dist.barrier()


@contextmanager
def first_on_each_filesystem(global_rank: int, local_rank: int) -> Iterator[None]:
    """Run the body on global rank 0 first, then on each other node's local rank 0, then everywhere else.

    For a cache file: rank 0 writes it; on a shared filesystem every other rank then finds it,
    and on node-local disks each node's first process writes that node's copy before its other
    processes read it. One writer per file at any time, on either kind of filesystem.
    (transformers' main_process_first is per node: on a shared filesystem the first process of
    every node would write the same file at once.)
    """
    if not is_distributed():
        yield
        return
    if global_rank == 0:
        yield
        barrier()  # 1: the file is written
        barrier()  # 2: every node's first process has it too
        return
    barrier()  # 1
    if local_rank == 0:
        yield
        barrier()  # 2
        return
    barrier()  # 2
    yield


def end_process_group() -> None:
    """End the process group at the end of a run (NCCL warns about a group left behind).

    Call it once the run's objects are freed (gc first: the Trainer and model are in reference
    cycles), so the group's last reference is dropped here and not by a DDP reducer, and after a
    barrier, so no rank still has work in flight on it.
    """
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        barrier()
        dist.destroy_process_group()
