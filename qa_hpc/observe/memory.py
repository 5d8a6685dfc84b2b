"""Where the memory went: measured peaks beside an estimate from the model's anatomy.

At the end of a run every rank measures its own peaks (CUDA allocator, NVML, CPU
RSS); rank 0 gathers them, adds what the model's anatomy predicts (weights,
gradients, optimizer states and activations for the precision and optimizer in
use) and writes `memory.json` plus greppable `MEMORY_*=` lines. On a machine
without CUDA the GPU fields are null and the report says why, so the same code
runs unchanged on a laptop and on a GPU node.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from collections.abc import Mapping
from typing import Any

import psutil
import torch
from accelerate.utils import gather_object
from transformers import TrainingArguments

from qa_hpc.atomic_io import write_json_atomic
from qa_hpc.model import ModelShape

MB = 1024 * 1024
NO_CUDA_NOTE = "no CUDA device"

# Bytes per trainable parameter for the optimizer states (HF "Anatomy of model's memory").
OPTIMIZER_BYTES = (
    ("8bit", 2),  # bitsandbytes 8-bit Adam: two 1-byte states
    ("adafactor", 4),  # factored second moment, roughly one state
    ("sgd", 0),  # plain SGD as the Trainer builds it (no momentum)
    ("adam", 8),  # Adam/AdamW: two fp32 states (exp_avg, exp_avg_sq)
)


def optimizer_bytes_per_param(optim_name: str) -> int:
    """Optimizer state bytes per trainable parameter for a TrainingArguments.optim name."""
    name = str(getattr(optim_name, "value", optim_name)).lower()
    for key, nbytes in OPTIMIZER_BYTES:
        if key in name:
            return nbytes
    return 8  # unknown optimizers: assume Adam-like, the common case


def anatomy_estimate(shape: ModelShape, precision: str, optim_name: str, batch_size: int, seq_len: int,
                     gradient_checkpointing: bool = False) -> dict[str, Any]:
    """Training memory predicted from the model's shape, per process.

    Weights/gradients/optimizer follow the HF "Anatomy of model's memory" rules: fp32
    training keeps 4 B weights + 4 B gradients + 8 B AdamW states = 16 B/param; mixed
    precision adds a 16-bit copy of the weights = 18 B/param. Activations of a
    transformer layer follow Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes with
    16-bit activations, s*b*h*(66 + 9*a*s/h) with fp32 ones (dropout masks stay 1 byte).
    s is max_seq_length, an upper bound when batches are padded to their longest feature.
    """
    mixed = precision in ("fp16", "bf16")
    bpp = {"weights": 6 if mixed else 4, "gradients": 4, "optimizer": optimizer_bytes_per_param(optim_name)}
    activations, formula = activation_bytes(shape, mixed, batch_size, seq_len, gradient_checkpointing)
    nbytes = {"weights": shape.params * bpp["weights"], "gradients": shape.trainable_params * bpp["gradients"],
              "optimizer": shape.trainable_params * bpp["optimizer"], "activations": activations}
    return {
        "params": shape.params,
        "trainable_params": shape.trainable_params,
        "precision": precision,
        "optimizer": str(getattr(optim_name, "value", optim_name)),
        "bytes_per_param": {**bpp, "total": sum(bpp.values())},
        **{f"{part}_mb": round(n / MB, 1) for part, n in nbytes.items()},
        "total_mb": round(sum(nbytes.values()) / MB, 1),
        "batch_size": batch_size,
        "seq_len": seq_len,
        "activation_formula": formula,
    }


def activation_bytes(shape: ModelShape, mixed: bool, batch_size: int, seq_len: int,
                     gradient_checkpointing: bool) -> tuple[float, str]:
    """(bytes, the formula used) of the activations kept for backward, per process (Korthikanti et al. 2022)."""
    hidden, heads, layers = shape.hidden, shape.heads, shape.layers
    if not (hidden and heads and layers):
        return 0.0, "model config lacks hidden_size/num_attention_heads/num_hidden_layers; activations not estimated"
    sbh = seq_len * batch_size * hidden
    if mixed:
        per_layer, act_bytes = sbh * (34 + 5 * heads * seq_len / hidden), 2
    else:
        per_layer, act_bytes = sbh * (66 + 9 * heads * seq_len / hidden), 4
    embeddings = sbh * (2 * act_bytes + 1)  # embedding sum, layer norm output, dropout mask
    if gradient_checkpointing:  # only each layer's input is kept, plus one layer recomputed at a time
        activations = layers * sbh * act_bytes + per_layer + embeddings
    else:
        activations = layers * per_layer + embeddings
    formula = (
        f"{layers} layers x s*b*h*({'34 + 5' if mixed else '66 + 9'}*a*s/h) bytes, s={seq_len} b={batch_size} "
        f"h={hidden} a={heads} (Korthikanti et al. 2022)"
        + ("; gradient checkpointing: layer inputs + one layer" if gradient_checkpointing else "")
    )
    return activations, formula


def cuda_memory(device: torch.device | None = None) -> dict[str, Any] | None:
    """Peaks of the CUDA caching allocator on this process's device, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    props = torch.cuda.get_device_properties(index)
    figures = {"total_mb": props.total_memory, "peak_allocated_mb": torch.cuda.max_memory_allocated(index),
               "peak_reserved_mb": torch.cuda.max_memory_reserved(index),
               "allocated_mb": torch.cuda.memory_allocated(index), "reserved_mb": torch.cuda.memory_reserved(index)}
    return {"device_index": index, "device_name": props.name, **{k: round(v / MB, 1) for k, v in figures.items()}}


def nvml_memory(device: torch.device | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """What the driver says is in use on this process's GPU (every process, CUDA context included), or why not."""
    if not torch.cuda.is_available():
        return None, NO_CUDA_NOTE
    try:  # torch maps its device index to NVML's (CUDA_VISIBLE_DEVICES, UUIDs)
        used = torch.cuda.device_memory_used(device)
    except Exception as err:  # noqa: BLE001 - no NVML on this node is not an error of the run
        return None, f"NVML unavailable: {err}"
    return {"used_mb": round(used / MB, 1)}, None


def measure_process(rank: int, device: torch.device | None = None) -> dict[str, Any]:
    """This process's memory figures (ru_maxrss is KiB on Linux, bytes on macOS)."""
    nvml, nvml_note = nvml_memory(device)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (MB if sys.platform == "darwin" else 1024)
    cpu = {"peak_rss_mb": round(peak_rss, 1), "rss_mb": round(psutil.Process().memory_info().rss / MB, 1)}
    return {"rank": rank, "host": platform.node(), "cuda": cuda_memory(device), "nvml": nvml, "nvml_note": nvml_note,
            "cpu": cpu}


def memory_report(args: TrainingArguments, estimate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Every rank measures (a collective); rank 0 gets memory.json's content and writes it, the others None."""
    ranks = gather_object([measure_process(args.process_index, args.device)])
    if args.process_index != 0:
        return None
    report = build_report(ranks, estimate)
    write_json_atomic(os.path.join(args.output_dir, "memory.json"), report)
    return report


def build_report(ranks: list[dict[str, Any]], estimate: Mapping[str, Any] | None) -> dict[str, Any]:
    """memory.json: rank 0's figures at the top, the max over ranks, every rank, and the estimate."""
    main, gpus = ranks[0], [r["cuda"] for r in ranks if r["cuda"]]
    report: dict[str, Any] = {
        "cuda": main["cuda"],
        "nvml": main["nvml"],
        "cpu": main["cpu"],
        "max_over_ranks": {
            "cuda_peak_allocated_mb": max((g["peak_allocated_mb"] for g in gpus), default=None),
            "cuda_peak_reserved_mb": max((g["peak_reserved_mb"] for g in gpus), default=None),
            "cpu_peak_rss_mb": max(r["cpu"]["peak_rss_mb"] for r in ranks),
        },
        "world_size": len(ranks),
        "ranks": ranks,
        "estimate": dict(estimate) if estimate else None,
        "note": NO_CUDA_NOTE if main["cuda"] is None else main["nvml_note"],
    }
    if estimate:
        peaks = report["max_over_ranks"]
        measured = peaks["cuda_peak_allocated_mb"] if gpus else peaks["cpu_peak_rss_mb"]
        report["measured_peak_mb"] = measured
        report["measured_source"] = ("cuda peak allocated (max over ranks)" if gpus else
                                     "cpu peak RSS (max over ranks; includes the Python runtime and libraries)")
        report["estimate_over_measured"] = round(estimate["total_mb"] / measured, 3) if measured else None
    return report


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """Greppable KEY=value lines for the log (max over ranks where it matters)."""
    lines = []
    peaks = report["max_over_ranks"]
    if report["cuda"] is not None:
        lines.append(f"MEMORY_CUDA_PEAK_ALLOCATED_MB={peaks['cuda_peak_allocated_mb']:.1f}")
        lines.append(f"MEMORY_CUDA_PEAK_RESERVED_MB={peaks['cuda_peak_reserved_mb']:.1f}")
        if report["nvml"] is not None:
            lines.append(f"MEMORY_NVML_USED_MB={report['nvml']['used_mb']:.1f}")
    else:
        lines.append("MEMORY_CUDA=none (no CUDA device)")
    lines.append(f"MEMORY_CPU_PEAK_RSS_MB={peaks['cpu_peak_rss_mb']:.1f}")
    if report.get("estimate"):
        lines.append(f"MEMORY_ESTIMATE_MB={report['estimate']['total_mb']:.1f}")
        lines.append(f"MEMORY_ESTIMATE_BYTES_PER_PARAM={report['estimate']['bytes_per_param']['total']}")
    return lines
