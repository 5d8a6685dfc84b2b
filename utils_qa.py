"""Features and postprocessing for extractive question answering.

Features: a question and a long context become several windows of at most
`max_seq_length` tokens that overlap by `doc_stride`. Train windows are labelled
with the answer's token span when they hold the whole answer, and with the CLS
token otherwise. Eval windows keep character offsets (None outside the context)
and the id of the example they came from, so logits can be turned back into text.

Postprocessing: the straightforward per-feature loop below is the reference; a
faster implementation must return exactly its answers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomic_io import json_text, write_text_atomic
from nbest_table import nbest_json

logger = logging.getLogger(__name__)


class FeatureError(ValueError):
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


@dataclass(frozen=True)
class PostprocessConfig:
    """How logits become answers."""

    version_2_with_negative: bool = False
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0


@dataclass
class QAPredictions:
    """Answers per example id, their n-best lists, and (v2) null-score differences."""

    answers: dict[str, str]
    nbest: Mapping[str, list[dict]]  # a dict from the loop, an nbest_table.NBestTable from the vectorized path
    null_odds: dict[str, float] | None


def _softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores - np.max(scores))
    return exp / exp.sum()


def features_by_example(example_ids: Sequence[str], feature_example_ids: Sequence[str]) -> list[list[int]]:
    """Feature indices of each example, in example order; raises if a feature's example is unknown."""
    index = {eid: i for i, eid in enumerate(example_ids)}
    grouped: list[list[int]] = [[] for _ in example_ids]
    for f, eid in enumerate(feature_example_ids):
        if eid not in index:
            raise ValueError(f"feature {f} belongs to unknown example id {eid!r}")
        grouped[index[eid]].append(f)
    return grouped


def postprocess_qa_predictions_loop(
    examples: Mapping[str, Sequence],
    features: Mapping[str, Sequence],
    predictions: tuple[np.ndarray, np.ndarray],
    cfg: PostprocessConfig,
) -> QAPredictions:
    """Reference postprocessing: per example, per feature, try the top start x end candidates.

    A span is valid when both ends are context tokens, end >= start, and it is at most
    max_answer_length tokens long. Logits past a feature's length (the -100 padding
    that the Trainer adds when batches have different lengths) are never chosen.
    """
    start_logits, end_logits = predictions
    if len(start_logits) != len(features["example_id"]):
        raise ValueError(f"got {len(start_logits)} logit rows for {len(features['example_id'])} features")
    grouped = features_by_example(examples["id"], features["example_id"])
    answers: dict[str, str] = {}
    nbest_all: dict[str, list[dict]] = {}
    null_odds: dict[str, float] = {}
    for ex_idx, feature_indices in enumerate(grouped):
        qid = examples["id"][ex_idx]
        context = examples["context"][ex_idx]
        min_null: float | None = None
        prelim: list[dict] = []
        for f in feature_indices:
            s_logits, e_logits = start_logits[f], end_logits[f]
            offsets = features["offset_mapping"][f]
            null_score = float(s_logits[0] + e_logits[0])
            if min_null is None or null_score < min_null:
                min_null = null_score
            start_idx = np.argsort(s_logits)[-1 : -cfg.n_best_size - 1 : -1]
            end_idx = np.argsort(e_logits)[-1 : -cfg.n_best_size - 1 : -1]
            for s in start_idx:
                for e in end_idx:
                    if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                        continue
                    if e < s or e - s + 1 > cfg.max_answer_length:
                        continue
                    prelim.append(
                        {
                            "offsets": (offsets[s][0], offsets[e][1]),
                            "score": float(s_logits[s] + e_logits[e]),
                            "start_logit": float(s_logits[s]),
                            "end_logit": float(e_logits[e]),
                        }
                    )
        nbest = sorted(prelim, key=lambda p: p["score"], reverse=True)[: cfg.n_best_size]
        if cfg.version_2_with_negative and min_null is not None:
            null_pred = {"offsets": (0, 0), "score": min_null, "start_logit": None, "end_logit": None, "null": True}
            nbest = sorted(nbest + [null_pred], key=lambda p: p["score"], reverse=True)[: cfg.n_best_size]
            if not any(p.get("null") for p in nbest):
                nbest.append(null_pred)
        for p in nbest:
            p["text"] = "" if p.get("null") else context[p["offsets"][0] : p["offsets"][1]]
        if not nbest:
            nbest = [{"offsets": (0, 0), "text": "", "score": 0.0, "start_logit": 0.0, "end_logit": 0.0}]
        probs = _softmax(np.array([p["score"] for p in nbest], dtype=np.float64))
        for p, prob in zip(nbest, probs):
            p["probability"] = float(prob)
        if cfg.version_2_with_negative:
            spans = [p for p in nbest if not p.get("null")]
            if spans and min_null is not None:
                best = spans[0]
                diff = float(min_null - best["start_logit"] - best["end_logit"])
                null_odds[qid] = diff
                answers[qid] = "" if diff > cfg.null_score_diff_threshold else best["text"]
            else:
                null_odds[qid] = 0.0 if min_null is None else float(min_null)
                answers[qid] = ""
        else:
            answers[qid] = nbest[0]["text"]
        nbest_all[qid] = [
            {k: p[k] for k in ("text", "probability", "score", "start_logit", "end_logit")} for p in nbest
        ]
    return QAPredictions(answers, nbest_all, null_odds if cfg.version_2_with_negative else None)


PostprocessFn = Callable[
    [Mapping[str, Sequence], Mapping[str, Sequence], tuple[np.ndarray, np.ndarray], PostprocessConfig], QAPredictions
]


def write_prediction_files(preds: QAPredictions, output_dir: str, prefix: str) -> list[str]:
    """Write {prefix}_predictions.json, _nbest_predictions.json and (v2) _null_odds.json atomically."""
    os.makedirs(output_dir, exist_ok=True)
    written = []
    # serialized before anything is written, so a bad value leaves no file behind
    texts: list[tuple[str, str]] = [
        (f"{prefix}_predictions.json", json_text(preds.answers)),
        (f"{prefix}_nbest_predictions.json", nbest_json(preds.nbest, indent=2) + "\n"),  # fast for NBestTable
    ]
    if preds.null_odds is not None:
        texts.append((f"{prefix}_null_odds.json", json_text(preds.null_odds)))
    for name, text in texts:
        path = os.path.join(output_dir, name)
        write_text_atomic(path, text)
        written.append(path)
    logger.info("wrote %s", ", ".join(written))
    return written


def load_predictions(path: str) -> dict[str, str]:
    """Read a predictions file written by write_prediction_files."""
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def count_tokens(input_ids: Sequence[Sequence[int]], padded_to: int | None = None) -> tuple[int, int]:
    """(real tokens, tokens after padding every feature to `padded_to`) for logging padding waste."""
    real = sum(len(ids) for ids in input_ids)
    padded = real if padded_to is None else padded_to * len(input_ids)
    return real, padded


def answers_by_id(examples: Mapping[str, Sequence]) -> dict[str, list[str]]:
    """Gold answer texts per id, for scoring."""
    return {qid: list(ans["text"]) for qid, ans in zip(examples["id"], examples["answers"])}


__all__ = [
    "FeatureConfig",
    "FeatureError",
    "PostprocessConfig",
    "QAPredictions",
    "prepare_train_features",
    "prepare_validation_features",
    "postprocess_qa_predictions_loop",
    "write_prediction_files",
    "answers_by_id",
    "count_tokens",
    "features_by_example",
]
