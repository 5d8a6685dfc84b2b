"""The record of a run (run_summary.json: how it ended, what it was asked, planned and really used, where it ran,
what came out; never the hub token), its results files, and the closing KEY=value lines.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qa_hpc.atomic_io import write_json_atomic, write_text_atomic

if TYPE_CHECKING:  # the Trainer module is heavy to import; the collector and tests need none of it
    from transformers import Trainer, TrainingArguments

    from qa_hpc.device import DeviceFacts
    from qa_hpc.flags import DataTrainingArguments, ModelArguments

SUMMARY_FILE = "run_summary.json"
# Result keys printed as KEY=value at the end of a run, in this order, when present.
FINAL_KEYS = (
    "train_runtime",
    "train_samples_per_second",
    "train_loss",
    "eval_exact_match",
    "eval_f1",
    "eval_exact",
    "eval_HasAns_f1",
    "eval_NoAns_f1",
    "eval_runtime",
    "eval_samples_per_second",
    "eval_postprocess_seconds",
    "eval_samples",
    "eval_examples",
    "predict_exact_match",
    "predict_f1",
    "predict_runtime",
)
# What run_summary.json's params keep of the data flags, then of the TrainingArguments, under their own names.
PARAMS = (
    (
        "train_file",
        "validation_file",
        "test_file",
        "max_seq_length",
        "doc_stride",
        "pad_to_max_length",
        "version_2_with_negative",
        "max_train_samples",
        "max_eval_samples",
    ),
    (
        "max_steps",
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "world_size",
        "ddp_backend",
        "train_sampling_strategy",
        "learning_rate",
        "seed",
    ),
)
# What run_summary.json keeps of the memory report (memory.json holds all of it).
MEMORY_KEYS = ("measured_peak_mb", "measured_source", "max_over_ranks", "estimate_over_measured", "note")


def environment(facts: DeviceFacts) -> dict[str, Any]:
    """Hardware and software of this process's machine, and the Slurm job it ran in."""
    import datasets  # here, not at the top: the collector reads SUMMARY_FILE without loading them
    import transformers

    env = os.environ.get
    return {
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "torch_version": facts.torch_version,
        "transformers_version": transformers.__version__,
        "datasets_version": datasets.__version__,
        "gpu_available": facts.cuda_available,
        "gpu_count": facts.gpu_count,
        "gpu_name": facts.gpu_name,
        "driver_version": facts.driver_version,
        "cuda_version": facts.torch_cuda,
        "cudnn_version": facts.cudnn_version,
        "cpu_count": os.cpu_count(),
        "cpu_model": facts.cpu.model,
        "cpu_vendor": facts.cpu.vendor,
        "cpu_flags": list(facts.cpu.flags),
        "slurm_job_id": env("SLURM_JOB_ID"),
        "slurm_job_name": env("SLURM_JOB_NAME"),
        "slurm_nodelist": env("SLURM_JOB_NODELIST"),
        "slurm_job_num_nodes": env("SLURM_JOB_NUM_NODES"),
        "slurm_restart_count": int(env("SLURM_RESTART_COUNT", "0") or 0),
    }


def run_params(
    model_args: ModelArguments,
    data_args: DataTrainingArguments,
    training_args: TrainingArguments,
    precision: str,
) -> dict[str, Any]:
    """The parameters users compare runs by (never the token): the flags of PARAMS under their own names."""
    ta, da = training_args, data_args
    return {
        "model": model_args.model_name_or_path,
        "dataset": da.train_file or da.validation_file or da.dataset_name,
        "epochs": ta.num_train_epochs,
        "parallel_mode": str(ta.parallel_mode.value),
        "device": str(ta.device),
        "precision": precision,
        **{name: getattr(da, name) for name in PARAMS[0]},
        **{name: getattr(ta, name) for name in PARAMS[1]},
    }


def write_run_summary(
    path: str,
    *,
    facts: DeviceFacts,
    status: str,
    exit_code: int,
    wall_clock_seconds: float,
    params: Mapping[str, Any],
    plan: Mapping[str, Any],
    effective: Mapping[str, Any] | None,
    results: Mapping[str, Any],
    memory: Mapping[str, Any] | None = None,
    error: str | None = None,
    stopped: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write run_summary.json atomically and return what was written."""
    summary = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "status": status,
        "exit_code": exit_code,
        "error": error,  # status: ok | failed | preempted
        "wall_clock_seconds": round(wall_clock_seconds, 3),
        **environment(facts),
        "params": dict(params),
        "plan": dict(plan),
        "effective": dict(effective) if effective else None,
        "results": dict(results),
        "memory": {k: memory[k] for k in MEMORY_KEYS if k in memory} if memory else None,
        "stopped": dict(stopped) if stopped else None,  # preempted: signal, global_step, checkpoint
    }
    write_json_atomic(path, summary)
    return summary


def save_results(trainer: Trainer, split: str, metrics: Mapping[str, Any]) -> None:
    """{split}_results.json and all_results.json (as HF's save_metrics), atomically, on the main process."""
    trainer.log_metrics(split, metrics)
    if not trainer.is_world_process_zero():
        return
    out = trainer.args.output_dir
    write_json_atomic(os.path.join(out, f"{split}_results.json"), dict(metrics), sort_keys=True)
    all_path = os.path.join(out, "all_results.json")  # each split adds its metrics to the earlier splits'
    combined = json.loads(Path(all_path).read_text(encoding="utf-8")) if os.path.exists(all_path) else {}
    write_json_atomic(all_path, {**combined, **metrics}, sort_keys=True)


def save_trainer_state(trainer: Trainer) -> None:
    """trainer_state.json as Trainer.save_state writes it (same text), but atomically."""
    if trainer.is_world_process_zero():
        state = json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n"
        write_text_atomic(os.path.join(trainer.args.output_dir, "trainer_state.json"), state)


def final_lines(results: Mapping[str, Any], wall_clock_seconds: float) -> list[str]:
    """The greppable closing lines: metrics first (floats to 4 decimals), WALL_CLOCK_SECONDS last."""
    lines = [
        f"{key}={results[key]:.4f}" if isinstance(results[key], float) else f"{key}={results[key]}"
        for key in FINAL_KEYS
        if key in results
    ]
    return lines + [f"WALL_CLOCK_SECONDS={int(round(wall_clock_seconds))}"]
