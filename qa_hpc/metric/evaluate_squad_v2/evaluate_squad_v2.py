"""SQuAD v2.0 as an `evaluate` metric: the hub's `squad_v2` inputs and outputs, qa_hpc.metric.squad inside.

    squad_v2 = evaluate.load("qa_hpc/metric/evaluate_squad_v2")  # a path: loaded offline, no hub
    squad_v2.compute(predictions=[{"id": "q1", "prediction_text": "", "no_answer_probability": 0.9}],
                     references=[{"id": "q1", "answers": {"text": [], "answer_start": []}}],
                     no_answer_threshold=0.5)
    # -> exact, f1, total, HasAns_* / NoAns_* (when such questions exist), best_exact(_thresh), best_f1(_thresh):
    #    the numbers of the official evaluate-v2.0.py with --na-prob-file and --na-prob-thresh (default 1.0)

"" is the answer "no answer"; no gold texts: the question is unanswerable. Questions without a
prediction score 0; predictions of unknown ids are ignored. evaluate copies this file into its
modules cache and imports the copy: what it needs comes from the installed qa_hpc.
"""

from __future__ import annotations

import evaluate

from qa_hpc.metric.squad import Scores, metric_features, score_rows


class EvaluateSquadV2(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="SQuAD v2.0 exact match and F1, equal to the official evaluate-v2.0.py (qa-hpc).",
            citation='Rajpurkar, Jia, Liang: "Know What You Don\'t Know: Unanswerable Questions for SQuAD", '
                     "ACL 2018",
            inputs_description=__doc__, features=metric_features(v2=True),
            reference_urls=["https://rajpurkar.github.io/SQuAD-explorer/"])

    def _compute(self, predictions: list[dict], references: list[dict],
                 no_answer_threshold: float = 1.0) -> Scores:
        return score_rows(predictions, references, no_answer_threshold)
