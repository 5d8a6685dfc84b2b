"""The SQuAD metric through its callers (the scorers, score_squad.py's main() in-process, the `evaluate`
modules), every expected value worked out by hand (arithmetic in the comments) or from the official script.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import shared_squad_file, skip_or_fail

import qa_hpc.metric.squad as sm
import score_squad
from qa_hpc.metric.squad import load_metric, make_score
from qa_hpc.postprocess import QAPredictions
from qa_hpc.squad_io import load_references

OFFICIAL_V11 = (
    Path(__file__).resolve().parents[3] / "shared" / "peers" / "hf_run_qa" / "squad" / "compute_score.py"
)

V1_REFS = {
    "q1": ["Denver Broncos", "the Broncos"],
    "q2": ["Santa Clara, California", "Levi's Stadium"],
    "q3": ["1914—1918"],
    "q4": ["Paris"],
}
V1_PREDS = {"q1": "Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "1914-1918"}  # q4 missing
# q1: "broncos" == normalize("the Broncos"): EM 1, F1 1 (max over golds)
# q2: [levis, stadium, in, santa, clara] vs [santa, clara, california]: P 2/5, R 2/3, F1 1/2;
#     vs [levis, stadium]: P 2/5, R 1, F1 4/7 -> 4/7, EM 0
# q3: "19141918" (ASCII hyphen removed) vs "1914—1918" (em dash kept): 0, 0; q4 missing: 0, in the denominator
V1_EXPECTED = {"exact_match": 25.0, "f1": 1100 / 28}  # 100 * 1/4; 100 * (1 + 4/7) / 4

V2_REFS = {"a": ["Paris"], "b": ["the Eiffel Tower", "Eiffel"], "c": [], "d": []}  # c, d unanswerable
V2_PREDS = {"a": "Paris", "b": "Eiffel Tower in Paris", "c": "", "d": "London"}
V2_NA = {"a": 0.1, "b": 0.6, "c": 0.9, "d": 0.8}
# raw: a (1, 1); b [eiffel, tower, in, paris] vs [eiffel, tower]: P 1/2, R 1, F1 2/3, EM 0; c (1, 1); d (0, 0)
# thresh 0.5: b, c, d are "no answer" whatever the text: b 0, c 1, d 1; a stays 1: exact = f1 = 75;
#   HasAns 50; NoAns 100
# best (raw scores), start = 2 unanswerable at 0.0, ascending na_prob a .1, b .6, d .8, c .9:
#   exact: a +1 -> 3 (best, .1); b +0; d "London" -1; c "" +0 -> 75 at 0.1
#   f1: a +1 -> 3; b +2/3 -> 11/3 (best, .6); d -1; c 0 -> 100 * (11/3) / 4 = 275/3 at 0.6
V2_EXPECTED = {
    "exact": 75.0,
    "f1": 75.0,
    "total": 4,
    "HasAns_exact": 50.0,
    "HasAns_f1": 50.0,
    "HasAns_total": 2,
    "NoAns_exact": 100.0,
    "NoAns_f1": 100.0,
    "NoAns_total": 2,
    "best_exact": 75.0,
    "best_exact_thresh": 0.1,
    "best_f1": 275 / 3,
    "best_f1_thresh": 0.6,
}
V2_RAW = {"exact": 50.0, "f1": 200 / 3}  # no threshold: 100 * 2/4; 100 * (1 + 2/3 + 1 + 0) / 4


def assert_scores(result: dict, expected: dict, every_key: bool = True) -> None:
    """The expected values (None: absent); every_key: also the keys and their order (the eval_* contract)."""
    assert {k: result.get(k) for k in expected} == pytest.approx(expected, abs=1e-9)
    assert not every_key or list(result) == list(expected)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Theater", "theater"),
        ("another a", "another"),  # whole-word articles only
        ("An apple a day", "apple day"),
        ("rock 'n' roll", "rock n roll"),
        ("well-known", "wellknown"),
        ("U.S. Army", "us army"),  # ASCII punctuation deleted, not replaced
        ("the-end", "theend"),
        ("the. end", "end"),  # punctuation before articles
        ("“Quoted”", "“quoted”"),
        ("1914—1918", "1914—1918"),
        ("Café É", "café é"),  # unicode punctuation kept
        ("x\ty\nz\u00a0w\u2003v", "x y z w v"),  # str.split() separators
        ("  ", ""),
        ("A", ""),
        ("", ""),
        ("l’a", "l’"),  # ’ is no ASCII punctuation and no word character: "a" is a whole word
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert sm.normalize_answer(raw) == expected


@pytest.mark.parametrize(
    ("v2", "golds", "pred", "em", "f1"),
    [
        (False, ["US"], "the U.S.", 100.0, 100.0),  # both sides normalized (normalize_answer's cases: above)
        (False, ["a cat on a mat"], "the cat sat on the mat", 0.0, 600 / 7),  # P 3/4, R 1
        # overlap min(3,1) + min(1,2) = 2: P 2/4, R 2/3
        (False, ["cat dog dog"], "cat cat cat dog", 0.0, 400 / 7),
        # official v1: no overlap -> F1 0, even when both normalize to "" (EM 1 then)
        (False, ["the"], "", 100.0, 0.0),
        (False, ["a"], "the", 100.0, 0.0),
        (False, ["cat"], "", 0.0, 0.0),
        (True, [], "", 100.0, 100.0),
        (True, [], "the", 100.0, 100.0),  # v2: empty vs empty scores 1
        (True, ["cat"], "", 0.0, 0.0),
        (True, [], "cat", 0.0, 0.0),
        (True, ["a cat on a mat"], "the cat sat on the mat", 0.0, 600 / 7),
        # golds that normalize to nothing are dropped: "" no longer matches "The" / "..."
        (True, ["The", "Paris", "..."], "", 0.0, 0.0),
        (True, ["The", "Paris", "..."], "paris", 100.0, 100.0),
        (True, ["The", "!"], "", 100.0, 100.0),  # all dropped -> scored against [""]
    ],
)
def test_one_question(v2: bool, golds: list[str], pred: str, em: float, f1: float) -> None:
    result = (sm.score_v2 if v2 else sm.score_v1)({"q": golds}, {"q": pred})
    assert (result["exact" if v2 else "exact_match"], result["f1"]) == pytest.approx((em, f1), abs=1e-9)


TIE_REFS = {"y": ["cat"], "z": []}
TIE_PREDS = {"y": "cat", "z": "dog"}


@pytest.mark.parametrize(
    ("refs", "preds", "na", "thresh", "expected"),
    [
        # HasAns {a,b}: exact 50, f1 100 * (5/3) / 2 = 250/3; NoAns {c,d}: 50, 50
        (
            V2_REFS,
            V2_PREDS,
            None,
            1.0,
            {
                **V2_RAW,
                "total": 4,
                "HasAns_exact": 50.0,
                "HasAns_f1": 250 / 3,
                "HasAns_total": 2,
                "NoAns_exact": 50.0,
                "NoAns_f1": 50.0,
                "NoAns_total": 2,
            },
        ),
        (
            {"a": ["Paris"]},
            {"a": "paris."},
            None,
            1.0,
            {"exact": 100.0, "HasAns_total": 1, "NoAns_total": None},
        ),
        # the official default: nothing exceeds 1.0
        (V2_REFS, V2_PREDS, V2_NA, 1.0, {**V2_RAW, "best_f1": 275 / 3}),
        # tied probabilities are walked one by one in na_probs order (official): y, z: start 1 (z abstains);
        # y +1 -> 2 (best, .5); z -1 -> 1: best_exact 100 at 0.5; though thresh 0.5 answers both (50) ...
        (TIE_REFS, TIE_PREDS, {"y": 0.5, "z": 0.5}, 1.0, {"best_exact": 100.0, "best_exact_thresh": 0.5}),
        (TIE_REFS, TIE_PREDS, {"y": 0.5, "z": 0.5}, 0.5, {"exact": 50.0}),
        # ... z, y
        (TIE_REFS, TIE_PREDS, {"z": 0.5, "y": 0.5}, 1.0, {"best_exact": 50.0, "best_exact_thresh": 0.0}),
        # " " scores as empty but is a truthy string, charged -1 when un-abstaining: best stays 1 at 0.0
        (
            {"z": []},
            {"z": " "},
            {"z": 0.2},
            1.0,
            {"exact": 100.0, "best_exact": 100.0, "best_exact_thresh": 0.0},
        ),
        # gold ["The"] -> filtered to [""], but the question is HasAns (raw list non-empty)
        (
            {"e": ["The"]},
            {"e": ""},
            None,
            1.0,
            {"HasAns_total": 1, "HasAns_exact": 100.0, "NoAns_total": None},
        ),
        # c missing -> 0, not credited as "": 50; best starts from predicted unanswerables only (0):
        # a +1 -> 50 at .1
        (
            {"a": ["Paris"], "c": []},
            {"a": "Paris"},
            {"a": 0.1},
            1.0,
            {"exact": 50.0, "NoAns_exact": 0.0, "best_exact": 50.0, "best_exact_thresh": 0.1},
        ),
        # "no answer" only when P > threshold
        ({"a": ["Paris"]}, {"a": "Paris"}, {"a": 0.5}, 0.5, {"exact": 100.0}),
        # without na_probs P(no answer) is 0.0 officially: 0.0 > -1 for all: a 0, c 1 -> 50
        ({"a": ["Paris"], "c": []}, {"a": "Paris", "c": "x"}, None, -1.0, {"exact": 50.0}),
    ],
)
def test_score_v2_thresholds_and_quirks(
    refs: dict, preds: dict, na: dict | None, thresh: float, expected: dict
):
    assert_scores(sm.score_v2(refs, preds, na, thresh), expected, every_key=False)


# found by a random search under Python 3.12: there sum() compensates float additions (not int ones), and the
# official v2 adds 1 (a: "" for no answer) + 1/3 (b) plainly, where a sum of floats keeps 1 + 1/3's rounding
BITWISE_REFS = {"a": [], "b": ["gold blue gray"], "c": ["red"], "d": [], "e": ["pink", "green"]}
BITWISE_PREDS = {"a": "", "b": "red white gray", "c": "red", "d": "pink", "e": "black"}
BITWISE_NA = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.9, "e": 0.4}  # d over 0.5: float(not has_answer)


def official_v2_scores(refs: dict, preds: dict, na: dict | None, thresh: float) -> tuple[dict, dict]:
    """evaluate-v2.0.py's per-question scores, of its types, written out for texts already normalized (lower
    case words: the tokens are str.split()): exact an int; F1 an int where either side has no tokens or none
    is shared, else a float; the best over the golds by max(); over the threshold float(not has_answer)."""

    def f1(gold: str, pred: str):
        g, p = gold.split(), pred.split()
        same = sum((collections.Counter(g) & collections.Counter(p)).values())
        if not g or not p:
            return int(g == p)
        if same == 0:
            return 0
        precision, recall = 1.0 * same / len(p), 1.0 * same / len(g)
        return (2 * precision * recall) / (precision + recall)

    exact, f1s = {}, {}
    for qid, golds in refs.items():
        golds = [gold for gold in golds if gold] or [""]
        exact[qid] = max(int(gold == preds[qid]) for gold in golds)
        f1s[qid] = max(f1(gold, preds[qid]) for gold in golds)
    probs = na if na is not None else dict.fromkeys(refs, 0.0)
    for scores in (exact, f1s):
        for qid in scores:
            if probs[qid] > thresh:
                scores[qid] = float(not refs[qid])
    return exact, f1s


@pytest.mark.parametrize("na", [None, BITWISE_NA], ids=["raw", "thresholded"])
def test_v2_totals_are_bitwise_the_official_sums(na: dict | None) -> None:
    """exact, f1 and the HasAns/NoAns ones are the official 100.0 * sum(...) / n over the official types, to
    the last bit. From Python 3.12 the totals differ if the per-question scores are all floats (sum() would
    then compensate every addition); on 3.11 and before sum() adds plainly and they agree either way, so the
    per-question scores' types are checked too (that check fails on any Python)."""
    raw = sm._raw_scores(BITWISE_REFS, BITWISE_PREDS, v2=True)
    official_raw = official_v2_scores(BITWISE_REFS, BITWISE_PREDS, None, 0.5)
    assert raw == official_raw
    assert [[type(v) for v in scores.values()] for scores in raw] == [
        [type(v) for v in scores.values()] for scores in official_raw
    ]
    texts = [*BITWISE_PREDS.values(), *(gold for golds in BITWISE_REFS.values() for gold in golds)]
    assert all(sm.normalize_answer(text) == text for text in texts)
    exact, f1 = official_v2_scores(BITWISE_REFS, BITWISE_PREDS, na, 0.5)
    expected = {}
    for prefix, qids in (
        ("", list(BITWISE_REFS)),
        ("HasAns_", [qid for qid, golds in BITWISE_REFS.items() if golds]),
        ("NoAns_", [qid for qid, golds in BITWISE_REFS.items() if not golds]),
    ):
        expected[f"{prefix}exact"] = 100.0 * sum(exact[qid] for qid in qids) / len(qids)
        expected[f"{prefix}f1"] = 100.0 * sum(f1[qid] for qid in qids) / len(qids)
        expected[f"{prefix}total"] = len(qids)
    result = sm.score_v2(BITWISE_REFS, BITWISE_PREDS, na, 0.5)
    assert {key: result[key] for key in expected} == expected
    if sys.version_info >= (3, 12):  # the set is one where the types change the sum
        assert 100.0 * sum(map(float, f1.values())) / len(f1) != expected["f1"]


def test_dev_set_equals_the_official_v11_script() -> None:
    """Imperfect answers of all kinds (partial, padded, another gold, empty, missing): the official floats."""
    if not OFFICIAL_V11.exists():
        skip_or_fail(f"the official v1.1 script not found at {OFFICIAL_V11}")
    dev_refs = load_references(shared_squad_file("dev-v1.1.json"))
    spec = importlib.util.spec_from_file_location("official_squad_v11", OFFICIAL_V11)
    official = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(official)
    preds = {}
    for i, (qid, golds) in enumerate(dev_refs.items()):
        words = golds[-1].split()
        if i % 6 < 5:
            preds[qid] = [
                golds[0],
                " ".join(words[1:]),
                f"the {golds[-1]} and more",
                "",
                " ".join(words[: len(words) // 2 + 1]).upper(),
            ][i % 6]
    dataset = json.loads(shared_squad_file("dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    assert sm.score_v1(dev_refs, preds) == official.compute_score(dataset, preds)
    # empty answers: F1 0, EM not: 3 questions list "." among their golds, which normalizes to ""
    # (100 * 3/10570)
    assert sm.score_v1(dev_refs, dict.fromkeys(dev_refs, "")) == {"exact_match": 100 * 3 / 10570, "f1": 0.0}


# --------------------------------------------------------------------------- score_squad.py, in-process


def nested(questions: dict[str, list[str]]) -> dict:
    """The official nested layout; [] -> unanswerable (v2 style)."""
    qas = [
        {
            "id": qid,
            "question": "?",
            "answers": [{"text": t, "answer_start": 0} for t in golds],
            **({} if golds else {"is_impossible": True}),
        }
        for qid, golds in questions.items()
    ]
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}


def cli(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, str]:
    """score_squad.main(args): (exit code, stdout, stderr); argparse's usage errors exit too."""
    try:
        code = score_squad.main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def squad_files(tmp_path: Path, v2: bool, changes: dict | None = None) -> dict[str, Path]:
    """data.json, preds.json (and na.json) of the v1 or v2 case above, with these contents changed (None:
    absent; bytes as they are, anything else as JSON)."""
    files = {
        "data": nested(V2_REFS if v2 else V1_REFS),
        "preds": V2_PREDS if v2 else V1_PREDS,
        **(changes or {}),
    }
    paths = {key: tmp_path / f"{key}.json" for key in files}
    for key, content in files.items():
        if content is not None:
            text = content if isinstance(content, bytes) else json.dumps(content, ensure_ascii=False).encode()
            paths[key].write_bytes(text)
    return paths


V2_THRESH = ["--version_2_with_negative", "--na_prob_thresh", "0.5"]


@pytest.mark.parametrize(
    ("changes", "args", "expected", "err_has"),
    [
        # the missing q4 scores 0 and is named
        ({}, [], V1_EXPECTED, ["1 of 4 question(s)", "'q4'", "score 0"]),
        # at most five ids listed
        (
            {"data": nested({f"q{i}": ["x"] for i in range(8)}), "preds": {"q0": "x"}},
            [],
            {"exact_match": 12.5, "f1": 12.5},
            ["7 of 8", "'q5'", "(2 more)"],
        ),
        ({}, ["--version_2_with_negative"], {**V2_RAW, "best_f1": None}, []),
        ({"na": V2_NA}, V2_THRESH, V2_EXPECTED, []),
        # ids the dataset does not hold are ignored, as officially, and named in a warning
        (
            {"preds": {**V1_PREDS, "zz1": "x", "zz2": "y"}},
            [],
            V1_EXPECTED,
            ["warning: ", "preds.json: 2 id(s) are not questions of ", "'zz1', 'zz2'; ignored"],
        ),
        # ... in the no-answer probabilities too: the best threshold search skips them
        ({"na": {**V2_NA, "zz": 0.5}}, V2_THRESH, V2_EXPECTED, ["na.json: 1 id(s)", "'zz'; ignored"]),
        # a UTF-8 BOM
        ({"preds": b"\xef\xbb\xbf" + json.dumps(V1_PREDS).encode()}, [], V1_EXPECTED, ["'q4'"]),
    ],
)
def test_cli_scores(tmp_path: Path, capsys, changes: dict, args: list, expected: dict, err_has: list) -> None:
    paths = squad_files(tmp_path, "--version_2_with_negative" in args, changes)
    na = ["--na_prob_file", paths["na"]] if "na" in paths else []
    code, out, err = cli(capsys, paths["data"], paths["preds"], *args, *na)
    assert code == 0 and len(out.splitlines()) == 1 and (err_has or not err), err
    assert_scores(json.loads(out), expected, every_key=expected is V1_EXPECTED or expected is V2_EXPECTED)
    assert all(w in err for w in err_has) and "'q6'" not in err, err


# case: (the files that differ, the first one named in the message; words of the message)
BAD_INPUTS = {
    "preds_truncated_json": (
        {"preds": b'{\n  "q1": "Broncos",\n  "q2": "Lev'},
        ["not valid JSON", "line 3, column"],
    ),
    "preds_invalid_utf8": ({"preds": b'{"q1": "Bronc\xff"}'}, ["not valid UTF-8", "0xff", "offset 13"]),
    "preds_empty_file": ({"preds": b""}, ["not valid JSON", "line 1, column 1"]),
    "preds_not_object": ({"preds": b'["Broncos"]'}, ["JSON object", "array"]),
    "preds_value_not_string": ({"preds": b'{"q1": "Broncos", "q2": ["x"]}'}, ["id 'q2'", "string", "array"]),
    "preds_value_null": ({"preds": b'{"q1": null}'}, ["id 'q1'", "null"]),
    # a dataset given as the predictions: its ids are unknown (a warning), its "data" no answer text
    "preds_is_a_dataset": (
        {"preds": nested(V1_REFS)},
        ["prediction for id 'data' must be a string, got an array"],
    ),
    "data_no_questions": ({"data": {"data": []}}, ["no questions"]),
    "data_v2_without_flag": (
        {"data": nested({**V1_REFS, "q5": []}), "preds": {**V1_PREDS, "q5": ""}},
        ["'q5'", "no gold answers", "--version_2_with_negative"],
    ),
    "na_string": ({"na": {**V2_NA, "b": "high"}}, ["id 'b'", "finite number", "string"]),
    "na_boolean": ({"na": {**V2_NA, "b": True}}, ["id 'b'", "boolean"]),
    "na_missing_id": ({"na": {"a": 0.1, "c": 0.9, "d": 0.8}}, ["1 predicted question", "'b'"]),
    "na_not_object": ({"na": [0.1, 0.2]}, ["JSON object", "array"]),
    "data_absent": ({"data": None}, ["dataset file not found"]),
    "preds_absent": ({"preds": None}, ["predictions file not found"]),
    "na_absent": ({"na": None}, ["na_prob file not found"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_cli_bad_input_exit_2_naming_the_file_and_printing_no_scores(
    tmp_path: Path, capsys, case: str
) -> None:
    changes, fragments = BAD_INPUTS[case]
    paths = squad_files(tmp_path, "na" in changes, changes)
    extra = ["--version_2_with_negative", "--na_prob_file", paths["na"]] if "na" in changes else []
    code, out, err = cli(capsys, paths["data"], paths["preds"], *extra)
    assert (code, out) == (2, ""), err
    assert all(f in err for f in [f"{paths[next(iter(changes))]}: ", *fragments]), err
    assert err.splitlines()[-1].startswith("ERROR: ") and err.count("ERROR: ") == 1, err  # as every failure


@pytest.mark.parametrize("flag", [["--na_prob_file", "na.json"], ["--na_prob_thresh", "0.5"]])
def test_cli_na_prob_options_require_v2(tmp_path: Path, capsys, flag: list) -> None:
    paths = squad_files(tmp_path, False)
    code, _, err = cli(capsys, paths["data"], paths["preds"], *flag)
    assert code == 2 and err.startswith(f"ERROR: --{flag[0][2:]} requires --version_2_with_negative"), err
    assert err.count("\n") == 1, err  # one line: no usage text


# ------------------------------------------------------------------------- the `evaluate` modules, make_score


def rows(
    golds: dict[str, list[str]] | None = None, answers: dict | None = None, probs: dict | None = None
) -> list:
    """The `evaluate` references (golds) or predictions (answers, with probs for v2)."""
    if golds is not None:
        return [{"id": q, "answers": {"text": t, "answer_start": [0] * len(t)}} for q, t in golds.items()]
    return [
        {"id": q, "prediction_text": a, **({"no_answer_probability": probs[q]} if probs else {})}
        for q, a in answers.items()
    ]


def examples(golds: dict[str, list[str]]) -> dict[str, list]:
    return {"id": list(golds), "answers": [{"text": t, "answer_start": [0] * len(t)} for t in golds.values()]}


@pytest.mark.parametrize(
    ("v2", "answers", "probs", "golds", "expected"),
    [
        (False, {**V1_PREDS, "zz": "unknown id"}, None, V1_REFS, V1_EXPECTED),
        (True, V2_PREDS, V2_NA, V2_REFS, V2_EXPECTED),
    ],
)
def test_make_score_hand_computed(v2, answers, probs, golds, expected) -> None:
    # make_score takes the run's threshold: at 1.0 (the metric's default) v2 exact would be 50, not 75
    score = make_score(v2, 0.5 if v2 else 0.0)
    assert_scores(score(QAPredictions(answers=answers, nbest={}, null_odds=probs), examples(golds)), expected)


def test_v2_module_threshold_defaults_to_1_and_probabilities_stay_float64() -> None:
    metric = load_metric(version_2_with_negative=True)
    result = metric.compute(predictions=rows(answers=V2_PREDS, probs=V2_NA), references=rows(V2_REFS))
    assert_scores(result, V2_RAW, every_key=False)  # the official default no_answer_threshold 1.0
    # p = 0.1 - 1e-12 does not exceed 0.1: "Paris" stands; as float32 (the hub's type) p would round above 0.1
    p = 0.1 - 1e-12
    result = metric.compute(
        predictions=rows(answers={"x": "Paris"}, probs={"x": p}),
        references=rows({"x": ["Paris"]}),
        no_answer_threshold=0.1,
    )
    assert (result["exact"], result["best_exact_thresh"]) == (100.0, p)


def test_no_questions_and_repeated_ids_are_errors() -> None:  # other undefined inputs: score_squad.py
    with pytest.raises(ValueError, match="no questions to score"):
        sm.score_v1({}, {})
    with pytest.raises(ValueError, match="'q1' appears more than once"):
        load_metric(version_2_with_negative=False).compute(
            predictions=rows(answers={"q1": "x", "q2": "y"}), references=rows({"q1": ["x"]}) * 2
        )
