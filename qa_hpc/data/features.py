"""Features for extractive question answering: a question and a long context become token windows.

A question and a long context become several windows of at most `max_seq_length`
tokens that overlap by `doc_stride`. Train windows are labelled with the answer's
token span when they hold the whole answer, and with the CLS token otherwise. Eval
windows keep character offsets (None outside the context) and the id of the example
they came from, so logits can be turned back into text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qa_hpc.errors import UsageError


class FeatureError(UsageError):
    """A record cannot be turned into features (names the record and the field)."""


@dataclass(frozen=True)
class FeatureConfig:
    """How examples are cut into windows."""

    max_seq_length: int = 384
    doc_stride: int = 128
    pad_to_max_length: bool = False
    source: str = "data"  # file name or dataset name, for error messages


def _question_first(tokenizer: Any) -> bool:
    """BERT-style tokenizers pad on the right and take the question first."""
    return tokenizer.padding_side == "right"


def check_question_lengths(examples: Mapping[str, list], tokenizer: Any, cfg: FeatureConfig) -> None:
    """Fail with the record's id when a question leaves no room for its context.

    The fast tokenizer would otherwise raise an opaque truncation error from Rust.
    Room for context = max_seq_length - question tokens - special tokens, and it
    must exceed doc_stride for the windows to advance.
    """
    special = tokenizer.num_special_tokens_to_add(pair=True)
    encoded = tokenizer(examples["question"], add_special_tokens=False)["input_ids"]
    for qid, ids in zip(examples["id"], encoded):
        room = cfg.max_seq_length - len(ids) - special
        if room <= cfg.doc_stride:
            raise FeatureError(
                f"{cfg.source}: record id={qid!r}: field 'question' has {len(ids)} tokens, leaving {room} "
                f"for the context at --max_seq_length {cfg.max_seq_length} (needs more than --doc_stride "
                f"{cfg.doc_stride}); shorten the question, raise --max_seq_length or lower --doc_stride"
            )


def _tokenize(examples: Mapping[str, list], tokenizer: Any, cfg: FeatureConfig) -> Any:
    check_question_lengths(examples, tokenizer, cfg)
    questions = [q.lstrip() for q in examples["question"]]
    first, second = (questions, examples["context"]) if _question_first(tokenizer) else (examples["context"], questions)
    return tokenizer(
        first,
        second,
        truncation="only_second" if _question_first(tokenizer) else "only_first",
        max_length=cfg.max_seq_length,
        stride=cfg.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if cfg.pad_to_max_length else False,
    )


def prepare_train_features(examples: Mapping[str, list], tokenizer: Any, cfg: FeatureConfig) -> dict[str, list]:
    """Tokenize a batch of examples into labelled training windows."""
    tokenized = _tokenize(examples, tokenizer, cfg)
    sample_map = tokenized.pop("overflow_to_sample_mapping")
    offsets_all = tokenized.pop("offset_mapping")
    context_index = 1 if _question_first(tokenizer) else 0
    starts: list[int] = []
    ends: list[int] = []
    for i, offsets in enumerate(offsets_all):
        input_ids = tokenized["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
        sequence_ids = tokenized.sequence_ids(i)
        answers = examples["answers"][sample_map[i]]
        if not answers["answer_start"]:
            starts.append(cls_index)
            ends.append(cls_index)
            continue
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        token_start = 0
        while sequence_ids[token_start] != context_index:
            token_start += 1
        token_end = len(input_ids) - 1
        while sequence_ids[token_end] != context_index:
            token_end -= 1
        if not (offsets[token_start][0] <= start_char and offsets[token_end][1] >= end_char):
            starts.append(cls_index)
            ends.append(cls_index)
            continue
        while token_start < len(offsets) and sequence_ids[token_start] == context_index and offsets[token_start][0] <= start_char:
            token_start += 1
        while sequence_ids[token_end] == context_index and offsets[token_end][1] >= end_char:
            token_end -= 1
        starts.append(token_start - 1)
        ends.append(token_end + 1)
    tokenized["start_positions"] = starts
    tokenized["end_positions"] = ends
    return dict(tokenized)


def prepare_validation_features(
    examples: Mapping[str, list], tokenizer: Any, cfg: FeatureConfig
) -> dict[str, list]:
    """Tokenize a batch of examples into eval windows that remember offsets and their example."""
    tokenized = _tokenize(examples, tokenizer, cfg)
    sample_map = tokenized.pop("overflow_to_sample_mapping")
    context_index = 1 if _question_first(tokenizer) else 0
    example_ids: list[str] = []
    offsets_out: list[list] = []
    for i, offsets in enumerate(tokenized["offset_mapping"]):
        sequence_ids = tokenized.sequence_ids(i)
        example_ids.append(examples["id"][sample_map[i]])
        offsets_out.append([o if sequence_ids[k] == context_index else None for k, o in enumerate(offsets)])
    tokenized["example_id"] = example_ids
    tokenized["offset_mapping"] = offsets_out
    return dict(tokenized)


def real_lengths(features: Any) -> np.ndarray:
    """Real (unpadded) token count of every feature: its attention mask's sum."""
    try:
        import pyarrow.compute as pc

        masks = features.with_format("arrow")["attention_mask"]
        masks = masks.combine_chunks() if hasattr(masks, "combine_chunks") else masks
        flat = pc.list_flatten(masks).to_numpy(zero_copy_only=False)
        sizes = pc.list_value_length(masks).to_numpy(zero_copy_only=False).astype(np.int64)
    except (AttributeError, KeyError, TypeError):
        rows: Sequence[Sequence[int]] = features["attention_mask"]
        return np.array([int(sum(r)) for r in rows], dtype=np.int64)
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    sums = np.add.reduceat(flat, starts) if len(flat) else np.zeros(len(sizes))
    return np.where(sizes > 0, sums, 0).astype(np.int64)
