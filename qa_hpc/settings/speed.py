"""Speed flags of run_qa.py (precision, kernels, postprocessing) and their per-device defaults.

Users want an answer sooner per GPU-hour without hand-tuning flags for each
machine, so `--precision auto` and `--speed_defaults` (both on by default) pick
what is fastest and safe where the run lands, and say so in one log line:

- precision: bf16 autocast on GPUs that support it (Ampere+), fp16 on older GPUs,
  fp32 on CPU; training and evaluation both run under it;
- TF32 matmuls on Ampere+ (for whatever still runs in fp32);
- fused AdamW (transformers 5 already defaults to adamw_torch_fused);
- SDPA attention (transformers' default; `--attn_implementation` overrides);
- on CUDA, dataloader workers so collation overlaps the GPU (pinned memory is on);
- vectorized postprocessing (`--postprocess loop` runs the reference loop).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
POSTPROCESSORS = ("vectorized", "loop")


class SpeedFlagError(ValueError):
    """A speed flag that cannot work on this machine (reported as a usage error)."""


@dataclass
class SpeedArguments:
    """(qa-hpc) Precision, kernels and postprocessing."""

    precision: str = field(
        default="auto",
        metadata={
            "help": "(qa-hpc) Numeric precision for training and evaluation: 'auto' = bf16 autocast on GPUs that "
            "support it, fp16 on older GPUs, fp32 on CPU; or 'fp32', 'bf16', 'fp16' (fp16 is refused on CPU). "
            "HF's --bf16/--fp16 are honoured when --precision is auto.",
            "choices": list(PRECISIONS),
        },
    )
    postprocess: str = field(
        default="vectorized",
        metadata={
            "help": "(qa-hpc) Logits -> answers: 'vectorized' (array code, same answers, 20x+ faster) or 'loop' "
            "(the per-feature reference loop, as in the HF example).",
            "choices": list(POSTPROCESSORS),
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "(qa-hpc) Attention kernel: 'sdpa' (PyTorch scaled_dot_product_attention: flash/memory-efficient "
            "kernels on GPU), 'eager', 'flash_attention_2' (needs the flash-attn package). Default: transformers' "
            "choice, which is sdpa for BERT-style models."
        },
    )
    speed_defaults: bool = field(
        default=True,
        metadata={
            "help": "(qa-hpc) Per-device defaults: TF32 on Ampere+ GPUs (unless --tf32 is given), and on CUDA "
            "dataloader workers when --dataloader_num_workers is 0. --speed_defaults false leaves "
            "TrainingArguments exactly as given."
        },
    )


@dataclass
class SpeedPlan:
    """What was resolved, for the log line and run_summary.json."""

    device: str
    precision: str
    precision_reason: str
    tf32: bool
    optim: str
    attn_implementation: str | None
    dataloader_num_workers: int
    dataloader_pin_memory: bool
    torch_compile: bool
    postprocess: str

    def log_line(self) -> str:
        return (
            f"SPEED device={self.device} precision={self.precision} ({self.precision_reason}) "
            f"tf32={'on' if self.tf32 else 'off'} optim={self.optim} attn={self.attn_implementation or 'default'} "
            f"dataloader_workers={self.dataloader_num_workers} pin_memory={self.dataloader_pin_memory} "
            f"torch_compile={self.torch_compile} postprocess={self.postprocess}"
        )


def _cuda_capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def choose_precision(requested: str, device_type: str, bf16_ok: bool, hf_bf16: bool, hf_fp16: bool) -> tuple[str, str]:
    """(precision, reason) for --precision on a device; pure so tests can cover every device.

    An explicit --precision must agree with HF's --bf16/--fp16 when those are given too.
    """
    if requested not in PRECISIONS:
        raise SpeedFlagError(f"--precision {requested!r}: choose one of {', '.join(PRECISIONS)}")
    hf = "bf16" if hf_bf16 else "fp16" if hf_fp16 else None
    if requested != "auto" and hf is not None and hf != requested:
        raise SpeedFlagError(f"--precision {requested} contradicts --{hf}; give one of them")
    if requested == "auto":
        if hf is not None:
            requested, reason = hf, f"--{hf} given"
        elif device_type == "cuda":
            return ("bf16", "auto: this GPU supports bf16") if bf16_ok else ("fp16", "auto: GPU without bf16")
        else:
            return "fp32", f"auto: {device_type} device"
    else:
        reason = "requested"
    if requested == "fp16" and device_type == "cpu":
        raise SpeedFlagError(
            "--precision fp16 (or --fp16) is not supported on CPU: PyTorch has no fast fp16 CPU kernels and "
            "mixed-precision fp16 needs a GPU grad scaler; use --precision bf16 (CPUs with AVX512-BF16/AMX) or fp32"
        )
    if requested == "bf16" and device_type == "cuda" and not bf16_ok:
        raise SpeedFlagError("--precision bf16 needs an Ampere or newer GPU (this one has no bf16); use fp16 or fp32")
    return requested, reason


def resolve_speed(speed: SpeedArguments, training_args: Any) -> SpeedPlan:
    """Apply --precision and the per-device defaults to training_args (in place); return what was chosen."""
    device = training_args.device
    capability = _cuda_capability(device)
    bf16_ok = capability is not None and torch.cuda.is_bf16_supported()
    precision, reason = choose_precision(
        speed.precision, device.type, bf16_ok, bool(training_args.bf16), bool(training_args.fp16)
    )
    # TrainingArguments derived mixed_precision in __post_init__; keep both in step
    training_args.bf16 = precision == "bf16"
    training_args.fp16 = precision == "fp16"
    training_args.mixed_precision = precision if precision != "fp32" else "no"

    tf32 = bool(training_args.tf32)
    if speed.speed_defaults and training_args.tf32 is None and capability is not None and capability >= (8, 0):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        training_args.tf32 = tf32 = True
    if speed.speed_defaults and device.type == "cuda" and training_args.dataloader_num_workers == 0:
        local_world = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        training_args.dataloader_num_workers = max(0, min(4, cpus // local_world - 1))
    optim = getattr(training_args.optim, "value", training_args.optim)
    return SpeedPlan(
        device=f"{device.type}" + (f"(sm_{capability[0]}{capability[1]})" if capability else ""),
        precision=precision,
        precision_reason=reason,
        tf32=tf32,
        optim=str(optim),
        attn_implementation=speed.attn_implementation,
        dataloader_num_workers=int(training_args.dataloader_num_workers),
        dataloader_pin_memory=bool(training_args.dataloader_pin_memory),
        torch_compile=bool(training_args.torch_compile),
        postprocess=speed.postprocess,
    )


def model_kwargs(speed: SpeedArguments) -> dict[str, Any]:
    """from_pretrained kwargs for the attention kernel (empty: transformers' default)."""
    return {"attn_implementation": speed.attn_implementation} if speed.attn_implementation else {}


__all__ = ["SpeedArguments", "SpeedFlagError", "SpeedPlan", "choose_precision", "model_kwargs", "resolve_speed"]
