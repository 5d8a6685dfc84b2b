"""Observability flags and wiring: profiler, TensorBoard and the memory report of a run.

run_qa.py parses `ObservabilityArguments` with the other flags, builds one
`Observability` before the trainer (its `callbacks` go into the Trainer) and calls
`finish()` on every rank at the end; rank 0 gets back the KEY=value lines to print
before the closing WALL_CLOCK_SECONDS line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from qa_hpc.observe.memory import anatomy_estimate, build_report, gather_to_main, measure_process, report_lines, write_report
from qa_hpc.observe.profiler import ProfilerCallback, ProfilerConfig
from qa_hpc.observe.tensorboard import TensorBoardCallback, default_tensorboard_dir
from qa_hpc.summary import precision_of


@dataclass
class ObservabilityArguments:
    """(qa-hpc) Profiler, TensorBoard and memory report flags."""

    profile: bool = field(
        default=False,
        metadata={"help": "(qa-hpc) Profile training steps with torch.profiler (see --profile_wait etc.); off: no cost."},
    )
    profile_wait: int = field(default=2, metadata={"help": "(qa-hpc) Profiler schedule: steps skipped first."})
    profile_warmup: int = field(
        default=100, metadata={"help": "(qa-hpc) Profiler schedule: steps traced and thrown away (warm-up)."}
    )
    profile_active: int = field(default=8, metadata={"help": "(qa-hpc) Profiler schedule: steps kept per cycle."})
    profile_repeat: int = field(
        default=1, metadata={"help": "(qa-hpc) Profiler schedule: cycles (0: until training ends)."}
    )
    profile_record_shapes: bool = field(default=False, metadata={"help": "(qa-hpc) Record operator input shapes."})
    profile_memory: bool = field(default=False, metadata={"help": "(qa-hpc) Record tensor memory per operator."})
    profile_with_stack: bool = field(
        default=False, metadata={"help": "(qa-hpc) Record Python stacks (large traces)."}
    )
    profile_row_limit: int = field(default=40, metadata={"help": "(qa-hpc) Rows in profiler_summary.txt."})
    profile_dir: str | None = field(
        default=None, metadata={"help": "(qa-hpc) Where traces and the op table go (default <output_dir>/profiler)."}
    )
    logging_dir: str | None = field(
        default=None,
        metadata={
            "help": "TensorBoard event dir, the transformers 4 flag (default <output_dir>/runs/<time>_<host>). "
            "TensorBoard is on while --report_to includes 'tensorboard' (qa-hpc default)."
        },
    )
    memory_report: bool = field(
        default=True,
        metadata={"help": "(qa-hpc) Write memory.json and MEMORY_* lines at the end (measured peaks + estimate)."},
    )

    def __post_init__(self) -> None:
        self.profiler_config()  # validates the schedule at parse time

    def profiler_config(self) -> ProfilerConfig:
        return ProfilerConfig(
            wait=self.profile_wait,
            warmup=self.profile_warmup,
            active=self.profile_active,
            repeat=self.profile_repeat,
            record_shapes=self.profile_record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.profile_with_stack,
            row_limit=self.profile_row_limit,
        )


class Observability:
    """The callbacks of one run and what it reports at the end."""

    def __init__(self, obs_args: ObservabilityArguments, training_args: Any, model: torch.nn.Module,
                 max_seq_length: int) -> None:
        self.args = obs_args
        self.training_args = training_args
        self.model = model
        self.max_seq_length = max_seq_length
        self.is_main = training_args.process_index == 0
        self.callbacks: list[Any] = []
        self.tensorboard: TensorBoardCallback | None = None
        if obs_args.profile:
            out = obs_args.profile_dir or os.path.join(training_args.output_dir, "profiler")
            self.callbacks.append(ProfilerCallback(obs_args.profiler_config(), out))
        report_to = list(training_args.report_to or [])
        if "tensorboard" in report_to:
            # our writer replaces HF's TensorBoardCallback: one event file, every scalar, rank 0 only
            training_args.report_to = [r for r in report_to if r != "tensorboard"]
            log_dir = obs_args.logging_dir or default_tensorboard_dir(training_args.output_dir)
            self.tensorboard = TensorBoardCallback(log_dir, self.is_main)
            self.callbacks.append(self.tensorboard)

    def finish(self, results: Mapping[str, Any], wall_clock_seconds: float) -> list[str]:
        """Memory report and TensorBoard totals. Call on every rank (gathers); returns rank 0's KEY=value lines."""
        lines: list[str] = []
        report = None
        if self.args.memory_report:
            local = measure_process(self.training_args.process_index, self.training_args.device)
            ranks = gather_to_main(local)
            if self.is_main:
                report = build_report(ranks, self._estimate())
                path = os.path.join(self.training_args.output_dir, "memory.json")
                write_report(path, report)
                lines += report_lines(report)
                nodes = len({r["host"] for r in ranks})
                lines.append(f"RUN_NODES={nodes}")
        if not self.is_main:
            if self.tensorboard is not None:
                self.tensorboard.close()
            return []
        lines += [
            f"RUN_WORLD_SIZE={self.training_args.world_size}",
            f"RUN_DEVICE={_device_name()}",
            f"RUN_PRECISION={precision_of(self.training_args)}",
            f"OUTPUT_DIR={os.path.abspath(self.training_args.output_dir)}",
        ]
        if self.tensorboard is not None:
            self._tensorboard_totals(results, wall_clock_seconds, report)
            self.tensorboard.close()
        return lines

    def _estimate(self) -> dict[str, Any] | None:
        if not self.training_args.do_train:
            return None  # the anatomy estimate is about training memory
        ta = self.training_args
        return anatomy_estimate(
            self.model, precision_of(ta), ta.optim, ta.per_device_train_batch_size, self.max_seq_length,
            gradient_checkpointing=bool(ta.gradient_checkpointing),
        )

    def _tensorboard_totals(self, results: Mapping[str, Any], wall: float, report: Mapping[str, Any] | None) -> None:
        ta = self.training_args
        final_loss = self.tensorboard.last_loss if self.tensorboard.last_loss is not None else results.get("train_loss")
        hparams = {
            "model": getattr(getattr(self.model, "config", None), "_name_or_path", "") or "",
            "per_device_train_batch_size": ta.per_device_train_batch_size,
            "total_train_batch_size": ta.per_device_train_batch_size * ta.world_size * ta.gradient_accumulation_steps,
            "epochs": float(ta.num_train_epochs),
            "world_size": ta.world_size,
            "precision": precision_of(ta),
            "learning_rate": ta.learning_rate,
            "max_seq_length": self.max_seq_length,
            "device": _device_name(),
        }
        metrics: dict[str, Any] = {"wall_clock_seconds": wall}
        if final_loss is not None:
            metrics["final_loss"] = final_loss
        for key in ("train_loss", "train_runtime", "train_samples_per_second", "eval_exact_match", "eval_f1",
                    "eval_exact", "eval_samples_per_second"):
            if key in results:
                metrics[key] = results[key]
        if report is not None and report.get("measured_peak_mb") is not None:
            metrics["peak_memory_mb"] = report["measured_peak_mb"]
        rows = [f"| {k} | {v} |" for k, v in {**hparams, **metrics}.items()]
        summary = "| run total | value |\n|---|---|\n" + "\n".join(rows)
        self.tensorboard.finish(hparams, metrics, summary, self.tensorboard.last_step)


def _device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


__all__ = ["Observability", "ObservabilityArguments"]
