"""The observability a run asks for: its callbacks (observability_callbacks), and at its end the memory
report and TensorBoard totals (finish_observability).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from accelerate.utils import gather_object
from transformers import Trainer, TrainerCallback
from transformers.integrations.integration_utils import default_logdir

from qa_hpc.flags import Flags
from qa_hpc.model import ModelShape
from qa_hpc.observe.memory import anatomy_estimate, measure_process, memory_report
from qa_hpc.observe.profiler import ProfilerCallback
from qa_hpc.observe.tensorboard import TensorBoard
from qa_hpc.plan import RunPlan
from qa_hpc.record import CLOSING_METRICS, Params

# The run's parameters in TensorBoard's HPARAMS tab, as its record has them (Params): a run that does not
# train has no training parameters there either.
HPARAMS = (
    "model",
    "per_device_train_batch_size",
    "epochs",
    "world_size",
    "precision",
    "learning_rate",
    "max_seq_length",
)


def observability_callbacks(flags: Flags, plan: RunPlan) -> list[TrainerCallback]:
    """The profiler and TensorBoard callbacks the plan asks for (the plan keeps "tensorboard" out of
    report_to, so transformers does not add its own TensorBoardCallback beside ours)."""
    made: list[TrainerCallback] = []
    if plan.profile_dir is not None:
        made.append(ProfilerCallback(flags.observe, plan.profile_dir, on_gpu=plan.device == "cuda"))
    if plan.tensorboard:  # <output_dir>/runs/<time>_<host>, as transformers names it: one folder per launch
        made.append(
            TensorBoard(
                plan.logging_dir or os.path.join(flags.training.output_dir, default_logdir()),
                on_gpu=plan.device == "cuda",
            )
        )
    return made


def finish_observability(
    trainer: Trainer,
    flags: Flags,
    plan: RunPlan,
    params: Params,
    shape: ModelShape,
    results: Mapping[str, Any],
    wall_clock_seconds: float,
) -> dict[str, Any] | None:
    """Memory report and TensorBoard totals. Call on every rank (the memory report gathers every rank's
    figures); rank 0 gets the memory report (memory.json's object), None with --memory_report false."""
    args = trainer.args
    ranks = (
        gather_object([measure_process(args.process_index, args.device)])
        if flags.observe.memory_report
        else []
    )
    if not trainer.is_world_process_zero():
        return None
    estimate = (
        anatomy_estimate(  # the anatomy estimate is about training memory
            shape,
            plan.precision,
            args.optim,
            args.per_device_train_batch_size,
            flags.data.max_seq_length,
            gradient_checkpointing=bool(args.gradient_checkpointing),
        )
        if args.do_train
        else None
    )
    report = memory_report(ranks, estimate, args.output_dir) if ranks else None
    tensorboard = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, TensorBoard)), None)
    if tensorboard is not None:
        hparams = {
            **{name: getattr(params, name) for name in HPARAMS},
            # the steps that decided the training's length where --max_steps did, not --num_train_epochs
            "max_steps": params.max_steps if params.trains_by_steps else None,
            "total_train_batch_size": params.global_batch,
            "device": plan.gpu_name or "cpu",
        }
        losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
        totals = {
            "wall_clock_seconds": wall_clock_seconds,
            "final_loss": losses[-1] if losses else None,
            **{key: results[key] for key in CLOSING_METRICS if key in results},
            "peak_memory_mb": report.get("measured_peak_mb") if report else None,
        }
        tensorboard.write_totals(
            {k: v for k, v in hparams.items() if v is not None},
            {k: v for k, v in totals.items() if v is not None},
            trainer.state.global_step,
        )
    return report
