"""squad_metric against hand-computed numbers (arithmetic in the comments).

Every expected value here was worked out by hand from the official SQuAD
evaluation semantics, not produced by running another implementation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import qa_hpc.metric.squad as sm
from conftest import skip_or_fail
from qa_hpc.squad_io import load_references

ROOT = Path(__file__).resolve().parents[1]

DEV_V11 = ROOT.parent / "shared" / "data" / "squad-v1.1" / "dev-v1.1.json"
TOL = 1e-9


# --------------------------------------------------------------------------- normalize


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # lower, "the" is a whole word -> removed; "theater" keeps its "the"
        ("The Theater", "theater"),
        # "an" inside "another" survives (\b), the trailing "a" does not
        ("another a", "another"),
        ("An apple a day", "apple day"),
        # ASCII punctuation is deleted, not replaced: "U.S." -> "us", hyphen joins
        ("U.S. Army", "us army"),
        ("well-known", "wellknown"),
        ("rock 'n' roll", "rock n roll"),
        # punctuation goes before articles: "the_end" -> "theend" keeps "the",
        # while "the." -> "the" is then removed as an article
        ("the_end", "theend"),
        ("the. end", "end"),
        # unicode punctuation and letters are NOT ASCII punctuation: kept
        ("“Quoted”", "“quoted”"),
        ("1914—1918", "1914—1918"),
        ("Café É", "café é"),
        # tabs, newlines, NBSP and em-space are all str.split() separators
        ("x\ty\nz\u00a0w\u2003v", "x y z w v"),
        ("  ", ""),
        ("A", ""),
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert sm.normalize_answer(raw) == expected


def test_unicode_apostrophe_article() -> None:
    # "l’a": ’ (U+2019) is not ASCII punctuation so it stays; it is not a word
    # character either, so there is a \b between ’ and "a" and after "a":
    # "a" is removed as an article -> "l’ " -> whitespace collapse -> "l’".
    assert sm.normalize_answer("l’a") == "l’"


# --------------------------------------------------------------------------- v1 pairs


def test_exact_match_v1() -> None:
    assert sm.exact_match_v1("the U.S.", "US") is True  # both -> "us"
    assert sm.exact_match_v1("“US”", "US") is False  # "“us”" != "us"
    assert sm.exact_match_v1("", "the") is True  # both normalize to ""
    assert sm.exact_match_v1("New\u00a0York", "new  york") is True  # "new york"


def test_f1_v1_articles_removed() -> None:
    # pred "the cat sat on the mat" -> [cat, sat, on, mat] (4 tokens)
    # gold "a cat on a mat"         -> [cat, on, mat]      (3 tokens)
    # overlap 3: P = 3/4, R = 3/3 = 1, F1 = 2*0.75*1 / 1.75 = 1.5/1.75 = 6/7
    assert sm.f1_v1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7, abs=TOL)


def test_f1_v1_repeated_tokens_use_counter_overlap() -> None:
    # pred {cat: 3, dog: 1} (4 tokens), gold {cat: 1, dog: 2} (3 tokens)
    # overlap = min(3,1) + min(1,2) = 2: P = 2/4, R = 2/3
    # F1 = 2*(1/2)*(2/3) / (1/2 + 2/3) = (2/3) / (7/6) = 4/7
    assert sm.f1_v1("cat cat cat dog", "cat dog dog") == pytest.approx(4 / 7, abs=TOL)


def test_f1_v1_nbsp_splits_tokens() -> None:
    # "New\u00a0York City" -> [new, york, city]; gold [new, york]
    # overlap 2: P = 2/3, R = 1, F1 = 2*(2/3) / (5/3) = 4/5
    assert sm.f1_v1("New\u00a0York City", "new york") == pytest.approx(0.8, abs=TOL)


def test_f1_v1_unicode_quotes_break_match() -> None:
    # [“hamlet”] vs [hamlet]: no common token -> 0
    assert sm.f1_v1("“Hamlet”", "Hamlet") == 0.0


def test_f1_v1_empty_cases_are_zero() -> None:
    # official v1: num_same == 0 -> 0, even when both sides are empty
    assert sm.f1_v1("", "") == 0.0
    assert sm.f1_v1("the", "a") == 0.0  # both normalize to "" yet EM would be True
    assert sm.f1_v1("", "cat") == 0.0


# --------------------------------------------------------------------------- v1 corpus

V1_REFS = {
    "q1": ["Denver Broncos", "the Broncos"],
    "q2": ["Santa Clara, California", "Levi's Stadium"],
    "q3": ["1914—1918"],
    "q4": ["Paris"],
}
V1_PREDS = {
    "q1": "Broncos",
    "q2": "Levi's Stadium in Santa Clara",
    "q3": "1914-1918",
    # q4 missing
}


def test_score_v1_hand_computed() -> None:
    # q1: "broncos" == normalize("the Broncos") -> EM 1, F1 1 (max over golds)
    # q2: pred [levis, stadium, in, santa, clara] (5)
    #     vs [santa, clara, california]: overlap 2, P=2/5, R=2/3,
    #        F1 = 2*(2/5)*(2/3) / (2/5+2/3) = (8/15)/(16/15) = 1/2
    #     vs [levis, stadium]: overlap 2, P=2/5, R=1, F1 = (4/5)/(7/5) = 4/7
    #     max = 4/7, EM 0
    # q3: "19141918" (ASCII hyphen removed) vs "1914—1918" (em dash kept): 0, 0
    # q4: missing -> 0, still in the denominator (4)
    # EM = 100 * 1/4 = 25; F1 = 100 * (1 + 4/7) / 4 = 100 * 11/28
    result = sm.score_v1(V1_REFS, V1_PREDS)
    assert list(result) == ["exact_match", "f1"]
    assert result["exact_match"] == pytest.approx(25.0, abs=TOL)
    assert result["f1"] == pytest.approx(1100 / 28, abs=TOL)


def test_score_v1_ignores_unknown_prediction_ids() -> None:
    result = sm.score_v1(V1_REFS, {**V1_PREDS, "zzz": "Broncos"})
    assert result == sm.score_v1(V1_REFS, V1_PREDS)


def test_missing_and_unknown_ids_keep_order() -> None:
    preds = {"x9": "a", **V1_PREDS, "x1": "b"}
    assert sm.missing_ids(V1_REFS, preds) == ["q4"]
    assert sm.unknown_ids(V1_REFS, preds) == ["x9", "x1"]


def test_score_v1_rejects_unanswerable_and_empty() -> None:
    with pytest.raises(ValueError, match="no gold answers"):
        sm.score_v1({"q": []}, {"q": ""})
    with pytest.raises(ValueError, match="empty"):
        sm.score_v1({}, {})


def test_score_v1_rejects_non_string_prediction() -> None:
    with pytest.raises(TypeError, match="'q1'"):
        sm.score_v1({"q1": ["x"]}, {"q1": 3})


# --------------------------------------------------------------------------- v2 pairs


def test_v2_pair_semantics() -> None:
    # empty vs empty: v2 gives F1 1 (v1 gives 0)
    assert sm.f1_v2("", "") == 1.0
    assert sm.exact_match_v2("", "") == 1
    # "the" has no tokens after normalization -> treated like "" -> 1
    assert sm.f1_v2("the", "") == 1.0
    # one side empty, other not -> 0
    assert sm.f1_v2("", "cat") == 0.0
    assert sm.f1_v2("cat", "") == 0.0
    # otherwise the v1 formula: 6/7 as in test_f1_v1_articles_removed
    assert sm.f1_v2("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7, abs=TOL)


def test_gold_answers_v2_filters_empty_after_normalization() -> None:
    assert sm.gold_answers_v2(["The", "Paris", "..."]) == ["Paris"]
    assert sm.gold_answers_v2(["The", "!"]) == [""]
    assert sm.gold_answers_v2([]) == [""]


# --------------------------------------------------------------------------- v2 corpus

V2_REFS = {
    "a": ["Paris"],
    "b": ["the Eiffel Tower", "Eiffel"],
    "c": [],  # unanswerable
    "d": [],  # unanswerable
}
V2_PREDS = {"a": "Paris", "b": "Eiffel Tower in Paris", "c": "", "d": "London"}
# b: pred [eiffel, tower, in, paris] (4)
#    vs [eiffel, tower]: overlap 2, P=1/2, R=1, F1 = 1/(3/2) = 2/3
#    vs [eiffel]:        overlap 1, P=1/4, R=1, F1 = (1/2)/(5/4) = 2/5 -> max 2/3
V2_NA = {"a": 0.1, "b": 0.6, "c": 0.9, "d": 0.8}


def test_score_v2_has_ans_no_ans_split() -> None:
    # raw: a (1, 1), b (0, 2/3), c (1, 1: "" vs [""]), d (0, 0)
    # exact = 100*2/4 = 50; f1 = 100*(1 + 2/3 + 1 + 0)/4 = 100*(8/3)/4 = 200/3
    # HasAns {a,b}: exact 100*1/2 = 50, f1 100*(5/3)/2 = 250/3
    # NoAns  {c,d}: exact 50, f1 50
    result = sm.score_v2(V2_REFS, V2_PREDS)
    assert list(result) == [
        "exact", "f1", "total",
        "HasAns_exact", "HasAns_f1", "HasAns_total",
        "NoAns_exact", "NoAns_f1", "NoAns_total",
    ]
    expected = {
        "exact": 50.0, "f1": 200 / 3, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 250 / 3, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
    }
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=TOL), key


def test_score_v2_only_has_ans_keys_when_all_answerable() -> None:
    result = sm.score_v2({"a": ["Paris"]}, {"a": "paris."})
    assert list(result) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"]
    assert result["exact"] == 100.0 and result["f1"] == 100.0


def test_score_v2_na_prob_threshold_and_best_thresh() -> None:
    # thresh 0.5: b (0.6), c (0.9), d (0.8) exceed it -> "no answer" regardless
    # of text: b has an answer -> 0; c, d unanswerable -> 1. a stays 1.
    # exact = f1 = 100*3/4 = 75; HasAns 100*1/2 = 50; NoAns 100*2/2 = 100
    #
    # best_thresh (uses RAW scores), start = #unanswerable = 2, thresh 0.0;
    # ascending na_prob: a .1, b .6, d .8, c .9
    #   exact: a +1 -> 3 (best, .1); b +0 -> 3; d "London" -1 -> 2; c "" +0 -> 2
    #          best_exact = 100*3/4 = 75, thresh 0.1
    #   f1:    a +1 -> 3 (best, .1); b +2/3 -> 11/3 (best, .6); d -1; c 0
    #          best_f1 = 100*(11/3)/4 = 275/3, thresh 0.6
    result = sm.score_v2(V2_REFS, V2_PREDS, V2_NA, na_prob_thresh=0.5)
    expected = {
        "exact": 75.0, "f1": 75.0, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 50.0, "HasAns_total": 2,
        "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 2,
        "best_exact": 75.0, "best_exact_thresh": 0.1,
        "best_f1": 275 / 3, "best_f1_thresh": 0.6,
    }
    assert list(result) == list(expected)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=TOL), key


def test_score_v2_default_thresh_with_na_probs_changes_nothing_but_adds_best() -> None:
    # no probability exceeds 1.0, so exact/f1 are the raw 50 and 200/3
    result = sm.score_v2(V2_REFS, V2_PREDS, V2_NA)
    assert result["exact"] == pytest.approx(50.0, abs=TOL)
    assert result["f1"] == pytest.approx(200 / 3, abs=TOL)
    assert result["best_f1"] == pytest.approx(275 / 3, abs=TOL)


def test_best_thresh_tie_order_quirk() -> None:
    # Tied probabilities are walked one by one in na_probs order, so the
    # reported best can depend on dict order (official behaviour).
    refs = {"y": ["cat"], "z": []}
    preds = {"y": "cat", "z": "dog"}
    # order y, z: start 1 (z abstains); y +1 -> 2 (best, thresh .5); z -1 -> 1
    # best_exact = 100*2/2 = 100 at 0.5 ... though thresh 0.5 answers both (50)
    first = sm.score_v2(refs, preds, {"y": 0.5, "z": 0.5})
    assert first["best_exact"] == 100.0 and first["best_exact_thresh"] == 0.5
    assert sm.score_v2(refs, preds, {"y": 0.5, "z": 0.5}, 0.5)["exact"] == 50.0
    # order z, y: z -1 -> 0; y +1 -> 1, not > 1 -> best stays 1 at 0.0 -> 50
    second = sm.score_v2(refs, preds, {"z": 0.5, "y": 0.5})
    assert second["best_exact"] == 50.0 and second["best_exact_thresh"] == 0.0


def test_best_thresh_whitespace_prediction_counts_as_answer() -> None:
    # " " scores as empty (exact 1 vs no-answer) but is a truthy string, so
    # find_best_thresh charges it -1 when un-abstaining: start 1 -> 0 -> best 1
    result = sm.score_v2({"z": []}, {"z": " "}, {"z": 0.2})
    assert result["exact"] == 100.0
    assert result["best_exact"] == 100.0 and result["best_exact_thresh"] == 0.0


def test_score_v2_gold_that_normalizes_empty_is_has_ans_scored_as_empty() -> None:
    # gold ["The"] -> filtered to [""], but the question is HasAns (raw list
    # non-empty). Pred "" -> exact 1, f1 1, counted under HasAns.
    result = sm.score_v2({"e": ["The"]}, {"e": ""})
    assert result["HasAns_total"] == 1 and result["HasAns_exact"] == 100.0
    assert "NoAns_total" not in result


def test_score_v2_missing_predictions_score_zero_and_count() -> None:
    # a predicted right (1); c (unanswerable) missing -> 0, not credited as ""
    # exact = f1 = 100*1/2 = 50; NoAns 0/1
    # best: start counts only predicted unanswerables = 0; a +1 -> 1 at .1
    #       best_exact = 100*1/2 = 50 (denominator is all questions)
    refs = {"a": ["Paris"], "c": []}
    result = sm.score_v2(refs, {"a": "Paris"}, {"a": 0.1})
    assert result["exact"] == 50.0 and result["total"] == 2
    assert result["NoAns_exact"] == 0.0 and result["NoAns_total"] == 1
    assert result["best_exact"] == 50.0 and result["best_exact_thresh"] == 0.1


def test_score_v2_negative_thresh_without_na_probs() -> None:
    # official default P(no answer) = 0.0 for every prediction; 0.0 > -1 ->
    # every question is "no answer": a (has answer) 0, c 1 -> 50
    refs = {"a": ["Paris"], "c": []}
    assert sm.score_v2(refs, {"a": "Paris", "c": "x"}, None, -1.0)["exact"] == 50.0


def test_score_v2_requires_na_prob_for_each_prediction() -> None:
    with pytest.raises(ValueError, match="'b'"):
        sm.score_v2(V2_REFS, V2_PREDS, {"a": 0.1, "c": 0.2, "d": 0.3})


# --------------------------------------------------------------------------- real data


def _dev_set() -> Path:
    if not DEV_V11.is_file():
        skip_or_fail(f"SQuAD dev set not found at ../shared/data/squad-v1.1/dev-v1.1.json: {DEV_V11}")
    return DEV_V11


def test_dev_set_first_gold_scores_100_and_empty_scores_near_0() -> None:
    refs = load_references(_dev_set())
    assert len(refs) == 10570
    perfect = sm.score_v1(refs, {qid: golds[0] for qid, golds in refs.items()})
    assert perfect == {"exact_match": 100.0, "f1": 100.0}
    # Empty predictions: F1 is exactly 0, but EM is not: 3 dev questions
    # (5725bad5271a42140099d0c1, 5730b7ce069b5314008322c4, 57340d124776f419006617bf)
    # list "." among their gold answers, which normalizes to "" == normalize("").
    # The official v1.1 script gives EM = 100 * 3/10570 = 0.0283822138...
    empty = sm.score_v1(refs, {qid: "" for qid in refs})
    assert empty["f1"] == 0.0
    assert empty["exact_match"] == pytest.approx(100 * 3 / 10570, abs=TOL)
    dot_golds = [qid for qid, golds in refs.items() if "." in golds]
    assert dot_golds == [
        "5725bad5271a42140099d0c1", "5730b7ce069b5314008322c4", "57340d124776f419006617bf",
    ]
