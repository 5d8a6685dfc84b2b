"""One variant of bench/gpu_speed.py's sitting, in its own process: the target script run as __main__, probed.

    python bench/gpu_speed_probe.py PROBE_JSON SCRIPT ARGS...     as `python SCRIPT ARGS...`, plus PROBE_JSON

Every Trainer the script builds gets the same TrainerCallback, whichever script it is (our run_qa.py or HF's):
CUDA events at each optimizer step's end, each batch's real tokens (its attention_mask, summed on the device,
so nothing waits), train()'s wall time, peak GPU memory and dynamo's compile time, written as JSON when
training ends. bench/gpu_speed_records.py turns it into the variant's figures.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from dataclasses import asdict
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # qa_hpc/, bench/ without a venv (a bare GPU node)

from bench.gpu_smoke import StepTimer  # noqa: E402


class SpeedProbe(StepTimer):
    """What one training run did, measured alike for any script built on transformers' Trainer: the step times
    (StepTimer's CUDA events), each batch's real sequence lengths, train()'s wall time, peak GPU memory,
    dynamo's compile time. Written to `path` as JSON when training ends."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.lengths: list[Any] = []  # one tensor per micro-batch, on the device: no sync while training
        self.batches_at_step_end: list[int] = []
        self.shape: dict[str, Any] = {}
        self.started = 0.0

    def count(self, inputs: dict[str, Any]) -> None:
        mask = inputs.get("attention_mask")
        if mask is None:  # no padding: every position is a real token
            mask = inputs["input_ids"].new_ones(inputs["input_ids"].shape)
        self.lengths.append(mask.sum(dim=1))

    def on_train_begin(self, args, state, control, model=None, **kwargs) -> None:
        import torch

        from qa_hpc.model import ModelShape

        self.shape = asdict(ModelShape.of(model))
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.started = time.perf_counter()
        super().on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs) -> None:
        super().on_step_end(args, state, control, **kwargs)
        self.batches_at_step_end.append(len(self.lengths))

    def on_train_end(self, args, state, control, **kwargs) -> None:
        seconds = self.step_seconds()  # waits for the GPU
        wall = time.perf_counter() - self.started
        bounds = pairwise([0, *self.batches_at_step_end])
        per_step = [[int(n) for part in self.lengths[a:b] for n in part.tolist()] for a, b in bounds]
        batch = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
        probe = {
            "step_seconds": seconds,
            "step_lengths": per_step,
            "train_wall_seconds": wall,
            "global_batch": batch,
            "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            "tf32": bool(args.tf32),
            "dataloader_num_workers": args.dataloader_num_workers,
            "torch_compile": bool(args.torch_compile),
            "torch_compile_mode": args.torch_compile_mode,
            **compile_figures(),
            "peak_memory_mb": peak_memory_mb(),
            "model_shape": self.shape,
            "environment": environment(),
        }
        Path(self.path).write_text(json.dumps(probe), encoding="utf-8")


# what compile_figures gives: dynamo's seconds, then qa_hpc.compile.CompileCounts' fields in their order
COMPILE_FIGURES = (
    "compile_seconds",
    "compiled_graphs",
    "compile_cache_hits",
    "compile_cache_misses",
    "cuda_graph_skips",
)


def compile_figures() -> dict[str, float | int | None]:
    """Seconds dynamo and inductor spent compiling in this process, the graphs made, inductor's cache hits and
    misses (hits: compiled warm), and the graphs inductor left without CUDA graphs (None: no compile)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None or not utils.counters["stats"]["unique_graphs"]:
        return dict.fromkeys(COMPILE_FIGURES)
    from qa_hpc.compile import CompileCounts

    spent = utils.calculate_time_spent()  # torch's own account, as TORCH_LOGS prints it
    figures = (spent.get("total_wall_time"), *CompileCounts.now())
    return dict(zip(COMPILE_FIGURES, figures, strict=True))


def peak_memory_mb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def environment() -> dict[str, Any]:
    """The machine and the versions that ran (the device facts run_summary.json keeps, plus the libraries)."""
    from importlib.metadata import version

    from qa_hpc.device import read_device_facts

    facts = read_device_facts()
    return {
        "device": facts.gpu_name or "cpu",
        "capability": "sm_{}{}".format(*facts.capability) if facts.capability else None,
        "driver": facts.driver_version,
        "cuda": facts.torch_cuda,
        "cudnn": facts.cudnn_version,
        "torch": facts.torch_version,
        "transformers": version("transformers"),
        "datasets": version("datasets"),
        "accelerate": version("accelerate"),
        "python": sys.version.split()[0],
        "cpu_model": facts.cpu.model,
        "cpus": facts.cpus,
    }


def probe_every_trainer(probe: SpeedProbe) -> None:
    """Every Trainer built from now on carries the probe, and shows it each batch before the step."""
    from transformers import Trainer

    build = Trainer.__init__
    step = Trainer.training_step

    def build_with_probe(self, *args, **kwargs) -> None:
        build(self, *args, **kwargs)
        self.add_callback(probe)

    def step_counting_tokens(self, model, inputs, *args, **kwargs):
        probe.count(inputs)
        return step(self, model, inputs, *args, **kwargs)

    Trainer.__init__ = build_with_probe
    Trainer.training_step = step_counting_tokens


def child(probe_path: str, script: str, argv: list[str]) -> None:
    """Run `script` as `python script argv...` would, with the probe in; its exit is this process's exit."""
    script = os.path.abspath(script)
    probe_every_trainer(SpeedProbe(probe_path))
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(script))  # its own modules first (both scripts have a trainer_qa.py)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    child(sys.argv[1], sys.argv[2], sys.argv[3:])
