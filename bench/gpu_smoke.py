"""The GPU smoke's Python side (bench/gpu_smoke.sh runs it; it runs on a CPU too, for its tests).

    python bench/gpu_smoke.py train RUN_QA_ARGS...        run_qa.py, plus a timer of every optimizer step
    torchrun --nproc_per_node=4 bench/gpu_smoke.py train ...
    python bench/gpu_smoke.py record OUTPUT_DIR --label job_ft3 --warmup 20 --min_f1 50 \
        --results_dir bench/results

A whole run's figures (train_runtime) hold worker start-up, CUDA/cuBLAS initialisation and the first
batches; `record` takes the steady state instead: the median of the step times after `--warmup` steps, and
from it samples/s, real tokens/s and MFU at the precision that ran (per-sample real tokens and FLOPs from
run_qa.py's own efficiency figures), the 2-epoch projection, and whether the fine-tune learned (eval F1 >=
--min_f1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run_qa.py, qa_hpc/
from qa_hpc.outputs import SUMMARY_FILE
from qa_hpc.record import RunRecord, Status

STEP_TIMES = "step_times.json"
TRAIN_FEATURES = 88524  # SQuAD v1.1 train at 384/128 (docs/PERFORMANCE.md)
BASELINE_A100 = {"train_seconds": 643, "samples_per_second": 275, "exact_match": 81.28, "f1": 88.38}


class StepTimer(TrainerCallback):
    """The end of every optimizer step on the device's own clock: CUDA events on a GPU (no host-device sync
    while training), the host clock on a CPU. Rank 0 writes the step durations to
    <output_dir>/step_times.json."""

    def __init__(self) -> None:
        self.marks: list[Any] = []

    def _mark(self) -> None:
        if torch.cuda.is_available():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.marks = []
        self._mark()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self._mark()

    def step_seconds(self) -> list[float]:
        """Every optimizer step's duration so far (waits for the GPU)."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            return [start.elapsed_time(end) / 1000 for start, end in pairwise(self.marks)]
        return [end - start for start, end in pairwise(self.marks)]

    def on_train_end(self, args, state, control, **kwargs) -> None:
        seconds = self.step_seconds()
        if state.is_world_process_zero:
            with open(os.path.join(args.output_dir, STEP_TIMES), "w", encoding="utf-8") as fh:
                json.dump({"step_seconds": seconds}, fh)


def train(argv: list[str], extra_callbacks: tuple[TrainerCallback, ...] = ()) -> int:
    """run_qa.py's own entry point with the step timer (and `extra_callbacks`) beside its callbacks."""
    import run_qa

    made = run_qa.observability_callbacks
    run_qa.observability_callbacks = lambda flags, plan: [*made(flags, plan), StepTimer(), *extra_callbacks]
    sys.argv = ["run_qa.py", *argv]
    return run_qa.cli()


class TooFewSteps(ValueError):
    """A run timed no more steps than its warm-up: it has no steady state to read."""


@dataclass(frozen=True)
class SteadyState:
    """A run's step times after its first `warmup_steps` (they hold start-up and first-batch costs)."""

    steps_timed: int  # the steady steps
    warmup_steps: int
    median_step_seconds: float
    mean_step_seconds: float
    warmup_seconds: float


def steady_state(step_seconds: list[float], warmup: int) -> SteadyState:
    if len(step_seconds) <= warmup:
        raise TooFewSteps(f"{len(step_seconds)} steps timed, need more than the {warmup} warm-up steps")
    steady = step_seconds[warmup:]
    return SteadyState(
        steps_timed=len(steady),
        warmup_steps=warmup,
        median_step_seconds=statistics.median(steady),
        mean_step_seconds=statistics.fmean(steady),
        warmup_seconds=sum(step_seconds[:warmup]),
    )


def record(out_dir: str, label: str, warmup: int, min_f1: float) -> dict[str, Any]:
    """One run's smoke record: steady-state speed, memory, accuracy, versions."""
    run = RunRecord.read(os.path.join(out_dir, SUMMARY_FILE))
    with open(os.path.join(out_dir, STEP_TIMES), encoding="utf-8") as fh:
        steps = json.load(fh)["step_seconds"]
    r, e, p = run.results, run.effective, run.params
    try:
        state = steady_state(steps, warmup)
    except TooFewSteps as error:
        raise SystemExit(f"ERROR: {error} (--warmup)") from None
    samples = r.train_samples_per_second * r.train_runtime  # features trained, over the whole run
    batch = p.per_device_train_batch_size * e.world_size * p.gradient_accumulation_steps
    per_second = batch / state.median_step_seconds
    tflops = per_second * r.train_model_tflop / samples
    f1 = r.eval_f1
    return {
        "label": label,
        "status": run.status,
        "device": e.device_name,
        "gpus": e.world_size,
        "precision": e.precision,
        "tf32": e.tf32,
        "driver": run.environment.driver_version,
        "cuda": run.environment.cuda_version,
        "torch": run.environment.torch_version,
        "global_batch": batch,
        **asdict(state),
        "whole_run_step_seconds": r.train_runtime / len(steps),
        "samples_per_second": per_second,
        "real_tokens_per_second": per_second * r.train_real_tokens / samples,
        "achieved_tflops": tflops,
        "mfu": tflops / r.train_peak_tflops if r.train_peak_tflops else None,
        "peak_memory_mb": run.memory.measured_peak_mb if run.memory else None,
        "projected_2_epochs_seconds": 2 * TRAIN_FEATURES / per_second,
        "baseline_a100": BASELINE_A100,
        "eval_exact_match": r.eval_exact_match,
        "eval_f1": f1,
        "min_f1": min_f1,
        "learned": f1 is not None and f1 >= min_f1,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        return train(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["record"])
    parser.add_argument("output_dir")
    parser.add_argument("--label", required=True)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--min_f1", type=float, default=0.0)
    parser.add_argument("--results_dir", default=os.path.join(os.path.dirname(__file__), "results"))
    a = parser.parse_args()
    rec = record(a.output_dir, a.label, a.warmup, a.min_f1)
    os.makedirs(a.results_dir, exist_ok=True)
    path = os.path.join(a.results_dir, f"gpu_smoke_{time.strftime('%Y-%m-%d_%H%M%S')}_{a.label}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(rec, fh, indent=1)
    keys = (
        "label",
        "device",
        "gpus",
        "precision",
        "median_step_seconds",
        "samples_per_second",
        "real_tokens_per_second",
        "mfu",
        "peak_memory_mb",
        "projected_2_epochs_seconds",
        "eval_f1",
        "learned",
    )
    print(
        "SMOKE "
        + " ".join(
            f"{k}={rec[k]:.4g}" if isinstance(rec[k], float) else f"{k}={rec[k]}".replace(" ", "_")
            for k in keys
        )
        + f" record={path}"
    )
    print(
        f"SMOKE_VS_A100 projected_2_epochs_seconds={rec['projected_2_epochs_seconds']:.0f} (A100: "
        f"{BASELINE_A100['train_seconds']}) samples_per_second={rec['samples_per_second']:.0f} (A100: "
        f"{BASELINE_A100['samples_per_second']})"
    )
    return 0 if rec["learned"] and rec["status"] == Status.OK else 1


if __name__ == "__main__":
    sys.exit(main())
