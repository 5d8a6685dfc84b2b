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
    nbest: Mapping[str, list[dict]]  # per example id: text, probability, score, start_logit, end_logit; best first
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
