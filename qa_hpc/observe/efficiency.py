"""Per-run efficiency: real tokens/s, samples/s, model FLOPs and model FLOP utilisation (MFU).

Useful work counts real tokens only (padding is waste): the usual transformer estimate per training sequence
(train_flops_per_sequence; bert-base at s = 384 is about 212 GFLOP). MFU divides the achieved FLOP/s by the
summed dense peak of the devices at the run's precision (vendors' data sheets); a CPU has no meaningful peak.
The run's closing lines show these figures (qa_hpc.record.RunRecord.closing_lines).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # qa_hpc.model imports transformers: these figures need none of it
    from qa_hpc.model import ModelShape


# name substring (lower case) -> peak TFLOP/s (bf16/fp16 tensor, tf32 tensor, fp32), dense; longest key
# matched first
GPU_PEAK_TFLOPS: dict[str, tuple[float, float, float]] = {
    "h200 nvl": (835.0, 418.0, 60.0),
    "h200": (989.0, 494.0, 67.0),  # SXM ("NVIDIA H200")
    "h100 nvl": (835.0, 418.0, 60.0),
    "h100 pcie": (756.0, 378.0, 51.0),
    "h100": (989.0, 494.0, 67.0),  # SXM ("NVIDIA H100 80GB HBM3")
    "a100": (312.0, 156.0, 19.5),
    "a10g": (70.0, 35.0, 31.2),
    "a10": (125.0, 62.5, 31.2),
    "l40s": (362.0, 183.0, 91.6),
    "l40": (181.0, 90.5, 90.5),
    "l4": (121.0, 60.0, 30.3),
    "v100": (125.0, 15.7, 15.7),
    "t4": (65.0, 8.1, 8.1),  # fp16 tensor cores; no bf16/tf32
    "rtx 4090": (165.2, 82.6, 82.6),
    "rtx 3090": (71.0, 35.6, 35.6),
    "rtx a6000": (154.8, 77.4, 38.7),
}


def peak_tflops(device_name: str | None, precision: str, tf32: bool) -> float | None:
    """Peak dense TFLOP/s of one device at a precision, or None (CPU or unknown GPU)."""
    name = (device_name or "").lower()
    key = next((k for k in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True) if k in name), None)
    if key is None:
        return None
    half, tf32_peak, fp32 = GPU_PEAK_TFLOPS[key]
    return half if precision in ("bf16", "fp16") else tf32_peak if tf32 else fp32


def train_flops_per_sequence(lengths: np.ndarray, n_params: int, layers: int, hidden: int) -> np.ndarray:
    """Forward + backward model FLOPs of each sequence of real length s: 6*N*s + 12*L*H*s^2 (N non-embedding
    parameters through the weights, L layers x H hidden for the attention scores)."""
    s = lengths.astype(np.float64)
    return 6.0 * n_params * s + 12.0 * layers * hidden * s * s


def train_efficiency(
    lengths: np.ndarray,
    epochs: float,
    runtime_s: float,
    shape: ModelShape,
    device_name: str,
    n_devices: int,
    precision: str,
    tf32: bool,
) -> dict[str, float | int | str]:
    """What `epochs` passes over features of real `lengths` in `runtime_s` seconds achieved, per second and
    against the summed peak of the devices (train_peak_tflops and train_mfu left out where there is none)."""
    per_epoch = float(
        train_flops_per_sequence(lengths, shape.non_embedding_params, shape.layers, shape.hidden).sum()
    )
    flops = per_epoch * epochs
    runtime_s = max(runtime_s, 1e-9)  # a run too short for the clock: no division by zero
    tokens = int(round(float(lengths.sum()) * epochs))
    achieved = flops / runtime_s / 1e12
    peak = (peak_tflops(device_name, precision, tf32) or 0.0) * n_devices
    return {
        "train_real_tokens": tokens,
        "train_tokens_per_second": tokens / runtime_s,
        "train_model_tflop": flops / 1e12,  # total useful model FLOPs
        "train_achieved_tflops": achieved,  # TFLOP/s over the whole job
        **({"train_peak_tflops": peak, "train_mfu": achieved / peak} if peak else {}),
        "device_name": device_name,
        "n_devices": n_devices,
        "precision": precision,
    }
