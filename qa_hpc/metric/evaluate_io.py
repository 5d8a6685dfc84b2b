"""The inputs of the `evaluate` SQuAD metrics, both ways: run_qa's answers -> rows, rows -> our scorer's maps.

The schema is the hub's `squad` / `squad_v2` one, so either those metrics or ours
(qa_hpc/metric/evaluate_squad_v1, evaluate_squad_v2) take what run_qa sends:

    predictions: [{"id", "prediction_text"(, "no_answer_probability")}]
    references:  [{"id", "answers": {"text": [...], "answer_start": [...]}}]

One departure: "no_answer_probability" is float64 here (the hub declares float32).
run_qa passes null-score differences, and rounding them to float32 would move the
threshold decisions and best_*_thresh away from what score_squad.py computes from the
eval_null_odds.json written beside the predictions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import datasets

PREDICTION_FIELDS_V1 = ("id", "prediction_text")
PREDICTION_FIELDS_V2 = (*PREDICTION_FIELDS_V1, "no_answer_probability")
REFERENCE_FIELDS = ("id", "answers")

_REFERENCES = {
    "id": datasets.Value("string"),
    "answers": {"text": datasets.List(datasets.Value("string")),
                "answer_start": datasets.List(datasets.Value("int32"))},
}
FEATURES_V1 = datasets.Features({
    "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
    "references": _REFERENCES,
})
FEATURES_V2 = datasets.Features({
    "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string"),
                    "no_answer_probability": datasets.Value("float64")},
    "references": _REFERENCES,
})


def metric_inputs(answers: Mapping[str, str], null_odds: Mapping[str, float] | None, ids: Sequence[str],
                  golds: Sequence[Mapping[str, Any]]) -> tuple[list[dict], list[dict]]:
    """(predictions, references) rows from run_qa's answers (and v2 null odds) and the examples' columns.

    Rows keep the answers' order: v2's best-threshold search breaks ties by that order,
    as score_squad.py does by the order of eval_null_odds.json.
    """
    predictions: list[dict] = []
    for qid, text in answers.items():
        row: dict[str, Any] = {"id": qid, "prediction_text": text}
        if null_odds is not None:
            row["no_answer_probability"] = float(null_odds[qid])
        predictions.append(row)
    references = [{"id": qid, "answers": {"text": list(gold["text"]), "answer_start": list(gold["answer_start"])}}
                  for qid, gold in zip(ids, golds)]
    return predictions, references


def gold_by_id(references: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """id -> gold texts, in order; an empty list is an unanswerable question."""
    return _unique("references", ((ref["id"], list(ref["answers"]["text"])) for ref in references))


def predicted_by_id(predictions: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """id -> predicted text, in order."""
    return _unique("predictions", ((row["id"], row["prediction_text"]) for row in predictions))


def no_answer_by_id(predictions: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """id -> probability (or score) of no answer, in order."""
    return _unique("predictions", ((row["id"], row["no_answer_probability"]) for row in predictions))


def _unique(what: str, pairs: Any) -> dict:
    """A dict from (id, value) pairs; a repeated id is an error (a dict would keep one silently)."""
    out: dict = {}
    for qid, value in pairs:
        if qid in out:
            raise ValueError(f"{what}: id {qid!r} appears more than once")
        out[qid] = value
    return out
