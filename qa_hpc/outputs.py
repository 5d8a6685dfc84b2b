"""The names of what a run leaves in its --output_dir that more than one module writes or reads, and where
the Trainer's checkpoints are: one place for them, importing nothing of the project's (the record, the plan,
the profiler, preemption and the tools all take them from here).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SUMMARY_FILE = "run_summary.json"
# the other files of an output folder that more than one module reads or writes (the Trainer's names for its
# own: transformers' TRAINER_STATE_NAME and PREFIX_CHECKPOINT_DIR, not imported: the tools load no torch)
MEMORY_FILE = "memory.json"
ALL_RESULTS_FILE = "all_results.json"
TRAINER_STATE_FILE = "trainer_state.json"
CHECKPOINT_PREFIX = "checkpoint-"
# written by each training launch once it has replaced what it replaces: the Slurm job it belongs to. Hidden:
# no check of what --output_dir holds counts it
LAUNCH_MARK = ".qa_hpc_launch.json"
# the profiler's default folder in --output_dir, and its table there (rank 0's; `_rank<N>` before .txt for
# another rank's)
PROFILER_DIR = "profiler"
PROFILER_SUMMARY = "profiler_summary.txt"


# the folders the Trainer saves checkpoints into, numbered by global step (transformers' own pattern)
CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}(\d+)")


def checkpoint_dir(output_dir: str | os.PathLike, step: int) -> str:
    """The folder the Trainer saves global step `step`'s checkpoint into."""
    return os.path.join(output_dir, f"{CHECKPOINT_PREFIX}{step}")


def checkpoint_step(path: str | os.PathLike) -> int:
    """The global step a checkpoint-N folder's name says."""
    return int(CHECKPOINT_NAME.fullmatch(os.path.basename(path)).group(1))


def checkpoints_oldest_first(output_dir: str | os.PathLike) -> list[str]:
    """The checkpoint-N folders in output_dir, by N (the Trainer's own order; transformers has no public
    call for it)."""
    numbered = []
    for path in Path(output_dir).glob(f"{CHECKPOINT_PREFIX}*"):
        match = CHECKPOINT_NAME.fullmatch(path.name)
        if match is not None and path.is_dir():
            numbered.append((int(match.group(1)), str(path)))
    return [path for _, path in sorted(numbered)]
