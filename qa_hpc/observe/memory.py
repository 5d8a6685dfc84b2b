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

import torch

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


def anatomy_estimate(
    shape: ModelShape,
    precision: str,
    optim_name: str,
    batch_size: int,
    seq_len: int,
    gradient_checkpointing: bool = False,
) -> dict[str, Any]:
    """Training memory predicted from the model's shape, per process.

    Weights/gradients/optimizer follow the HF "Anatomy of model's memory" rules: fp32
    training keeps 4 B weights + 4 B gradients + 8 B AdamW states = 16 B/param; mixed
    precision adds a 16-bit copy of the weights = 18 B/param. Activations of a
    transformer layer follow Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes with
    16-bit activations, s*b*h*(66 + 9*a*s/h) with fp32 ones (dropout masks stay 1 byte).
    s is max_seq_length, an upper bound when batches are padded to their longest feature.
    """
    params, trainable = shape.params, shape.trainable_params
    mixed = precision in ("fp16", "bf16")
    weights_bpp = 6 if mixed else 4
    grads_bpp = 4
    optim_bpp = optimizer_bytes_per_param(optim_name)
    activations, formula = activation_bytes(shape, mixed, batch_size, seq_len, gradient_checkpointing)
    weights = params * weights_bpp
    grads = trainable * grads_bpp
    optim = trainable * optim_bpp
    total = weights + grads + optim + activations
    return {
        "params": params,
        "trainable_params": trainable,
        "precision": precision,
        "optimizer": str(getattr(optim_name, "value", optim_name)),
        "bytes_per_param": {
            "weights": weights_bpp,
            "gradients": grads_bpp,
            "optimizer": optim_bpp,
            "total": weights_bpp + grads_bpp + optim_bpp,
        },
        "weights_mb": round(weights / MB, 1),
        "gradients_mb": round(grads / MB, 1),
        "optimizer_mb": round(optim / MB, 1),
        "activations_mb": round(activations / MB, 1),
        "total_mb": round(total / MB, 1),
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


def cpu_peak_rss_mb() -> float:
    """Peak resident set size of this process (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (MB if sys.platform == "darwin" else 1024), 1)


def cpu_rss_mb() -> float | None:
    """Current resident set size, from psutil when installed."""
    try:
        import psutil
    except ImportError:
        return None
    return round(psutil.Process().memory_info().rss / MB, 1)


def cuda_memory(device: torch.device | None = None) -> dict[str, Any] | None:
    """Peaks of the CUDA caching allocator on this process's device, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    props = torch.cuda.get_device_properties(index)
    return {
        "device_index": index,
        "device_name": props.name,
        "total_mb": round(props.total_memory / MB, 1),
        "peak_allocated_mb": round(torch.cuda.max_memory_allocated(index) / MB, 1),
        "peak_reserved_mb": round(torch.cuda.max_memory_reserved(index) / MB, 1),
        "allocated_mb": round(torch.cuda.memory_allocated(index) / MB, 1),
        "reserved_mb": round(torch.cuda.memory_reserved(index) / MB, 1),
    }


def _nvml_handle(pynvml: Any, index: int) -> Any:
    """NVML numbers physical GPUs; torch numbers visible ones. Match by UUID when torch knows it."""
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        if uuid:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # noqa: BLE001 - older drivers/torch: fall back to the index below
        pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if index < len(ids) and ids[index].isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(ids[index]))
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def nvml_memory(device: torch.device | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """What the driver says is in use on this process's GPU (every process, CUDA context included)."""
    if not torch.cuda.is_available():
        return None, NO_CUDA_NOTE
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py not installed"
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    try:
        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - NVML missing on this node is not an error of the run
        return None, f"NVML unavailable: {err}"
    try:
        handle = _nvml_handle(pynvml, index)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        result: dict[str, Any] = {
            "used_mb": round(info.used / MB, 1),
            "total_mb": round(info.total / MB, 1),
            "process_used_mb": None,
        }
        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    result["process_used_mb"] = round(proc.usedGpuMemory / MB, 1)
        except Exception:  # noqa: BLE001 - per-process figures are not exposed in every container
            pass
        return result, None
    except Exception as err:  # noqa: BLE001
        return None, f"NVML query failed: {err}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def measure_process(rank: int, device: torch.device | None = None) -> dict[str, Any]:
    """This process's memory figures."""
    cuda = cuda_memory(device)
    nvml, nvml_note = nvml_memory(device)
    return {
        "rank": rank,
        "host": platform.node(),
        "cuda": cuda,
        "nvml": nvml,
        "nvml_note": nvml_note,
        "cpu": {"peak_rss_mb": cpu_peak_rss_mb(), "rss_mb": cpu_rss_mb()},
    }


def build_report(ranks: list[dict[str, Any]], estimate: Mapping[str, Any] | None) -> dict[str, Any]:
    """memory.json: rank 0's figures at the top, the max over ranks, every rank, and the estimate."""
    main = ranks[0]
    cuda_peaks = [r["cuda"]["peak_allocated_mb"] for r in ranks if r["cuda"]]
    report: dict[str, Any] = {
        "cuda": main["cuda"],
        "nvml": main["nvml"],
        "cpu": main["cpu"],
        "max_over_ranks": {
            "cuda_peak_allocated_mb": max(cuda_peaks) if cuda_peaks else None,
            "cuda_peak_reserved_mb": max((r["cuda"]["peak_reserved_mb"] for r in ranks if r["cuda"]), default=None),
            "cpu_peak_rss_mb": max(r["cpu"]["peak_rss_mb"] for r in ranks),
        },
        "world_size": len(ranks),
        "ranks": ranks,
        "estimate": dict(estimate) if estimate else None,
    }
    notes = []
    if main["cuda"] is None:
        notes.append(NO_CUDA_NOTE)
    elif main["nvml_note"]:
        notes.append(main["nvml_note"])
    if estimate:
        if main["cuda"] is not None:
            measured = report["max_over_ranks"]["cuda_peak_allocated_mb"]
            report["measured_peak_mb"] = measured
            report["measured_source"] = "cuda peak allocated (max over ranks)"
        else:
            measured = report["max_over_ranks"]["cpu_peak_rss_mb"]
            report["measured_peak_mb"] = measured
            report["measured_source"] = "cpu peak RSS (max over ranks; includes the Python runtime and libraries)"
        report["estimate_over_measured"] = (
            round(estimate["total_mb"] / measured, 3) if measured else None
        )
    report["note"] = "; ".join(notes) if notes else None
    return report


def write_report(path: str, report: Mapping[str, Any]) -> None:
    write_json_atomic(path, report)


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
    est = report.get("estimate")
    if est:
        lines.append(f"MEMORY_ESTIMATE_MB={est['total_mb']:.1f}")
        lines.append(f"MEMORY_ESTIMATE_BYTES_PER_PARAM={est['bytes_per_param']['total']}")
    return lines
