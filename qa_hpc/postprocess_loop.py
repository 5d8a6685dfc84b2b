"""Reference postprocessing: logits -> answers by the straightforward per-feature loop (`--postprocess loop`).

This loop is the definition of the answers; qa_hpc.postprocess must return exactly what it returns, sooner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


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
    nbest: Mapping[
        str, list[dict]
    ]  # per example id: text, probability, score, start_logit, end_logit; best first
    null_odds: dict[str, float] | None


def example_of_features(
    example_ids: Sequence[str], feature_example_ids: Sequence[str], logit_rows: int
) -> list[int]:
    """The example index of every feature (a repeated id: its last place); the input checks of both paths."""
    if logit_rows != len(feature_example_ids):
        raise ValueError(f"got {logit_rows} logit rows for {len(feature_example_ids)} features")
    index = {eid: i for i, eid in enumerate(example_ids)}
    for f, eid in enumerate(feature_example_ids):
        if eid not in index:
            raise ValueError(f"feature {f} belongs to unknown example id {eid!r}")
    return [index[eid] for eid in feature_example_ids]


def postprocess_qa_predictions_loop(
    examples: Mapping[str, Sequence],
    features: Mapping[str, Sequence],
    predictions: tuple[np.ndarray, np.ndarray],
    cfg: PostprocessConfig,
) -> QAPredictions:
    """Reference postprocessing: per example, per feature, try the top start x end candidates.

    A span is valid when both ends are context tokens, end >= start, and it is at most max_answer_length tokens
    long. Positions past a feature's offsets (the Trainer's -100 padding of shorter rows) are never chosen.
    """
    start_logits, end_logits = predictions
    grouped: list[list[int]] = [[] for _ in examples["id"]]
    for f, ex in enumerate(example_of_features(examples["id"], features["example_id"], len(start_logits))):
        grouped[ex].append(f)
    answers: dict[str, str] = {}
    nbest_all: dict[str, list[dict]] = {}
    null_odds: dict[str, float] = {}
    for ex_idx, feature_indices in enumerate(grouped):
        qid, context = examples["id"][ex_idx], examples["context"][ex_idx]
        min_null: float | None = None
        prelim: list[dict] = []
        for f in feature_indices:
            s_logits, e_logits, offsets = start_logits[f], end_logits[f], features["offset_mapping"][f]
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
            null_pred = {
                "offsets": (0, 0),
                "score": min_null,
                "start_logit": None,
                "end_logit": None,
                "null": True,
            }
            nbest = sorted(nbest + [null_pred], key=lambda p: p["score"], reverse=True)[: cfg.n_best_size]
            if not any(p.get("null") for p in nbest):
                nbest.append(null_pred)
        for p in nbest:
            p["text"] = "" if p.get("null") else context[p["offsets"][0] : p["offsets"][1]]
        if not nbest:
            nbest = [{"offsets": (0, 0), "text": "", "score": 0.0, "start_logit": 0.0, "end_logit": 0.0}]
        scores = np.array([p["score"] for p in nbest], dtype=np.float64)
        exp = np.exp(scores - np.max(scores))
        for p, prob in zip(nbest, exp / exp.sum()):
            p["probability"] = float(prob)
        if cfg.version_2_with_negative:
            spans = [p for p in nbest if not p.get("null")]
            if spans and min_null is not None:
                null_odds[qid] = float(min_null - spans[0]["start_logit"] - spans[0]["end_logit"])
                answers[qid] = "" if null_odds[qid] > cfg.null_score_diff_threshold else spans[0]["text"]
            else:
                null_odds[qid] = 0.0 if min_null is None else float(min_null)
                answers[qid] = ""
        else:
            answers[qid] = nbest[0]["text"]
        nbest_all[qid] = [
            {k: p[k] for k in ("text", "probability", "score", "start_logit", "end_logit")} for p in nbest
        ]
    return QAPredictions(answers, nbest_all, null_odds if cfg.version_2_with_negative else None)
