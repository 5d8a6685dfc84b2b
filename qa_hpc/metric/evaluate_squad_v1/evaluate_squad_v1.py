"""SQuAD v1.1 as an `evaluate` metric: the hub's `squad` inputs and outputs, our scorer inside.

    import evaluate
    squad = evaluate.load("qa_hpc/metric/evaluate_squad_v1")  # a path: loaded offline, no hub
    squad.compute(
        predictions=[{"id": "q1", "prediction_text": "Denver Broncos"}],
        references=[{"id": "q1", "answers": {"text": ["Denver Broncos"], "answer_start": [177]}}],
    )  # -> {"exact_match": 100.0, "f1": 100.0}

The numbers are those of the official evaluate-v1.1.py, computed by qa_hpc.metric.squad
(the scorer of score_squad.py). evaluate copies this file into its modules cache and
imports the copy, so what it needs comes from the installed qa_hpc package, never from a
relative import.
"""

from __future__ import annotations

import evaluate

from qa_hpc.metric.evaluate_io import FEATURES_V1, gold_by_id, predicted_by_id
from qa_hpc.metric.squad import score_v1

_CITATION = """\
@inproceedings{rajpurkar-etal-2016-squad,
    title = "{SQ}u{AD}: 100,000+ Questions for Machine Comprehension of Text",
    author = "Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy",
    booktitle = "Proceedings of EMNLP 2016",
    year = "2016",
    pages = "2383--2392",
}
"""

_INPUTS = """
Args:
    predictions: list of {"id": str, "prediction_text": str}.
    references: list of {"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}.
Returns:
    exact_match: % of questions whose prediction equals a gold answer after normalization.
    f1: mean over questions of the best token F1 against the gold answers, in %.
Questions without a prediction score 0; predictions of unknown ids are ignored.
"""


class EvaluateSquadV1(evaluate.Metric):
    """Official SQuAD v1.1 exact match and F1 (qa-hpc)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="SQuAD v1.1 exact match and F1, equal to the official evaluate-v1.1.py (qa-hpc).",
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=FEATURES_V1,
            reference_urls=["https://rajpurkar.github.io/SQuAD-explorer/"],
        )

    def _compute(self, predictions: list[dict], references: list[dict]) -> dict[str, float]:
        return score_v1(gold_by_id(references), predicted_by_id(predictions))
