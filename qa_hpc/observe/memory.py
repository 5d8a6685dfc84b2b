"""Where the memory went: every rank's measured peaks (CUDA allocator, NVML, CPU RSS) beside what the model's
anatomy predicts, in memory.json (the run's record keeps a summary, its closing lines the `MEMORY_*=` ones).
Without CUDA the GPU fields are null and the report says why.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import psutil
import torch

from qa_hpc.atomic_io import write_json_atomic
from qa_hpc.outputs import MEMORY_FILE

if TYPE_CHECKING:  # qa_hpc.model imports transformers: these figures need none of it
    from qa_hpc.model import ModelShape

MB = 1024 * 1024
NO_CUDA_NOTE = "no CUDA device"
# Optimizer state bytes per trainable parameter, first name part that matches (HF "Anatomy of model's
# memory"); unknown optimizers count as Adam-like, the common case.
OPTIMIZER_BYTES = (
    ("8bit", 2),
    ("adafactor", 4),
    ("sgd", 0),  # as the Trainer builds it, no momentum
    ("adam", 8),
)
# Korthikanti et al. 2022, bytes per layer per s*b*h: (constant, per a*s/h, bytes per activation) by 16-bit
# or fp32
ACTIVATIONS = {True: (34, 5, 2), False: (66, 9, 4)}


def anatomy_estimate(
    shape: ModelShape,
    precision: str,
    optim_name: str,
    batch_size: int,
    seq_len: int,
    gradient_checkpointing: bool = False,
) -> dict[str, Any]:
    """Training memory per process predicted from the model's shape: 4 B weights + 4 B gradients + 8 B AdamW
    states = 16 B/param in fp32, plus a 16-bit copy of the weights in mixed precision; activations per
    ACTIVATIONS, with s = max_seq_length (an upper bound when batches are padded to their longest feature)."""
    mixed = precision in ("fp16", "bf16")
    optim = str(getattr(optim_name, "value", optim_name))  # an OptimizerNames member or its name
    bpp = {
        "weights": 6 if mixed else 4,
        "gradients": 4,
        "optimizer": next((n for key, n in OPTIMIZER_BYTES if key in optim.lower()), 8),
    }
    h, a, layers, s, b = shape.hidden, shape.heads, shape.layers, seq_len, batch_size
    if h and a and layers:
        const, per_head, act_bytes = ACTIVATIONS[mixed]
        sbh = s * b * h
        per_layer = sbh * (const + per_head * a * s / h)
        embeddings = sbh * (2 * act_bytes + 1)  # embedding sum, layer norm output, dropout mask
        # checkpointing keeps only each layer's input, plus one layer recomputed at a time
        activations = embeddings + (
            layers * sbh * act_bytes + per_layer if gradient_checkpointing else layers * per_layer
        )
        formula = (
            f"{layers} layers x s*b*h*({const} + {per_head}*a*s/h) bytes, s={s} b={b} h={h} a={a} "
            "(Korthikanti et al. 2022)"
            + ("; gradient checkpointing: layer inputs + one layer" if gradient_checkpointing else "")
        )
    else:
        activations = 0.0
        formula = (
            "model config lacks hidden_size/num_attention_heads/num_hidden_layers; activations not estimated"
        )
    nbytes = {
        "weights": shape.params * bpp["weights"],
        "gradients": shape.trainable_params * bpp["gradients"],
        "optimizer": shape.trainable_params * bpp["optimizer"],
        "activations": activations,
    }
    return {
        "params": shape.params,
        "trainable_params": shape.trainable_params,
        "precision": precision,
        "optimizer": optim,
        "bytes_per_param": {**bpp, "total": sum(bpp.values())},
        **{f"{part}_mb": round(n / MB, 1) for part, n in nbytes.items()},
        "total_mb": round(sum(nbytes.values()) / MB, 1),
        "batch_size": batch_size,
        "seq_len": seq_len,
        "activation_formula": formula,
    }


def measure_process(rank: int, device: torch.device) -> dict[str, Any]:
    """This process's memory figures: CUDA allocator peaks, what NVML sees in use (every process, CUDA context
    included) and CPU RSS (ru_maxrss is KiB on Linux, bytes on macOS)."""
    cuda, nvml, note = None, None, NO_CUDA_NOTE
    # the run's device, not torch.cuda.is_available(): a --use_cpu run on a GPU node has no GPU figures
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        props = torch.cuda.get_device_properties(index)
        figures = {
            "total_mb": props.total_memory,
            "peak_allocated_mb": torch.cuda.max_memory_allocated(index),
            "peak_reserved_mb": torch.cuda.max_memory_reserved(index),
            "allocated_mb": torch.cuda.memory_allocated(index),
            "reserved_mb": torch.cuda.memory_reserved(index),
        }
        cuda = {
            "device_index": index,
            "device_name": props.name,
            **{k: round(v / MB, 1) for k, v in figures.items()},
        }
        try:  # torch maps its device index to NVML's (CUDA_VISIBLE_DEVICES, UUIDs)
            nvml, note = {"used_mb": round(torch.cuda.device_memory_used(device) / MB, 1)}, None
        except Exception as err:  # noqa: BLE001 - no NVML on this node is not an error of the run
            note = f"NVML unavailable: {err}"
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (MB if sys.platform == "darwin" else 1024)
    cpu = {"peak_rss_mb": round(peak_rss, 1), "rss_mb": round(psutil.Process().memory_info().rss / MB, 1)}
    return {"rank": rank, "host": platform.node(), "cuda": cuda, "nvml": nvml, "nvml_note": note, "cpu": cpu}


def memory_report(
    ranks: list[dict[str, Any]], estimate: Mapping[str, Any] | None, output_dir: str
) -> dict[str, Any]:
    """memory.json from every rank's measure_process() figures, written there and returned: rank 0's figures
    at the top, the max over ranks, every rank, and the estimate beside the peak."""
    main = ranks[0]
    gpus = [r["cuda"] for r in ranks if r["cuda"]]
    peaks = {
        "cuda_peak_allocated_mb": max((g["peak_allocated_mb"] for g in gpus), default=None),
        "cuda_peak_reserved_mb": max((g["peak_reserved_mb"] for g in gpus), default=None),
        "cpu_peak_rss_mb": max(r["cpu"]["peak_rss_mb"] for r in ranks),
    }
    report = {
        "cuda": main["cuda"],
        "nvml": main["nvml"],
        "cpu": main["cpu"],
        "max_over_ranks": peaks,
        "world_size": len(ranks),
        "ranks": ranks,
        "estimate": dict(estimate) if estimate else None,
        "note": main["nvml_note"],
    }
    # the run's peak, with or without an estimate beside it (an evaluation-only run has none): what the
    # tables and TensorBoard show as its peak memory
    if gpus:
        measured = peaks["cuda_peak_allocated_mb"]
        source = "cuda peak allocated (max over ranks)"
    else:
        measured = peaks["cpu_peak_rss_mb"]
        source = "cpu peak RSS (max over ranks; includes the Python runtime and libraries)"
    report.update(measured_peak_mb=measured, measured_source=source)
    if estimate:
        report["estimate_over_measured"] = round(estimate["total_mb"] / measured, 3) if measured else None
    write_json_atomic(os.path.join(output_dir, MEMORY_FILE), report)
    return report
