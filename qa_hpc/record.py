"""The record of a run (run_summary.json: how it ended, where it ran, what it was asked, planned and really
used, what came out; never the hub token), its results files, and the closing KEY=value lines.

run_qa.py builds one RunRecord when the run ends (ok, failed or preempted) and writes it; the tools read it
back with RunRecord.read. A field added to a part below reaches run_summary.json by itself; showing it is one
line where it is shown: RunRecord.closing_lines, qa_hpc.tools.collect_results or qa_hpc.tools.report.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from enum import StrEnum
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from qa_hpc.atomic_io import read_json_object, write_json_atomic, write_text_atomic
from qa_hpc.outputs import ALL_RESULTS_FILE, SUMMARY_FILE, TRAINER_STATE_FILE

if TYPE_CHECKING:  # torch and the Trainer are heavy to import; the tools that read records need none of them
    from transformers import Trainer

    from qa_hpc.device import DeviceFacts
    from qa_hpc.effective import Effective
    from qa_hpc.flags import Flags
    from qa_hpc.plan import RunPlan


class Status(StrEnum):
    """How a run ended, as its record says (`status`), and, for a folder without a record, the tables'."""

    OK = "ok"
    FAILED = "failed"
    PREEMPTED = "preempted"
    INCOMPLETE = "incomplete"  # no record: a launch still running, or killed before it wrote one


# The results a run ends with as KEY=value lines, in this order, when present (TensorBoard's totals take
# them too).
CLOSING_METRICS = (
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
    "predict_exact",
    "predict_f1",
    "predict_runtime",
)
Part = TypeVar("Part")


class Recorded(SimpleNamespace):
    """A part whose fields the record does not spell out: the results (the Trainer's metrics, named as in the
    results files) and, read back, the plan and the effective settings (their classes import torch, which the
    tools do not load). Fields as attributes; one the run did not record reads as None."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # the probes of Python and pandas (__array__, ...) must still find nothing
            raise AttributeError(name)
        return None


def _mapping(data: Any) -> dict[str, Any]:
    """A JSON object as read, or {} for anything else (null, a part an older record lacks)."""
    return data if isinstance(data, dict) else {}


def _read_part(cls: type[Part], data: Any) -> Part:
    """A part read back: each field from the key of its name, None where the file has none (a record of an
    older version); keys the file has beyond the fields are left out."""
    given = _mapping(data)
    return cls(**{f.name: given.get(f.name) for f in fields(cls)})


def _as_json(part: Any) -> dict[str, Any]:
    """A part as run_summary.json holds it, whether built by the run (a dataclass) or read back (Recorded)."""
    return asdict(part) if is_dataclass(part) else dict(vars(part))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Environment:
    """Hardware and software of the main process's machine, and the Slurm job it ran in."""

    hostname: str | None = None
    python: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    datasets_version: str | None = None
    gpu_available: bool | None = None
    gpu_count: int | None = None
    gpu_name: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    cudnn_version: int | None = None
    cpu_count: int | None = None
    cpu_model: str | None = None
    cpu_vendor: str | None = None
    cpu_flags: list[str] | None = None
    cpu_source: str | None = None  # /proc/cpuinfo, or QA_TEST_MACHINE: a test's made-up CPU says so
    slurm_job_id: str | None = None
    slurm_job_name: str | None = None
    slurm_nodelist: str | None = None
    slurm_job_num_nodes: str | None = None
    slurm_restart_count: int | None = None

    @classmethod
    def of(cls, facts: DeviceFacts) -> Environment:
        import datasets  # here, not at the top: the tools read records without loading them
        import transformers

        env = os.environ.get
        return cls(
            hostname=platform.node(),
            python=sys.version.split()[0],
            torch_version=facts.torch_version,
            transformers_version=transformers.__version__,
            datasets_version=datasets.__version__,
            gpu_available=facts.cuda_available,
            gpu_count=facts.gpu_count,
            gpu_name=facts.gpu_name,
            driver_version=facts.driver_version,
            cuda_version=facts.torch_cuda,
            cudnn_version=facts.cudnn_version,
            cpu_count=os.cpu_count(),
            cpu_model=facts.cpu.model,
            cpu_vendor=facts.cpu.vendor,
            cpu_flags=list(facts.cpu.flags),
            cpu_source=facts.cpu.source,
            slurm_job_id=env("SLURM_JOB_ID"),
            slurm_job_name=env("SLURM_JOB_NAME"),
            slurm_nodelist=env("SLURM_JOB_NODELIST"),
            slurm_job_num_nodes=env("SLURM_JOB_NUM_NODES"),
            slurm_restart_count=int(env("SLURM_RESTART_COUNT", "0") or 0),
        )


# the Params only training reads
TRAINING_ONLY = (
    "epochs",
    "train_file",
    "max_train_samples",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "train_sampling_strategy",
    "learning_rate",
)


@dataclass(frozen=True)
class Params:
    """The parameters users compare runs by (never the token). Below `precision`, each field is the flag of
    its name."""

    model: str | None = None  # --model_name_or_path
    # the train file, else the validation file, else --dataset_name; a run that does not train: the file it
    # evaluated on, else the one it predicted on, else --dataset_name
    dataset: str | None = None
    epochs: float | None = None
    parallel_mode: str | None = None
    device: str | None = None
    precision: str | None = None  # the plan's
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    max_seq_length: int | None = None
    doc_stride: int | None = None
    pad_to_max_length: bool | None = None
    version_2_with_negative: bool | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_steps: int | None = None
    per_device_train_batch_size: int | None = None
    per_device_eval_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    world_size: int | None = None
    ddp_backend: str | None = None
    train_sampling_strategy: str | None = None
    learning_rate: float | None = None
    seed: int | None = None
    output_dir: str | None = None

    @classmethod
    def of(cls, flags: Flags, precision: str) -> Params:
        data, training = flags.data, flags.training
        # the file the run read first; a run that does not train never read a --train_file given beside (a
        # job script's flags)
        if training.do_train:
            read = data.train_file or data.validation_file
        else:
            read = (training.do_eval and data.validation_file) or (training.do_predict and data.test_file)
        derived = {
            "model": flags.model.model_name_or_path,
            "dataset": read or data.dataset_name,
            "epochs": training.num_train_epochs,
            "parallel_mode": str(training.parallel_mode.value),
            "device": str(training.device),
            "precision": precision,
        }
        # the data flags are looked up first: the TrainingArguments do not have them
        same_name = {
            f.name: getattr(data, f.name) if hasattr(data, f.name) else getattr(training, f.name)
            for f in fields(cls)
            if f.name not in derived
        }
        params = cls(**derived, **same_name)
        if training.do_train:
            return params
        # a run that does not train: its training flags' defaults would read as what it trained with
        return dataclasses.replace(params, **dict.fromkeys(TRAINING_ONLY))

    @property
    def trains_by_steps(self) -> bool:
        """Whether --max_steps sets the training's length: the Trainer leaves --num_train_epochs unused."""
        return (self.max_steps or 0) > 0

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step over every process; None for a run that does not train."""
        parts = (self.per_device_train_batch_size, self.world_size, self.gradient_accumulation_steps)
        return None if None in parts else math.prod(parts)


@dataclass(frozen=True)
class Peaks:
    """The largest figure of any rank (memory.json has each rank's)."""

    cuda_peak_allocated_mb: float | None = None
    cuda_peak_reserved_mb: float | None = None
    cpu_peak_rss_mb: float | None = None


@dataclass(frozen=True)
class Memory:
    """What run_summary.json keeps of the memory report (memory.json holds all of it)."""

    measured_peak_mb: float | None = None  # the run's peak: CUDA allocated on a GPU, else RSS
    measured_source: str | None = None
    max_over_ranks: Peaks = Peaks()
    estimate_over_measured: float | None = None
    note: str | None = None  # rank 0's: why it has no NVML figure
    nvml_used_mb: float | None = None  # rank 0's GPU memory in use, every process's, as NVML sees it
    estimate_mb: float | None = None  # the estimate of training memory per process
    estimate_bytes_per_param: int | None = None
    nodes: int | None = None  # the hosts the ranks ran on

    @classmethod
    def of(cls, report: Mapping[str, Any]) -> Memory:
        """From memory.json's object (qa_hpc.observe.memory.memory_report)."""
        estimate = report["estimate"]
        return cls(
            measured_peak_mb=report.get("measured_peak_mb"),
            measured_source=report.get("measured_source"),
            max_over_ranks=Peaks(**report["max_over_ranks"]),
            estimate_over_measured=report.get("estimate_over_measured"),
            note=report["note"],
            nvml_used_mb=report["nvml"]["used_mb"] if report["nvml"] else None,
            estimate_mb=estimate["total_mb"] if estimate else None,
            estimate_bytes_per_param=estimate["bytes_per_param"]["total"] if estimate else None,
            nodes=len({rank["host"] for rank in report["ranks"]}),
        )

    @classmethod
    def read(cls, data: Any) -> Memory | None:
        """Read back; None where the record has none (--memory_report false, or a run that did not end ok)."""
        if not isinstance(data, dict):
            return None
        memory = _read_part(cls, data)
        return dataclasses.replace(memory, max_over_ranks=_read_part(Peaks, memory.max_over_ranks))


@dataclass(frozen=True)
class Stopped:
    """Where a preempted run stopped: its signal, its optimizer step and the checkpoint it resumes from."""

    signal: str | None = None
    global_step: int | None = None
    checkpoint: str | None = None


@dataclass
class RunRecord:
    """One run, as run_summary.json holds it."""

    status: str  # a Status but INCOMPLETE (records of other versions may say other words)
    exit_code: int
    wall_clock_seconds: float  # from the process's start
    environment: Environment  # at the top level of run_summary.json, as records always had it
    params: Params
    plan: RunPlan
    effective: Effective
    results: Recorded  # the Trainer's metrics and qa_hpc.observe.efficiency's figures
    memory: Memory | None = None  # None: --memory_report false, or the run did not end ok
    stopped: Stopped | None = None  # preempted runs only
    error: str | None = None  # failed runs only: the exception
    timestamp: str = field(default_factory=_now)

    @property
    def ended_training(self) -> bool:
        """Whether this launch ended a training ok: it trained to the last step, or went on from a checkpoint
        of that step (TRAINED_BEFORE: no steps, no training figures). An evaluation-only run records no
        training parameters."""
        return self.status == Status.OK and self.params.learning_rate is not None

    @property
    def trained_to_the_end(self) -> bool:
        """Whether this launch trained steps and ended ok: --output_dir's trainer_state.json is its own."""
        return self.status == Status.OK and self.results.train_runtime is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "wall_clock_seconds": round(self.wall_clock_seconds, 3),
            **asdict(self.environment),
            "params": asdict(self.params),
            "plan": _as_json(self.plan),
            "effective": _as_json(self.effective),
            "results": _as_json(self.results),
            "memory": asdict(self.memory) if self.memory else None,
            "stopped": asdict(self.stopped) if self.stopped else None,
        }

    def write(self, output_dir: str) -> None:
        """run_summary.json in output_dir, atomically."""
        write_json_atomic(os.path.join(output_dir, SUMMARY_FILE), self.to_json())

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """A record of any version: what it lacks reads as None (results it lacks: none)."""
        stopped = data.get("stopped")
        return cls(
            status=data.get("status"),
            exit_code=data.get("exit_code"),
            wall_clock_seconds=data.get("wall_clock_seconds"),
            environment=_read_part(Environment, data),
            params=_read_part(Params, data.get("params")),
            plan=Recorded(**_mapping(data.get("plan"))),
            effective=Recorded(**_mapping(data.get("effective"))),
            results=Recorded(**_mapping(data.get("results"))),
            memory=Memory.read(data.get("memory")),
            stopped=_read_part(Stopped, stopped) if isinstance(stopped, dict) else None,
            error=data.get("error"),
            timestamp=data.get("timestamp"),
        )

    @classmethod
    def read(cls, path: str | Path) -> RunRecord:
        """The record in `path`; raises as read_json_object."""
        return cls.from_json(read_json_object(path))

    @classmethod
    def load(cls, path: str | Path) -> RunRecord | None:
        """The record in `path`; None where `read` raises."""
        try:
            return cls.read(path)
        except (OSError, ValueError):
            return None

    def closing_lines(self) -> list[str]:
        """The greppable KEY=value lines a run ends with: the memory report's, where the run ran, the training
        efficiency, the metrics of CLOSING_METRICS (floats to 4 decimals), WALL_CLOCK_SECONDS last."""
        lines = []
        memory = self.memory
        if memory is not None:
            peaks = memory.max_over_ranks
            if peaks.cuda_peak_allocated_mb is not None:
                lines.append(f"MEMORY_CUDA_PEAK_ALLOCATED_MB={peaks.cuda_peak_allocated_mb:.1f}")
                lines.append(f"MEMORY_CUDA_PEAK_RESERVED_MB={peaks.cuda_peak_reserved_mb:.1f}")
                if memory.nvml_used_mb is not None:
                    lines.append(f"MEMORY_NVML_USED_MB={memory.nvml_used_mb:.1f}")
            else:  # rank 0's note then says why: no CUDA device
                lines.append(f"MEMORY_CUDA=none ({memory.note})")
            lines.append(f"MEMORY_CPU_PEAK_RSS_MB={peaks.cpu_peak_rss_mb:.1f}")
            if memory.estimate_mb is not None:  # training runs
                lines.append(f"MEMORY_ESTIMATE_MB={memory.estimate_mb:.1f}")
                lines.append(f"MEMORY_ESTIMATE_BYTES_PER_PARAM={memory.estimate_bytes_per_param}")
            lines.append(f"RUN_NODES={memory.nodes}")
        lines.append(f"RUN_WORLD_SIZE={self.plan.world_size}")
        lines.append(f"RUN_DEVICE={self.plan.gpu_name or 'cpu'}")
        lines.append(f"RUN_PRECISION={self.plan.precision}")
        lines.append(f"OUTPUT_DIR={os.path.abspath(self.params.output_dir)}")
        results = self.results
        if results.train_tokens_per_second is not None:  # the run trained
            lines.append(f"TRAIN_TOKENS_PER_SECOND={results.train_tokens_per_second:.1f}")
            lines.append(f"TRAIN_SAMPLES_PER_SECOND={results.train_samples_per_second:.3f}")
            lines.append(f"TRAIN_MODEL_TFLOP={results.train_model_tflop:.3f}")
            lines.append(f"ACHIEVED_TFLOPS={results.train_achieved_tflops:.4f}")
            if results.train_mfu is not None:
                lines.append(f"PEAK_TFLOPS={results.train_peak_tflops:.1f}")
                lines.append(f"MFU={results.train_mfu:.4f}")
            else:
                device = results.device_name
                lines.append(f"MFU=n/a (device={device}: no peak table entry; achieved FLOP/s above)")
        for name in CLOSING_METRICS:
            value = getattr(results, name)
            if isinstance(value, float):
                lines.append(f"{name}={value:.4f}")
            elif value is not None:
                lines.append(f"{name}={value}")
        lines.append(f"WALL_CLOCK_SECONDS={int(round(self.wall_clock_seconds))}")
        return lines


def save_results(trainer: Trainer, split: str, metrics: Mapping[str, Any]) -> None:
    """{split}_results.json and all_results.json (as HF's save_metrics), atomically, on the main process."""
    trainer.log_metrics(split, metrics)
    if not trainer.is_world_process_zero():
        return
    out = trainer.args.output_dir
    split_path = os.path.join(out, f"{split}_results.json")
    all_path = os.path.join(out, ALL_RESULTS_FILE)  # each split adds its metrics to the earlier splits'
    combined = _json_or_empty(all_path)
    earlier = _json_or_empty(split_path)
    # this split's figures replace its earlier ones whole, those its last results file listed (epoch among
    # them) and any of its prefix: a v1 evaluation after a v2 one into the same folder would otherwise keep
    # eval_exact, eval_HasAns_f1, ... of other questions beside its own
    kept = {k: v for k, v in combined.items() if k not in earlier and not k.startswith(f"{split}_")}
    write_json_atomic(split_path, dict(metrics), sort_keys=True)
    write_json_atomic(all_path, {**kept, **metrics}, sort_keys=True)


def _json_or_empty(path: str) -> dict[str, Any]:
    """The JSON object in `path`; {} where there is none (or none readable: it is written again whole)."""
    try:
        return read_json_object(path)
    except (OSError, ValueError):
        return {}


def save_trainer_state(trainer: Trainer) -> None:
    """trainer_state.json as Trainer.save_state writes it (same text), but atomically."""
    if trainer.is_world_process_zero():
        state = json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n"
        write_text_atomic(os.path.join(trainer.args.output_dir, TRAINER_STATE_FILE), state)
