"""Stop cleanly when the scheduler says time is up, and resume where the run stopped.

SLURM sends SIGTERM at the time limit or on preemption (and SIGUSR1 a while before,
with `#SBATCH --signal=USR1@120`); torchrun forwards SIGTERM to its workers. The
handler only sets a flag: signal handlers run between two Python bytecodes, so
doing I/O or collectives there could deadlock. Every `vote_every` optimizer steps
(the same global steps on every rank) the ranks vote (an all_reduce of the flag) so
all ranks stop at the same step; on GPUs a vote syncs host and device, so the plan
votes every few steps there and after each step elsewhere. Then the Trainer saves a full checkpoint (weights, optimizer, scheduler, RNG and
trainer state), and run_qa exits with EXIT_PREEMPTED (75). Running the same
command again resumes from that checkpoint.

Also here, for the same goal of ending rather than hanging or losing work:
`apply_collective_timeout` (--ddp_timeout for gloo too), `last_complete_checkpoint`
(never resume from a checkpoint whose writing was cut short) and `checkpoint_to_resume`
(what a non-empty --output_dir means).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
from datetime import timedelta
from types import FrameType
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback

from qa_hpc.dist import any_rank
from qa_hpc.reliability.errors import UsageError
from qa_hpc.reliability.exit_codes import EXIT_PREEMPTED

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


class StopRequest:
    """Records that a stop signal arrived. The handler does nothing else."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "none"


def apply_collective_timeout(seconds: float) -> None:
    """Make --ddp_timeout the timeout of every collective, for gloo as well as NCCL.

    transformers passes ddp_timeout to init_process_group only for GPU backends; a CPU
    (gloo) job keeps torch's 30-minute default, so a frozen rank would hang the job
    that long. Setting it on the initialized group makes a stuck all_reduce fail
    after `seconds` with a "Timed out" error on the waiting ranks.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        logger.warning("this torch cannot change the collective timeout; --ddp_timeout applies to NCCL only")
        return
    setter(timedelta(seconds=seconds), dist.distributed_c10d._get_default_group())
    logger.info("COLLECTIVE_TIMEOUT_SECONDS=%g backend=%s", seconds, dist.get_backend())


class PreemptionCallback(TrainerCallback):
    """Every vote_every optimizer steps: if any rank was signalled, save a checkpoint and stop training."""

    def __init__(self, request: StopRequest, vote_every: int = 1) -> None:
        self.request = request
        self.vote_every = max(1, vote_every)
        self.stopped_at_step: int | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step % self.vote_every:
            return control  # not a voting step: no collective, no host-device sync
        if any_rank(self.request.requested, args.device):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at_step = state.global_step
            logger.warning(
                "STOP_REQUESTED signal=%s global_step=%d: saving a checkpoint, then exiting with %d",
                self.request.name, state.global_step, EXIT_PREEMPTED,
            )
        return control

    @property
    def stopped(self) -> bool:
        return self.stopped_at_step is not None


def checkpoint_is_complete(path: str) -> bool:
    """A checkpoint is complete when its trainer_state.json (the Trainer writes it last) parses."""
    state = os.path.join(path, "trainer_state.json")
    try:
        with open(state, encoding="utf-8") as fh:
            json.load(fh)
    except (OSError, ValueError):
        return False
    return True


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint-N in output_dir that was fully written, skipping (and naming) broken ones.

    A job killed while saving (SIGKILL after the grace period, a full disk) leaves
    a checkpoint folder without its trainer_state.json; resuming from it would fail.
    """
    steps = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_DIR.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            steps.append((int(match.group(1)), name))
    for _, name in sorted(steps, reverse=True):
        path = os.path.join(output_dir, name)
        if checkpoint_is_complete(path):
            return path
        logger.warning("INCOMPLETE_CHECKPOINT path=%s (no readable trainer_state.json); not resuming from it", path)
    return None


def checkpoint_to_resume(training_args: Any, overwrite_output_dir: bool) -> str | None:
    """What a non-empty --output_dir means (transformers 5 has no overwrite_output_dir).

    - --resume_from_checkpoint given: use it.
    - checkpoints present: resume from the last complete one (a requeued SLURM job continues by itself).
    - other files present: refuse, unless --overwrite_output_dir.
    """
    if training_args.resume_from_checkpoint:
        return training_args.resume_from_checkpoint
    out = training_args.output_dir
    if not training_args.do_train or not os.path.isdir(out) or overwrite_output_dir:
        return None
    last = last_complete_checkpoint(out)
    if last is not None:
        logger.info("RESUME_FROM=%s (checkpoint found in --output_dir; add --overwrite_output_dir to start over)", last)
        return last
    leftovers = [n for n in os.listdir(out) if not n.startswith(".")]
    if leftovers:
        raise UsageError(
            f"--output_dir {out} is not empty ({', '.join(sorted(leftovers)[:5])}) and holds no checkpoint to "
            "resume from; add --overwrite_output_dir to train into it anyway, or choose another --output_dir"
        )
    return None
