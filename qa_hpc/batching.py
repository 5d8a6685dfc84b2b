"""How a batch of features is padded: to its longest feature (a multiple of 8), to --max_seq_length, or to the
smallest of a few fixed widths that holds it (--pad_to_buckets).

Fixed widths bound the batch shapes one pass over a split can have: a compiled graph, a cuDNN attention plan
or a CUDA graph is built once per shape, and dynamic padding brings a new shape for almost every batch. Only
the width is padded, never the batch dimension: the batch size stays as asked (the last batch of a pass may
be short, the "+1" shape), and every row keeps its own real tokens, so no row is all padding (SDPA returns
NaN for a row whose every key is masked). Training in buckets is dynamic padding's training, shape aside: the
span loss is taken over the positions dynamic padding would have given the batch (`span_loss`), since BERT's
loss is a softmax over every position of the row, padding included.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.functional import cross_entropy

# transformers' collators are imported where a collator is built: the plan reads the widths here, and
# `python -m qa_hpc.plan --machine` (every bench script, job_ddp.sh) should not load transformers for that
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_BUCKETS = 5  # widths of `--pad_to_buckets on`
WIDTH_MULTIPLE = 8  # tensor cores want multiples of 8; dynamic padding rounds to it too
LOSS_WIDTH = "loss_width"  # a training batch's key: the width dynamic padding would have given it
Collator = Callable[[list[dict[str, Any]]], dict[str, Any]]


def default_buckets(max_seq_length: int) -> tuple[int, ...]:
    """`--pad_to_buckets on`: DEFAULT_BUCKETS widths evenly spaced from a third of max_seq_length to
    max_seq_length, each rounded up to a multiple of 8 (384: 128,192,256,320,384; 128: 48,64,88,112,128),
    none wider than max_seq_length (30: 16,24,30)."""
    lowest = max_seq_length / 3
    step = (max_seq_length - lowest) / (DEFAULT_BUCKETS - 1)
    widths = {min(round_up(lowest + i * step), max_seq_length) for i in range(DEFAULT_BUCKETS - 1)}
    return tuple(sorted(widths | {max_seq_length}))


def round_up(width: float) -> int:
    """The width a batch whose longest row is `width` is padded to: the next multiple of WIDTH_MULTIPLE."""
    return math.ceil(round(width, 6) / WIDTH_MULTIPLE) * WIDTH_MULTIPLE


def parse_buckets(text: str, max_seq_length: int) -> tuple[int, ...]:
    """--pad_to_buckets off|on|LIST -> the widths (empty: off); ValueError saying what a LIST must be."""
    if text == "off":
        return ()
    if text == "on":
        return default_buckets(max_seq_length)
    rule = (
        f"--pad_to_buckets {text}: give auto, off, on, or comma-separated widths, each a multiple of "
        f"{WIDTH_MULTIPLE} but the largest, ascending, the largest equal to --max_seq_length "
        f"({max_seq_length})"
    )
    words = text.split(",")
    if not all(word.strip().isdigit() for word in words):
        raise ValueError(rule)
    widths = tuple(int(word) for word in words)
    ascending = all(a < b for a, b in zip(widths, widths[1:]))
    # the largest is --max_seq_length, whatever it is (the rule of the widths below it: kernels like them)
    multiples = all(width > 0 and width % WIDTH_MULTIPLE == 0 for width in widths[:-1])
    if not (ascending and multiples and widths[-1] == max_seq_length):
        raise ValueError(rule)
    return widths


def smallest_bucket(widths: tuple[int, ...], longest: int) -> int:
    """The narrowest of the ascending `widths` that holds a feature of `longest` tokens."""
    for width in widths:
        if width >= longest:
            return width
    raise ValueError(f"a feature of {longest} tokens is longer than the widest bucket ({widths[-1]})")


class BucketCollator:
    """Pads each batch to the smallest width that holds its longest feature (the widths end at max_seq_length,
    which every feature fits); the rows are the batch's own, none added."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, widths: tuple[int, ...]) -> None:
        from transformers import DataCollatorWithPadding

        self.widths = widths
        self._by_width = {
            width: DataCollatorWithPadding(tokenizer, padding="max_length", max_length=width)
            for width in widths
        }

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        longest = max(len(feature["input_ids"]) for feature in features)
        batch = self._by_width[smallest_bucket(self.widths, longest)](features)
        if "start_positions" in batch:  # training: the loss keeps to dynamic padding's width (span_loss)
            batch[LOSS_WIDTH] = round_up(longest)
        return batch


def span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """BERT's QA loss (BertForQuestionAnswering: the mean of the start and end cross-entropies, a position
    past the row ignored) over the first `width` positions only: a bucket's extra padding takes no share of
    the softmax, so the loss, and its gradients, are those of the batch padded to `width`."""
    start_logits = start_logits[:, :width]
    end_logits = end_logits[:, :width]
    start_loss = cross_entropy(start_logits, start_positions.clamp(0, width), ignore_index=width)
    end_loss = cross_entropy(end_logits, end_positions.clamp(0, width), ignore_index=width)
    return (start_loss + end_loss) / 2


def make_collator(
    tokenizer: PreTrainedTokenizerBase, buckets: tuple[int, ...], pad_to_max_length: bool
) -> Collator:
    """The collator of every split: features already padded to max_seq_length are stacked as they are; else
    each batch is padded to a bucket, or (no buckets) to its longest feature rounded up to a multiple of 8."""
    from transformers import DataCollatorWithPadding, default_data_collator

    if pad_to_max_length:
        return default_data_collator
    if tokenizer.padding_side != "right":
        # rows padded last, as the features are (qa_hpc.features): a model whose tokenizer pads on the left
        # (XLNet) would have its positions shifted by its batch's padding, and its answers read elsewhere
        tokenizer = copy.copy(tokenizer)
        tokenizer.padding_side = "right"
    if buckets:
        return BucketCollator(tokenizer, buckets)
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=WIDTH_MULTIPLE)


def buckets_of(collator: Collator) -> tuple[int, ...]:
    """The widths a collator pads to (empty: not a bucket collator): what EFFECTIVE reads back."""
    return collator.widths if isinstance(collator, BucketCollator) else ()
