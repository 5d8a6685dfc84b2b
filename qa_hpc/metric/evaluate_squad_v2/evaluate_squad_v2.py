"""SQuAD v2.0 as an `evaluate` metric: the hub's `squad_v2` inputs and outputs, qa_hpc.metric.squad inside.

    squad_v2 = evaluate.load("qa_hpc/metric/evaluate_squad_v2")  # a path: loaded offline, no hub
    squad_v2.compute(predictions=[{"id": "q1", "prediction_text": "", "no_answer_probability": 0.9}],
                     references=[{"id": "q1", "answers": {"text": [], "answer_start": []}}],
                     no_answer_threshold=0.5)
    # -> exact, f1, total, HasAns_* / NoAns_* (when such questions exist), best_exact(_thresh),
    #    best_f1(_thresh): the numbers of the official evaluate-v2.0.py with --na-prob-file and
    #    --na-prob-thresh (default 1.0)

"" is the answer "no answer"; no gold texts: the question is unanswerable. Questions without a
prediction score 0; predictions of unknown ids are ignored. evaluate copies this file into its
modules cache and imports the copy: what it needs comes from the installed qa_hpc.
"""

from __future__ import annotations

import evaluate

from qa_hpc.metric.squad import Scores, metric_info, score_rows


class EvaluateSquadV2(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return metric_info(v2=True, inputs_description=__doc__)

    def _compute(
        self, predictions: list[dict], references: list[dict], no_answer_threshold: float = 1.0
    ) -> Scores:
        return score_rows(predictions, references, no_answer_threshold)
