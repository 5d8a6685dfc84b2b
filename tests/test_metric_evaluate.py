"""The local `evaluate` SQuAD modules and make_score, against numbers worked out by hand.

Every expected value is computed in the comments from the official evaluation
semantics (normalize: lower case, drop ASCII punctuation, drop a/an/the, split on
whitespace), never by running the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qa_hpc.metric.scoring import LOCAL_MODULES, load_squad_metric, make_score
from qa_hpc.postprocess.reference import QAPredictions
from qa_hpc.reliability.errors import UsageError

TOL = 1e-12


@pytest.fixture(scope="module")
def v1():
    return load_squad_metric(None, version_2_with_negative=False)


@pytest.fixture(scope="module")
def v2():
    return load_squad_metric(None, version_2_with_negative=True)


def _refs(golds: dict[str, list[str]]) -> list[dict]:
    return [{"id": qid, "answers": {"text": texts, "answer_start": [0] * len(texts)}} for qid, texts in golds.items()]


def _preds(answers: dict[str, str], probs: dict[str, float] | None = None) -> list[dict]:
    rows = [{"id": qid, "prediction_text": text} for qid, text in answers.items()]
    if probs is not None:
        for row in rows:
            row["no_answer_probability"] = probs[row["id"]]
    return rows


# --------------------------------------------------------------------------- v1.1

V1_GOLDS = {
    "q1": ["Denver Broncos", "the Broncos"],
    "q2": ["Santa Clara, California", "Levi's Stadium"],
    "q3": ["1914—1918"],
    "q4": ["Paris"],
}
V1_ANSWERS = {"q1": "Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "1914-1918", "zz": "unknown id"}


def test_v1_module_hand_computed(v1) -> None:
    # q1: "broncos" equals normalize("the Broncos") = "broncos": EM 1, F1 1
    # q2: [levis, stadium, in, santa, clara] (5) vs [levis, stadium]: overlap 2, P 2/5, R 1, F1 4/7;
    #     vs [santa, clara, california]: P 2/5, R 2/3, F1 1/2 -> max 4/7, EM 0
    # q3: "-" is ASCII punctuation -> "19141918"; the em dash is not -> "1914—1918": EM 0, F1 0
    # q4: no prediction -> 0, still counted; "zz" is no question -> ignored (evaluate pairs rows, so
    # a missing prediction shows as one more unknown id)
    # EM = 100 * 1/4 = 25; F1 = 100 * (1 + 4/7) / 4 = 1100/28
    result = v1.compute(predictions=_preds(V1_ANSWERS), references=_refs(V1_GOLDS))
    assert list(result) == ["exact_match", "f1"]
    assert result["exact_match"] == pytest.approx(25.0, abs=TOL)
    assert result["f1"] == pytest.approx(1100 / 28, abs=TOL)


def test_v1_module_empty_gold_quirk(v1) -> None:
    # a: gold "." normalizes to "" and so does the empty prediction: EM 1, but F1 0 (no common token)
    # b: [cat, sat, down] vs [cat, sat]: overlap 2, P 2/3, R 1, F1 = (4/3)/(5/3) = 4/5; EM 0
    # EM = 100 * 1/2 = 50; F1 = 100 * (0 + 4/5) / 2 = 40
    result = v1.compute(predictions=_preds({"a": "", "b": "a cat sat down"}),
                        references=_refs({"a": ["."], "b": ["the cat sat"]}))
    assert result["exact_match"] == pytest.approx(50.0, abs=TOL)
    assert result["f1"] == pytest.approx(40.0, abs=TOL)


def test_repeated_ids_are_an_error(v1) -> None:
    with pytest.raises(ValueError, match="'q1' appears more than once"):
        v1.compute(predictions=_preds({"q1": "x", "q2": "y"}), references=_refs({"q1": ["x"]}) * 2)


# --------------------------------------------------------------------------- v2.0

V2_GOLDS = {"a": ["Paris"], "b": ["the Eiffel Tower", "Eiffel"], "c": [], "d": []}
V2_ANSWERS = {"a": "Paris", "b": "Eiffel Tower in Paris", "c": "", "d": "London"}
V2_PROBS = {"a": 0.1, "b": 0.6, "c": 0.9, "d": 0.8}
# Raw scores: a EM 1 F1 1; b [eiffel, tower, in, paris] vs [eiffel, tower]: P 1/2, R 1, F1 2/3
# (vs [eiffel]: F1 2/5), EM 0; c "" vs unanswerable: EM 1 F1 1; d "london" vs unanswerable: 0, 0.
# Threshold 0.5: b (0.6), c (0.9), d (0.8) become "no answer": b 0, c 1, d 1.
#   exact = f1 = 100 * 3/4 = 75; HasAns (a, b) 50/50; NoAns (c, d) 100/100.
# Best threshold: start at 2 (the unanswerable c, d), walk a 0.1, b 0.6, d 0.8, c 0.9:
#   exact: a +1 -> 3 (best, 0.1); b +0; d "London" -1; c "" +0 -> best_exact 75 at 0.1
#   f1:    a +1 -> 3; b +2/3 -> 11/3 (best, 0.6); d -1; c +0 -> best_f1 100 * (11/3)/4 = 275/3 at 0.6
V2_EXPECTED = {
    "exact": 75.0, "f1": 75.0, "total": 4,
    "HasAns_exact": 50.0, "HasAns_f1": 50.0, "HasAns_total": 2,
    "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 2,
    "best_exact": 75.0, "best_exact_thresh": 0.1, "best_f1": 275 / 3, "best_f1_thresh": 0.6,
}


def _assert_v2(result: dict, expected: dict) -> None:
    assert list(result) == list(expected)  # the keys and their order are run_qa's eval_* contract
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=TOL), key


def test_v2_module_hand_computed(v2) -> None:
    result = v2.compute(predictions=_preds(V2_ANSWERS, V2_PROBS), references=_refs(V2_GOLDS),
                        no_answer_threshold=0.5)
    _assert_v2(result, V2_EXPECTED)


def test_v2_module_default_threshold_is_the_official_one(v2) -> None:
    # no_answer_threshold defaults to 1.0: no probability exceeds it, raw scores stand:
    # exact = 100 * (1 + 0 + 1 + 0)/4 = 50; f1 = 100 * (1 + 2/3 + 1 + 0)/4 = 200/3
    result = v2.compute(predictions=_preds(V2_ANSWERS, V2_PROBS), references=_refs(V2_GOLDS))
    assert result["exact"] == pytest.approx(50.0, abs=TOL)
    assert result["f1"] == pytest.approx(200 / 3, abs=TOL)


def test_v2_probabilities_stay_float64(v2) -> None:
    # p = 0.1 - 1e-12 does not exceed the threshold 0.1, so "Paris" stands: exact 100, and the
    # best threshold is p itself. As float32 (the hub's type) p would round to 0.10000000149 > 0.1
    # and the answer would count as "no answer" (exact 0).
    p = 0.1 - 1e-12
    result = v2.compute(predictions=_preds({"x": "Paris"}, {"x": p}), references=_refs({"x": ["Paris"]}),
                        no_answer_threshold=0.1)
    assert result["exact"] == 100.0
    assert result["best_exact_thresh"] == p


def test_v2_gold_that_normalizes_to_nothing(v2) -> None:
    # e's only gold "The" normalizes to "": the question counts as HasAns (decided on the raw
    # list) but is scored against "": the empty prediction gets EM 1 and F1 1 (v2: both empty).
    result = v2.compute(predictions=_preds({"e": ""}, {"e": 0.0}), references=_refs({"e": ["The"]}))
    assert (result["exact"], result["f1"], result["HasAns_total"]) == (100.0, 100.0, 1)
    assert "NoAns_total" not in result


# --------------------------------------------------------------------------- make_score


def _examples(golds: dict[str, list[str]]) -> dict[str, list]:
    return {"id": list(golds), "answers": [{"text": t, "answer_start": [0] * len(t)} for t in golds.values()]}


def test_make_score_v1() -> None:
    score = make_score(False, 0.0)
    result = score(QAPredictions(answers=V1_ANSWERS, nbest={}, null_odds=None), _examples(V1_GOLDS))
    assert result["exact_match"] == pytest.approx(25.0, abs=TOL)  # as test_v1_module_hand_computed
    assert result["f1"] == pytest.approx(1100 / 28, abs=TOL)


def test_make_score_v2_uses_the_run_threshold() -> None:
    score = make_score(True, 0.5)
    result = score(QAPredictions(answers=V2_ANSWERS, nbest={}, null_odds=V2_PROBS), _examples(V2_GOLDS))
    _assert_v2(result, V2_EXPECTED)  # at 1.0 (the metric's default) exact would be 50, not 75


def test_a_path_chooses_another_metric(tmp_path: Path) -> None:
    module = tmp_path / "always_half" / "always_half.py"
    module.parent.mkdir()
    module.write_text(
        "import evaluate\n"
        "from qa_hpc.metric.evaluate_io import FEATURES_V1\n\n"
        "class AlwaysHalf(evaluate.Metric):\n"
        "    def _info(self):\n"
        "        return evaluate.MetricInfo(description='', citation='', features=FEATURES_V1)\n\n"
        "    def _compute(self, predictions, references):\n"
        "        return {'exact_match': 50.0, 'f1': 50.0}\n",
        encoding="utf-8",
    )
    score = make_score(False, 0.0, str(module.parent))
    result = score(QAPredictions(answers={"q4": "Paris"}, nbest={}, null_odds=None), _examples({"q4": ["Paris"]}))
    assert result == {"exact_match": 50.0, "f1": 50.0}


def test_a_path_that_is_no_metric_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_metric"
    with pytest.raises(UsageError, match=r"--squad_metric '.*no_such_metric' could not be loaded.*no local path"):
        make_score(False, 0.0, str(missing))
    not_a_metric = tmp_path / "plain.py"
    not_a_metric.write_text("X = 1\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"plain\.py' could not be loaded.*no evaluate module"):
        make_score(False, 0.0, str(not_a_metric))


def test_a_v1_metric_cannot_score_a_v2_run() -> None:
    with pytest.raises(UsageError, match=r"takes predictions \['id', 'prediction_text'\].*SQuAD v2\.0 run sends "
                                         r"predictions \['id', 'no_answer_probability', 'prediction_text'\]"):
        make_score(True, 0.0, str(LOCAL_MODULES[False]))


def test_the_hubs_squad_metric_takes_the_same_inputs() -> None:
    # HF's own `squad` metric module (what --squad_metric squad fetches), kept beside the checkout
    hub_squad = Path(__file__).resolve().parents[2] / "shared" / "peers" / "hf_run_qa" / "squad"
    if not (hub_squad / "squad.py").is_file():
        pytest.skip(f"HF's squad metric module not found at {hub_squad}")
    score = make_score(False, 0.0, str(hub_squad))
    result = score(QAPredictions(answers=V1_ANSWERS, nbest={}, null_odds=None), _examples(V1_GOLDS))
    assert result["exact_match"] == pytest.approx(25.0, abs=TOL)  # as test_v1_module_hand_computed
    assert result["f1"] == pytest.approx(1100 / 28, abs=TOL)
