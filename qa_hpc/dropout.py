"""Dropout with masks drawn in bulk, for CPUs where torch's own mask is drawn one element at a time.

Why: on a CPU, torch's `bernoulli_` (behind `nn.Dropout`, `F.dropout` and SDPA's dropout) takes a
parallel generator only on Intel CPUs; elsewhere it draws one double per element, serially, which is a
large share of a BERT training step (the attention probabilities alone are batch x heads x len x len).
Here one 64-bit word from torch's own generator gives four 16-bit lanes, and a lane below
round(p * 65536) drops its element: a quarter of the draws, the same drop probability to 1/65536,
the same 1/(1-p) scaling, reproducible under `torch.manual_seed` (the Trainer's `--seed`).
The mask is kept as bools for backward, as `native_dropout` keeps its own.

`install(model)` swaps every `nn.Dropout` of the model (embeddings, hidden states, classifier) and
routes attention through `ATTENTION_NAME`, which applies the same mask to the attention
probabilities; evaluation (no dropout) and GPUs are untouched.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION_NAME = "sdpa_bulk_dropout"
LANES = 65536  # 16-bit lanes: p is honoured to 1/65536


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """Bool mask, True where an element is kept (probability 1 - p)."""
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), 2**63 - 1)
    lanes = words.view(torch.int16)[:n].view(shape)
    return lanes >= round(p * LANES) - LANES // 2


class _BulkDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:  # type: ignore[override]
        keep = keep_mask(x.shape, p, x.device)
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


def attention_with_bulk_dropout(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                attention_mask: torch.Tensor | None, scaling: float | None = None,
                                dropout: float = 0.0, **kwargs: object) -> tuple[torch.Tensor, None]:
    """BERT's attention: SDPA when nothing is dropped, else the explicit product with the bulk mask."""
    if dropout == 0.0 or not module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling, **kwargs)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling or query.size(-1) ** -0.5)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = bulk_dropout(torch.softmax(scores, dim=-1), dropout, True)
    return torch.matmul(probs.to(value.dtype), value).transpose(1, 2).contiguous(), None


def install(model: nn.Module) -> int:
    """Swap the model's dropouts for bulk ones; returns how many modules were swapped."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(ATTENTION_NAME, attention_with_bulk_dropout)
    # a name transformers does not know gets no padding mask at all: ask for the additive one eager attention gets
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, eager_mask)
    swapped = 0
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, BulkDropout(child.p).train(child.training))
                swapped += 1
    model.set_attn_implementation(ATTENTION_NAME)
    return swapped
