"""SQuAD v2.0 as an `evaluate` metric: the hub's `squad_v2` inputs and outputs, our scorer inside.

    import evaluate
    squad_v2 = evaluate.load("qa_hpc/metric/evaluate_squad_v2")  # a path: loaded offline, no hub
    squad_v2.compute(
        predictions=[{"id": "q1", "prediction_text": "", "no_answer_probability": 0.9}],
        references=[{"id": "q1", "answers": {"text": [], "answer_start": []}}],
        no_answer_threshold=0.5,
    )  # -> {"exact": 100.0, "f1": 100.0, "total": 1, "NoAns_exact": ..., "best_exact": ..., ...}

The numbers are those of the official evaluate-v2.0.py with --na-prob-file and
--na-prob-thresh, computed by qa_hpc.metric.squad (the scorer of score_squad.py). evaluate
copies this file into its modules cache and imports the copy, so what it needs comes from
the installed qa_hpc package, never from a relative import.
"""

from __future__ import annotations

import evaluate

from qa_hpc.metric.evaluate_io import FEATURES_V2, gold_by_id, no_answer_by_id, predicted_by_id
from qa_hpc.metric.squad import score_v2

_CITATION = """\
@inproceedings{rajpurkar-etal-2018-know,
    title = "Know What You Don{'}t Know: Unanswerable Questions for {SQ}u{AD}",
    author = "Rajpurkar, Pranav and Jia, Robin and Liang, Percy",
    booktitle = "Proceedings of ACL 2018 (Volume 2: Short Papers)",
    year = "2018",
    pages = "784--789",
}
"""

_INPUTS = """
Args:
    predictions: list of {"id": str, "prediction_text": str, "no_answer_probability": float}
        ("" is the answer "no answer").
    references: list of {"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}
        (no texts: the question is unanswerable).
    no_answer_threshold: a prediction whose no_answer_probability exceeds this counts as "no answer"
        (default 1.0, as the official script).
Returns:
    exact, f1, total; HasAns_exact/f1/total and NoAns_exact/f1/total when such questions exist;
    best_exact, best_exact_thresh, best_f1, best_f1_thresh (the best threshold on no_answer_probability).
Questions without a prediction score 0; predictions of unknown ids are ignored.
"""


class EvaluateSquadV2(evaluate.Metric):
    """Official SQuAD v2.0 exact match and F1 with the no-answer threshold search (qa-hpc)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="SQuAD v2.0 exact match and F1, equal to the official evaluate-v2.0.py (qa-hpc).",
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=FEATURES_V2,
            reference_urls=["https://rajpurkar.github.io/SQuAD-explorer/"],
        )

    def _compute(self, predictions: list[dict], references: list[dict],
                 no_answer_threshold: float = 1.0) -> dict[str, float | int]:
        return score_v2(gold_by_id(references), predicted_by_id(predictions),
                        na_probs=no_answer_by_id(predictions), na_prob_thresh=no_answer_threshold)
