"""The observability of one run: profiler, TensorBoard and the memory report, as the plan says.

run_qa.py builds one `Observability` before the trainer (its `callbacks` go into the
Trainer) and calls `finish()` on every rank at the end; rank 0 gets back the KEY=value
lines to print before the closing WALL_CLOCK_SECONDS line, and the memory report for
run_summary.json. With profiling or TensorBoard off, their callbacks are never made.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from accelerate import PartialState

from qa_hpc.dist import gather_to_main
from qa_hpc.flags import ObservabilityArguments
from qa_hpc.model import ModelShape
from qa_hpc.observe.memory import anatomy_estimate, build_report, measure_process, report_lines, write_report
from qa_hpc.observe.profiler import ProfilerCallback
from qa_hpc.observe.tensorboard import TensorBoardCallback, default_tensorboard_dir
from qa_hpc.plan import RunPlan

TOTAL_KEYS = ("train_loss", "train_runtime", "train_samples_per_second", "eval_exact_match", "eval_f1", "eval_exact",
              "eval_samples_per_second")


class Observability:
    """The callbacks of one run and what it reports at the end."""

    def __init__(self, flags: ObservabilityArguments, plan: RunPlan, training_args: Any, shape: ModelShape,
                 max_seq_length: int) -> None:
        self.flags, self.plan, self.args, self.shape = flags, plan, training_args, shape
        self.max_seq_length = max_seq_length
        self.is_main = PartialState().is_main_process
        self.callbacks: list[Any] = []
        self.tensorboard: TensorBoardCallback | None = None
        if plan.profile_dir is not None:
            self.callbacks.append(ProfilerCallback(flags, plan.profile_dir))
        if plan.tensorboard:  # our writer replaces HF's TensorBoardCallback: one event file, every scalar, rank 0
            log_dir = plan.logging_dir or default_tensorboard_dir(training_args.output_dir)
            self.tensorboard = TensorBoardCallback(log_dir, self.is_main)
            self.callbacks.append(self.tensorboard)

    def finish(self, results: Mapping[str, Any], wall_clock_seconds: float) -> tuple[list[str], dict[str, Any] | None]:
        """Memory report and TensorBoard totals. Call on every rank (gathers); rank 0 gets (KEY=value lines, report)."""
        lines: list[str] = []
        report = None
        if self.flags.memory_report:
            ranks = gather_to_main(measure_process(self.args.process_index, self.args.device))
            if self.is_main:
                report = build_report(ranks, self._estimate())
                write_report(os.path.join(self.args.output_dir, "memory.json"), report)
                lines += report_lines(report) + [f"RUN_NODES={len({r['host'] for r in ranks})}"]
        if not self.is_main:
            if self.tensorboard is not None:
                self.tensorboard.close()
            return [], None
        lines += [
            f"RUN_WORLD_SIZE={self.plan.world_size}",
            f"RUN_DEVICE={self.plan.gpu_name or 'cpu'}",
            f"RUN_PRECISION={self.plan.precision}",
            f"OUTPUT_DIR={os.path.abspath(self.args.output_dir)}",
        ]
        if self.tensorboard is not None:
            self._tensorboard_totals(results, wall_clock_seconds, report)
            self.tensorboard.close()
        return lines, report

    def _estimate(self) -> dict[str, Any] | None:
        if not self.args.do_train:
            return None  # the anatomy estimate is about training memory
        return anatomy_estimate(self.shape, self.plan.precision, self.args.optim, self.args.per_device_train_batch_size,
                                self.max_seq_length, gradient_checkpointing=bool(self.args.gradient_checkpointing))

    def _tensorboard_totals(self, results: Mapping[str, Any], wall: float, report: Mapping[str, Any] | None) -> None:
        ta, plan = self.args, self.plan
        hparams = {
            "model": self.shape.name,
            "per_device_train_batch_size": ta.per_device_train_batch_size,
            "total_train_batch_size": ta.per_device_train_batch_size * plan.world_size * ta.gradient_accumulation_steps,
            "epochs": float(ta.num_train_epochs),
            "world_size": plan.world_size,
            "precision": plan.precision,
            "learning_rate": ta.learning_rate,
            "max_seq_length": self.max_seq_length,
            "device": plan.gpu_name or "cpu",
        }
        metrics: dict[str, Any] = {"wall_clock_seconds": wall}
        final_loss = self.tensorboard.last_loss if self.tensorboard.last_loss is not None else results.get("train_loss")
        if final_loss is not None:
            metrics["final_loss"] = final_loss
        metrics.update({key: results[key] for key in TOTAL_KEYS if key in results})
        if report is not None and report.get("measured_peak_mb") is not None:
            metrics["peak_memory_mb"] = report["measured_peak_mb"]
        rows = [f"| {k} | {v} |" for k, v in {**hparams, **metrics}.items()]
        summary = "| run total | value |\n|---|---|\n" + "\n".join(rows)
        self.tensorboard.finish(hparams, metrics, summary, self.tensorboard.last_step)
