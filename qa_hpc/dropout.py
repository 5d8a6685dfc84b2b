"""Dropout with masks drawn in bulk, for CPUs where torch's own mask is drawn one element at a time.

On a CPU, torch's `bernoulli_` is parallel only on Intel CPUs; elsewhere its serial draws are a large share
of a BERT training step. Here one 64-bit word from torch's generator gives four 16-bit lanes: a quarter of
the draws, the same drop probability to 1/65536 and 1/(1-p) scaling, reproducible under `--seed`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION_NAME = "sdpa_bulk_dropout"
# 16-bit lanes: p is honoured to 1/65536
LANES = 65536


class _BulkDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:  # type: ignore[override]
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device).random_(
            -(2**63), 2**63 - 1
        )
        lanes = words.view(torch.int16)[: x.numel()].view(x.shape)
        # a uniform 16-bit lane falls below the threshold with probability p
        keep = lanes >= round(p * LANES) - LANES // 2
        # as bools, as native_dropout keeps its own
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return (x * keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None


def bulk_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    return _BulkDropout.apply(x, p)


class BulkDropout(nn.Dropout):
    """`nn.Dropout` with the bulk mask; same `p`, same place in the model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bulk_dropout(x, self.p, self.training)


def attention_with_bulk_dropout(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """BERT's attention: SDPA when nothing is dropped, else the explicit product with the bulk mask."""
    if dropout == 0.0 or not module.training:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=0.0, scaling=scaling, **kwargs
        )
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling or query.size(-1) ** -0.5)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = bulk_dropout(torch.softmax(scores, dim=-1), dropout, True)
    return torch.matmul(probs.to(value.dtype), value).transpose(1, 2).contiguous(), None


def install(model: nn.Module) -> int:
    """Swap every `nn.Dropout` for a bulk one and route attention through ATTENTION_NAME; returns the
    count."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, attention_with_bulk_dropout)
    # a name transformers does not know gets no padding mask at all: ask for the additive one eager
    # attention gets
    AttentionMaskInterface.register(ATTENTION_NAME, AttentionMaskInterface()["eager"])
    swapped = 0
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, BulkDropout(child.p).train(child.training))
                swapped += 1
    model.set_attn_implementation(ATTENTION_NAME)
    return swapped
