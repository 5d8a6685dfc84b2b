"""SQuAD v1.1 and v2.0 scoring, numerically identical to the official scripts.

Why our own scorer: the training loop (through the `evaluate` modules beside this file),
the CLI and the benchmarks must all report exactly the numbers that ``evaluate-v1.1.py`` /
``evaluate-v2.0.py`` would, without depending on a downloaded metric at run time. Every
quirk of the official scripts that changes a number is reproduced on purpose and called
out in a comment; the only deliberate departure is that questions without a prediction
score 0 and stay in every denominator (v1 does this officially; v2 officially crashes
instead).

This module is the public face: v1.1 scoring and the id checks live here, v2.0 scoring
in squad_v2, what both share in squad_common. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qa_hpc.metric.squad_common import (
    json_type_name,
    normalize_answer,
    prediction_text,
    require_questions,
    token_f1,
)
from qa_hpc.metric.squad_v2 import exact_match_v2, f1_v2, gold_answers_v2, score_v2

__all__ = [
    "normalize_answer",
    "exact_match_v1",
    "f1_v1",
    "score_v1",
    "exact_match_v2",
    "f1_v2",
    "gold_answers_v2",
    "score_v2",
    "missing_ids",
    "unknown_ids",
    "json_type_name",
]

# --------------------------------------------------------------------------- v1.1


def exact_match_v1(prediction: str, ground_truth: str) -> bool:
    """Official v1.1 exact match: equal after normalization (empty == empty)."""
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_v1(prediction: str, ground_truth: str) -> float:
    """Official v1.1 token F1.

    No overlap means 0 -- including when both sides normalize to nothing, so
    ("", "the") has exact match True but F1 0.0, as in the official script.
    """
    return token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def score_v1(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> dict[str, float]:
    """Official v1.1 corpus score: ``{"exact_match": %, "f1": %}``.

    Each question takes the max over its gold answers. The denominator is every
    reference id; ids absent from ``predictions`` add 0 (see ``missing_ids``).
    Prediction ids not in ``references`` are ignored (see ``unknown_ids``).
    Raises ValueError for an empty reference set or a question with no gold
    answers (the official script would crash on ``max([])``; such data is
    SQuAD 2.0 and belongs to ``score_v2``).
    """
    require_questions(references)
    _require_gold_answers(references)
    # Accumulate in reference order starting from int 0, like the official loop,
    # so that the float sums are bitwise identical.
    exact_total: float = 0
    f1_total: float = 0
    for qid, golds in references.items():
        if qid not in predictions:
            continue
        # Normalize each string once; same values as exact_match_v1 / f1_v1.
        pred_norm = normalize_answer(prediction_text(qid, predictions[qid]))
        pred_tokens = pred_norm.split()
        gold_norms = [normalize_answer(gold) for gold in golds]
        exact_total += max(pred_norm == gold_norm for gold_norm in gold_norms)
        f1_total += max(token_f1(pred_tokens, gold_norm.split()) for gold_norm in gold_norms)
    count = len(references)
    return {"exact_match": 100.0 * exact_total / count, "f1": 100.0 * f1_total / count}


def _require_gold_answers(references: Mapping[str, Sequence[str]]) -> None:
    """v1.1 needs a gold answer per question (official: ``max([])`` crashes)."""
    empty = [qid for qid, golds in references.items() if not golds]
    if empty:
        raise ValueError(
            f"{len(empty)} question(s) have no gold answers (first: {empty[0]!r}); "
            "SQuAD v1.1 scoring needs at least one -- use score_v2 for SQuAD 2.0 data"
        )


# --------------------------------------------------------------------------- ids


def missing_ids(references: Mapping[str, Any], predictions: Mapping[str, Any]) -> list[str]:
    """Reference ids without a prediction (they score 0), in reference order."""
    return [qid for qid in references if qid not in predictions]


def unknown_ids(references: Mapping[str, Any], predictions: Mapping[str, Any]) -> list[str]:
    """Prediction ids that are not questions of the dataset, in prediction order.

    The scores ignore them, but they usually mean the wrong dataset file.
    """
    return [qid for qid in predictions if qid not in references]
