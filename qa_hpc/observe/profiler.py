"""torch.profiler for a few training steps: an op table and a Chrome/Perfetto trace per rank.

Profiling every step slows training and writes tens of GB, so the profiler follows a
schedule: skip `wait` steps, trace `warmup` steps without keeping them (the first
steps are dominated by allocator and kernel warm-up), keep `active` steps, `repeat`
times. When the schedule is done the profiler is stopped, so the rest of training
runs at full speed; with --profile off this callback is never created at all.

Output in <output_dir>/profiler/:
  trace_rank{N}.json        Chrome trace of the kept steps of rank N (open in ui.perfetto.dev
                            or chrome://tracing); later cycles: trace_rank{N}_cycle{K}.json
  profiler_summary.txt      key_averages table of rank 0 (other ranks: profiler_summary_rank{N}.txt),
                            sorted by self device time on GPU, self CPU time on CPU

The trace names each kept step `ProfilerStep#S` where S is the Trainer's global step
that the step completes, so trace, table and TensorBoard all speak of the same steps.
"""

from __future__ import annotations

import logging
import os

import torch
from accelerate import PartialState
from torch.profiler import ProfilerAction, ProfilerActivity
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from qa_hpc.flags import ObservabilityArguments

logger = logging.getLogger(__name__)

RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


class ProfilerCallback(TrainerCallback):
    """Profile the scheduled training steps of every rank; write traces and op tables."""

    def __init__(self, cfg: ObservabilityArguments, out_dir: str) -> None:
        self.cfg, self.out_dir = cfg, out_dir
        self.rank = 0  # the Trainer's process index, set in on_train_begin
        self.prof: torch.profiler.profile | None = None
        gpu = torch.cuda.is_available()
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        # self device time where GPU jobs spend their time, else self CPU time
        self.sort_by = "self_cuda_time_total" if gpu else "self_cpu_time_total"
        self.kept_steps: list[int] = []  # global steps recorded in the current cycle
        self.written: list[list[int]] = []  # the global steps of each cycle written out

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: object) -> None:
        self.rank = args.process_index
        os.makedirs(self.out_dir, exist_ok=True)
        c = self.cfg
        base = torch.profiler.schedule(wait=c.profile_wait, warmup=c.profile_warmup, active=c.profile_active,
                                       repeat=c.profile_repeat)
        # Profiler step numbers follow the Trainer's global step (ProfilerStep#S completes
        # global step S), also after a resume from a checkpoint.
        first = state.global_step + 1
        self.prof = torch.profiler.profile(
            activities=self.activities,
            schedule=lambda step: base(step - first) if step >= first else ProfilerAction.NONE,
            on_trace_ready=self._trace_ready,
            record_shapes=c.profile_record_shapes,
            profile_memory=c.profile_memory,
            with_stack=c.profile_with_stack,
        )
        self.prof.step_num = first
        self.prof.current_action = self.prof.schedule(first)
        self.prof.start()
        if state.is_world_process_zero:
            kept = first + c.profile_wait + c.profile_warmup
            span = (f"global steps {kept}-{kept + c.profile_active - 1}"
                    + (f" and {c.profile_repeat - 1} more cycle(s)" if c.profile_repeat > 1 else "")
                    if c.profile_steps_needed else "every cycle until training ends (repeat=0)")
            logger.info(
                "PROFILER on: wait=%d warmup=%d active=%d repeat=%d activities=%s; will keep %s; writing to %s",
                c.profile_wait, c.profile_warmup, c.profile_active, c.profile_repeat,
                "+".join(a.name for a in self.activities), span, self.out_dir,
            )

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: object) -> None:
        if self.prof is None:
            return
        if self.prof.current_action in RECORDING:
            self.kept_steps.append(state.global_step)
        if state.max_steps and state.global_step >= state.max_steps:
            self._stop()  # the last step: close its span without opening an empty next one
            return
        self.prof.step()
        if self.cfg.profile_repeat and len(self.written) >= self.cfg.profile_repeat:
            self._stop()  # schedule done: no profiler cost for the rest of training

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: object) -> None:
        self._stop()
        if not self.written:
            c = self.cfg
            needed = c.profile_steps_needed or (c.profile_wait + c.profile_warmup + c.profile_active)
            logger.warning(
                "PROFILER wrote nothing: training ended before the first kept step (the schedule needs %d steps "
                "from the start of training: wait=%d + warmup=%d + active=%d); lower --profile_warmup/--profile_wait",
                needed, c.profile_wait, c.profile_warmup, c.profile_active,
            )

    def _stop(self) -> None:
        prof, self.prof = self.prof, None
        if prof is not None:
            prof.stop()  # inside an active window this still calls _trace_ready for what was kept

    def _trace_ready(self, prof: torch.profiler.profile) -> None:
        steps, self.kept_steps = self.kept_steps, []
        self.written.append(steps)
        cycle, c = len(self.written), self.cfg
        trace_path = os.path.join(self.out_dir, f"trace_rank{self.rank}{'' if cycle == 1 else f'_cycle{cycle}'}.json")
        prof.export_chrome_trace(trace_path)
        summary_name = "profiler_summary.txt" if self.rank == 0 else f"profiler_summary_rank{self.rank}.txt"
        summary_path = os.path.join(self.out_dir, summary_name)
        step_text = f"{steps[0]}-{steps[-1]}" if steps else "none"
        header = (
            f"# torch.profiler key_averages, rank {self.rank}, cycle {cycle}: global steps {step_text} "
            f"({len(steps)} steps, ProfilerStep#<step> in the trace)\n"
            f"# activities: {'+'.join(a.name for a in self.activities)}; sorted by {self.sort_by}; "
            f"record_shapes={c.profile_record_shapes} profile_memory={c.profile_memory} "
            f"with_stack={c.profile_with_stack}\n"
            "# Times are summed over the profiled steps and include the profiler's own overhead.\n"
        )
        table = prof.key_averages().table(sort_by=self.sort_by, row_limit=c.profile_row_limit)
        with open(summary_path, "w" if cycle == 1 else "a", encoding="utf-8") as fh:
            fh.write(header + table + "\n")
        if len(steps) < c.profile_active:
            logger.warning("PROFILER: training ended inside a profiling window; the trace holds %d step(s), not "
                           "--profile_active=%d", len(steps), c.profile_active)
        logger.info("PROFILED_STEPS=%s rank=%d trace=%s summary=%s (table totals include profiler overhead)",
                    step_text, self.rank, trace_path, summary_path)
