"""SQuAD v1.1 as an `evaluate` metric: the hub's `squad` inputs and outputs, qa_hpc.metric.squad inside.

    squad = evaluate.load("qa_hpc/metric/evaluate_squad_v1")  # a path: loaded offline, no hub
    squad.compute(predictions=[{"id": "q1", "prediction_text": "Denver Broncos"}],
                  references=[{"id": "q1", "answers": {"text": ["Denver Broncos"], "answer_start": [177]}}])
    # -> {"exact_match": 100.0, "f1": 100.0}, the numbers of the official evaluate-v1.1.py

Questions without a prediction score 0; predictions of unknown ids are ignored. evaluate copies this
file into its modules cache and imports the copy: what it needs comes from the installed qa_hpc.
"""

from __future__ import annotations

import evaluate

from qa_hpc.metric.squad import Scores, metric_info, score_rows


class EvaluateSquadV1(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return metric_info(v2=False, inputs_description=__doc__)

    def _compute(self, predictions: list[dict], references: list[dict]) -> Scores:
        return score_rows(predictions, references)
