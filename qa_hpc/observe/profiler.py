"""torch.profiler on a few scheduled training steps (profiling every step slows training and writes tens of
GB), then stopped: per rank a Chrome/Perfetto trace and the key_averages table, sorted by self device time
(CPU time on a CPU). Each kept step is `ProfilerStep#S` with S the Trainer's global step it completes:
trace, table and TensorBoard speak of the same steps.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from qa_hpc.flags import ObservabilityArguments
from qa_hpc.outputs import PROFILER_SUMMARY

logger = logging.getLogger(__name__)
KEPT = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


class ProfilerCallback(TrainerCallback):
    """Profile the scheduled training steps of every rank; write traces and op tables."""

    def __init__(self, cfg: ObservabilityArguments, out_dir: str, on_gpu: bool) -> None:
        """on_gpu: the run's device is a GPU (not merely one the node has: --use_cpu)."""
        self.cfg = cfg
        self.out_dir = out_dir
        self.rank = 0
        self.prof: torch.profiler.profile | None = None
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        self.sort_by = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
        self.kept_steps: list[int] = []  # global steps recorded in the current cycle
        self.written: list[list[int]] = []  # the global steps of each cycle written out

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.rank = args.process_index
        c = self.cfg
        os.makedirs(self.out_dir, exist_ok=True)
        # ProfilerStep#S completes global step S, also after a resume
        first = state.global_step + 1
        schedule = torch.profiler.schedule(
            wait=c.profile_wait,
            warmup=c.profile_warmup,
            active=c.profile_active,
            repeat=c.profile_repeat,
            skip_first=first,
        )
        self.prof = torch.profiler.profile(
            activities=self.activities,
            on_trace_ready=self._trace_ready,
            schedule=schedule,
            record_shapes=c.profile_record_shapes,
            profile_memory=c.profile_memory,
            with_stack=c.profile_with_stack,
        )
        # the profiler counts its steps from 0: start it at the global step, and in the schedule's action
        # for that step (qa_hpc/private_api.py lists these two attributes)
        self.prof.step_num = first
        self.prof.current_action = self.prof.schedule(first)
        self.prof.start()
        if state.is_world_process_zero:
            kept = first + c.profile_wait + c.profile_warmup
            if not c.profile_repeat:
                span = "every cycle until training ends (repeat=0)"
            else:
                span = f"global steps {kept}-{kept + c.profile_active - 1}"
                if c.profile_repeat > 1:
                    span += f" and {c.profile_repeat - 1} more cycle(s)"
            logger.info(
                "PROFILER on: wait=%d warmup=%d active=%d repeat=%d activities=%s; will keep %s; writing to "
                "%s",
                c.profile_wait,
                c.profile_warmup,
                c.profile_active,
                c.profile_repeat,
                "+".join(a.name for a in self.activities),
                span,
                self.out_dir,
            )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self.prof is None:
            return
        if self.prof.current_action in KEPT:
            self.kept_steps.append(state.global_step)
        if state.max_steps and state.global_step >= state.max_steps:
            return self._stop()  # the last step: close its span without opening an empty next one
        self.prof.step()
        if self.cfg.profile_repeat and len(self.written) >= self.cfg.profile_repeat:
            self._stop()  # schedule done: no profiler cost for the rest of training

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._stop()
        c = self.cfg
        if not self.written:
            logger.warning(
                "PROFILER wrote nothing: training ended before the first kept step (the schedule needs %d "
                "steps from the start of training: wait=%d + warmup=%d + active=%d); lower "
                "--profile_warmup/--profile_wait",
                c.profile_wait + c.profile_warmup + c.profile_active,
                c.profile_wait,
                c.profile_warmup,
                c.profile_active,
            )

    def _stop(self) -> None:
        prof = self.prof
        self.prof = None
        if prof is not None:
            # inside an active window this still calls _trace_ready for what was kept
            prof.stop()

    def _trace_ready(self, prof: torch.profiler.profile) -> None:
        steps = self.kept_steps
        self.kept_steps = []
        c = self.cfg
        rank = self.rank
        self.written.append(steps)
        cycle = len(self.written)
        cycle_suffix = "" if cycle == 1 else f"_cycle{cycle}"
        trace = os.path.join(self.out_dir, f"trace_rank{rank}{cycle_suffix}.json")
        if cycle == 1:  # an earlier launch's later cycles in the folder (a relaunch) would read as this one's
            for stale in Path(self.out_dir).glob(f"trace_rank{rank}_cycle*.json"):
                stale.unlink(missing_ok=True)
        prof.export_chrome_trace(trace)
        rank_suffix = f"_rank{rank}" if rank else ""
        summary = os.path.join(self.out_dir, PROFILER_SUMMARY.replace(".txt", f"{rank_suffix}.txt"))
        span = f"{steps[0]}-{steps[-1]}" if steps else "none"
        with open(summary, "w" if cycle == 1 else "a", encoding="utf-8") as fh:
            fh.write(
                f"# torch.profiler key_averages, rank {rank}, cycle {cycle}: global steps {span} "
                f"({len(steps)} steps, ProfilerStep#<step> in the trace)\n# activities: "
                f"{'+'.join(a.name for a in self.activities)}; sorted by {self.sort_by}; record_shapes="
                f"{c.profile_record_shapes} profile_memory={c.profile_memory} "
                f"with_stack={c.profile_with_stack}"
                "\n# Times are summed over the profiled steps and include the profiler's own overhead.\n"
                + prof.key_averages().table(sort_by=self.sort_by, row_limit=c.profile_row_limit)
                + "\n"
            )
        if len(steps) < c.profile_active:
            logger.warning(
                "PROFILER: training ended inside a profiling window; the trace holds %d step(s), not "
                "--profile_active=%d",
                len(steps),
                c.profile_active,
            )
        logger.info(
            "PROFILED_STEPS=%s rank=%d trace=%s summary=%s (table totals include profiler overhead)",
            span,
            rank,
            trace,
            summary,
        )
