"""Which kernels torch's scaled_dot_product_attention (SDPA) may run: --attn_backend, as names.

torch keeps one switch per kernel for the whole process (torch.backends.cuda.enable_*_sdp; the CPU's SDPA
reads the flash and math ones too) and picks the first enabled kernel of its priority order that can take the
inputs. qa_hpc.plan decides the set; `apply` sets it once, before the model is built; `enabled` reads it back.
`mask_every_batch` gives SDPA the padding mask of a batch without padding too (compiled in regions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# Our names -> torch's switch and its read-back, in the order the names are written
SDP = torch.backends.cuda
SWITCHES: dict[str, tuple[Callable[[bool], None], Callable[[], bool]]] = {
    "flash": (SDP.enable_flash_sdp, SDP.flash_sdp_enabled),
    "efficient": (SDP.enable_mem_efficient_sdp, SDP.mem_efficient_sdp_enabled),
    "cudnn": (SDP.enable_cudnn_sdp, SDP.cudnn_sdp_enabled),
    "math": (SDP.enable_math_sdp, SDP.math_sdp_enabled),
}
ALL = "all"  # every kernel enabled: torch's own choice
NOT_SDPA = "n/a"  # the model's attention does not go through SDPA (eager, flex_attention, a FlashAttention)
CPU_KERNELS = ("flash", "math")  # the only SDPA kernels torch has on a CPU
# transformers' SDPA attention, given the padding mask for every batch (`mask_every_batch`)
ALWAYS_MASKED = "sdpa_always_masked"
# attention implementations of transformers (and qa_hpc's) that call SDPA
SDPA_IMPLEMENTATIONS = ("sdpa", "sdpa_bulk_dropout", ALWAYS_MASKED)


def parse(text: str) -> tuple[str, ...]:
    """Comma-separated kernel names -> the names in SWITCHES order; ValueError naming the choices."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in SWITCHES]
    if unknown:
        raise ValueError(
            f"--attn_backend {text}: give auto, all, or comma-separated kernels from {', '.join(SWITCHES)} "
            f"(unknown: {', '.join(unknown)})"
        )
    return tuple(name for name in SWITCHES if name in names)


def name_of(kernels: tuple[str, ...]) -> str:
    """How PLAN and EFFECTIVE write a set of enabled kernels."""
    return ALL if set(kernels) == set(SWITCHES) else ",".join(kernels)


def apply(backend: str) -> None:
    """Enable exactly the kernels `backend` names (ALL: every one); NOT_SDPA leaves torch as it is."""
    if backend == NOT_SDPA:
        return
    wanted = tuple(SWITCHES) if backend == ALL else parse(backend)
    for name, (enable, _) in SWITCHES.items():
        enable(name in wanted)


def enabled(attn_implementation: str | None) -> str:
    """What SDPA may run now, as PLAN writes it; NOT_SDPA for a model whose attention does not call SDPA."""
    if attn_implementation not in SDPA_IMPLEMENTATIONS:
        return NOT_SDPA
    return name_of(tuple(name for name, (_, is_enabled) in SWITCHES.items() if is_enabled()))


def mask_every_batch(model: nn.Module) -> bool:
    """Route `model`'s SDPA attention through ALWAYS_MASKED: the same kernels, the padding mask built for
    every batch. transformers checks each batch for padding on the host (`padding_mask.all()`: on a GPU a
    wait for the queued work) and gives SDPA no mask where there is none; under --compile_scope regions that
    check runs eagerly between the compiled layers, so every step would wait there, and the layers would
    compile a second graph for the batches without a mask. True when routed; a model with another attention
    (eager, flash_attention_2, bulk dropout's) keeps its own: False."""
    from transformers import AttentionInterface, AttentionMaskInterface

    if model.config._attn_implementation != "sdpa":
        return False
    sdpa_mask = AttentionMaskInterface()["sdpa"]

    def padding_mask_always(*args: Any, **kwargs: Any) -> torch.Tensor | None:
        return sdpa_mask(*args, **{**kwargs, "allow_is_bidirectional_skip": False})

    AttentionInterface.register(ALWAYS_MASKED, AttentionInterface()["sdpa"])
    AttentionMaskInterface.register(ALWAYS_MASKED, padding_mask_always)
    model.set_attn_implementation(ALWAYS_MASKED)
    return True
