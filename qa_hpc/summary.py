"""run_summary.json and the closing KEY=value lines: what ran, where, and what came out.

Users compare runs across machines and launchers, so the summary records the
hardware and software beside the parameters and results. Secrets (the hub token)
never enter it.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

import torch
import transformers

from qa_hpc.reliability.atomic_io import write_json_atomic

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


def environment() -> dict[str, Any]:
    """Hardware and software of this process's machine."""
    gpu = torch.cuda.is_available()
    return {
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "gpu_available": gpu,
        "gpu_count": torch.cuda.device_count() if gpu else 0,
        "gpu_name": torch.cuda.get_device_name(0) if gpu else None,
        "cuda_version": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_job_name": os.environ.get("SLURM_JOB_NAME"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
    }


def precision_of(training_args: Any) -> str:
    """The numeric precision a run trains in, as users name it."""
    if getattr(training_args, "bf16", False):
        return "bf16"
    if getattr(training_args, "fp16", False):
        return "fp16"
    return "fp32"


def run_params(model_args: Any, data_args: Any, training_args: Any) -> dict[str, Any]:
    """The parameters users compare runs by (never the token)."""
    return {
        "model": model_args.model_name_or_path,
        "dataset": data_args.train_file or data_args.validation_file or data_args.dataset_name,
        "train_file": data_args.train_file,
        "validation_file": data_args.validation_file,
        "test_file": data_args.test_file,
        "epochs": training_args.num_train_epochs,
        "max_steps": training_args.max_steps,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "per_device_eval_batch_size": training_args.per_device_eval_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "world_size": training_args.world_size,
        "parallel_mode": str(training_args.parallel_mode.value),
        "ddp_backend": training_args.ddp_backend,
        "device": str(training_args.device),
        "max_seq_length": data_args.max_seq_length,
        "doc_stride": data_args.doc_stride,
        "pad_to_max_length": data_args.pad_to_max_length,
        "train_sampling_strategy": training_args.train_sampling_strategy,
        "learning_rate": training_args.learning_rate,
        "precision": precision_of(training_args),
        "seed": training_args.seed,
        "version_2_with_negative": data_args.version_2_with_negative,
        "max_train_samples": data_args.max_train_samples,
        "max_eval_samples": data_args.max_eval_samples,
    }


def write_run_summary(
    path: str, params: Mapping[str, Any], results: Mapping[str, Any], wall_clock_seconds: float, status: str
) -> dict[str, Any]:
    """Write run_summary.json atomically and return what was written."""
    summary = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "status": status,
        "wall_clock_seconds": round(wall_clock_seconds, 3),
        **environment(),
        "params": dict(params),
        "results": dict(results),
    }
    write_json_atomic(path, summary)
    return summary


def final_lines(results: Mapping[str, Any], wall_clock_seconds: float) -> list[str]:
    """The greppable closing lines: metrics first, WALL_CLOCK_SECONDS last."""
    lines = [f"{key}={_fmt(results[key])}" for key in FINAL_KEYS if key in results]
    lines.append(f"WALL_CLOCK_SECONDS={int(round(wall_clock_seconds))}")
    return lines


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
