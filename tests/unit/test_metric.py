"""The SQuAD metric through its callers: the scorers, score_squad.py's main() in-process, the `evaluate` modules.

Every expected value is worked out by hand from the official semantics (arithmetic in the comments) or comes
from the official evaluate-v1.1.py beside the checkout, never from the code under test.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

import qa_hpc.metric.squad as sm
import score_squad
from conftest import shared_squad_file, skip_or_fail
from qa_hpc.squad_io import load_references
from qa_hpc.metric.squad import LOCAL_MODULES, load_squad_metric, make_score
from qa_hpc.postprocess_loop import QAPredictions
from qa_hpc.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
OFFICIAL_V11 = ROOT.parent / "shared" / "peers" / "hf_run_qa" / "squad" / "compute_score.py"
TOL = 1e-9

V1_REFS = {
    "q1": ["Denver Broncos", "the Broncos"],
    "q2": ["Santa Clara, California", "Levi's Stadium"],
    "q3": ["1914—1918"],
    "q4": ["Paris"],
}
V1_PREDS = {"q1": "Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "1914-1918"}  # q4 missing
# q1: "broncos" == normalize("the Broncos") -> EM 1, F1 1 (max over golds)
# q2: pred [levis, stadium, in, santa, clara] (5)
#     vs [santa, clara, california]: overlap 2, P=2/5, R=2/3, F1 = (8/15)/(16/15) = 1/2
#     vs [levis, stadium]: overlap 2, P=2/5, R=1, F1 = (4/5)/(7/5) = 4/7 -> max 4/7, EM 0
# q3: "19141918" (ASCII hyphen removed) vs "1914—1918" (em dash kept): 0, 0
# q4: missing -> 0, still in the denominator (4)
V1_EXPECTED = {"exact_match": 25.0, "f1": 1100 / 28}  # EM 100 * 1/4; F1 100 * (1 + 4/7) / 4

V2_REFS = {"a": ["Paris"], "b": ["the Eiffel Tower", "Eiffel"], "c": [], "d": []}  # c, d unanswerable
V2_PREDS = {"a": "Paris", "b": "Eiffel Tower in Paris", "c": "", "d": "London"}
V2_NA = {"a": 0.1, "b": 0.6, "c": 0.9, "d": 0.8}
# raw: a (1, 1); b [eiffel, tower, in, paris] vs [eiffel, tower]: P 1/2, R 1, F1 2/3 (vs [eiffel]: 2/5), EM 0;
#      c (1, 1: "" vs [""]); d (0, 0)
# thresh 0.5: b (0.6), c (0.9), d (0.8) are "no answer" whatever the text: b 0, c 1, d 1; a stays 1.
#   exact = f1 = 100*3/4 = 75; HasAns 100*1/2 = 50; NoAns 100*2/2 = 100
# best (RAW scores), start = #unanswerable = 2 at 0.0; ascending na_prob: a .1, b .6, d .8, c .9
#   exact: a +1 -> 3 (best, .1); b +0; d "London" -1; c "" +0 -> best_exact 75 at 0.1
#   f1:    a +1 -> 3; b +2/3 -> 11/3 (best, .6); d -1; c 0 -> best_f1 100*(11/3)/4 = 275/3 at 0.6
V2_EXPECTED = {
    "exact": 75.0, "f1": 75.0, "total": 4,
    "HasAns_exact": 50.0, "HasAns_f1": 50.0, "HasAns_total": 2,
    "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 2,
    "best_exact": 75.0, "best_exact_thresh": 0.1, "best_f1": 275 / 3, "best_f1_thresh": 0.6,
}


def assert_scores(result: dict, expected: dict) -> None:
    assert list(result) == list(expected)  # the keys and their order are the eval_* / scorer contract
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=TOL), key


def one(golds: list[str], pred: str, v2: bool = False) -> tuple[float, float]:
    """(EM, F1) in % of a single question."""
    result = (sm.score_v2 if v2 else sm.score_v1)({"q": golds}, {"q": pred})
    return result["exact" if v2 else "exact_match"], result["f1"]


# --------------------------------------------------------------------------- normalization and pairs


@pytest.mark.parametrize(("raw", "expected"), [
    ("The Theater", "theater"),  # lower, "the" is a whole word -> removed; "theater" keeps its "the"
    ("another a", "another"),  # "an" inside "another" survives (\b), the trailing "a" does not
    ("An apple a day", "apple day"), ("rock 'n' roll", "rock n roll"), ("well-known", "wellknown"),
    ("U.S. Army", "us army"),  # ASCII punctuation is deleted, not replaced: "U.S." -> "us", hyphen joins
    ("the_end", "theend"),  # punctuation goes before articles: "the_end" -> "theend" keeps "the",
    ("the. end", "end"),  # while "the." -> "the" is then removed as an article
    ("“Quoted”", "“quoted”"),  # unicode punctuation and letters are NOT ASCII punctuation: kept
    ("1914—1918", "1914—1918"), ("Café É", "café é"),
    ("x\ty\nz\u00a0w\u2003v", "x y z w v"),  # tabs, newlines, NBSP and em-space are str.split() separators
    ("  ", ""), ("A", ""), ("", ""),
    # ’ (U+2019) is no ASCII punctuation and no word character: \b on both sides of "a", which goes
    ("l’a", "l’"),
])
def test_normalize_answer(raw: str, expected: str) -> None:
    assert sm.normalize_answer(raw) == expected


@pytest.mark.parametrize(("v2", "golds", "pred", "em", "f1"), [
    (False, ["US"], "the U.S.", 100.0, 100.0),  # both -> "us"
    (False, ["US"], "“US”", 0.0, 0.0),  # [“us”] vs [us]: no common token
    (False, ["new  york"], "New\u00a0York", 100.0, 100.0),
    # pred [cat, sat, on, mat] (4) vs [cat, on, mat] (3): P 3/4, R 1, F1 = 1.5/1.75 = 6/7
    (False, ["a cat on a mat"], "the cat sat on the mat", 0.0, 600 / 7),
    # pred {cat: 3, dog: 1} vs gold {cat: 1, dog: 2}: overlap min(3,1) + min(1,2) = 2, P 2/4, R 2/3 -> F1 4/7
    (False, ["cat dog dog"], "cat cat cat dog", 0.0, 400 / 7),
    # [new, york, city] vs [new, york]: P 2/3, R 1, F1 4/5
    (False, ["new york"], "New\u00a0York City", 0.0, 80.0),
    # official v1: no overlap -> F1 0, even when both normalize to "" (EM 1 then)
    (False, ["the"], "", 100.0, 0.0), (False, ["a"], "the", 100.0, 0.0), (False, ["cat"], "", 0.0, 0.0),
    (True, [], "", 100.0, 100.0),  # v2: empty vs empty scores 1 (v1 gives F1 0)
    (True, [], "the", 100.0, 100.0),  # "the" has no tokens after normalization: like ""
    (True, ["cat"], "", 0.0, 0.0), (True, [], "cat", 0.0, 0.0),  # one side empty, the other not
    (True, ["a cat on a mat"], "the cat sat on the mat", 0.0, 600 / 7),  # otherwise the v1 formula
    # golds that normalize to nothing are dropped: "" no longer matches "The" / "..." -> 0
    (True, ["The", "Paris", "..."], "", 0.0, 0.0),
    (True, ["The", "Paris", "..."], "paris", 100.0, 100.0),
    (True, ["The", "!"], "", 100.0, 100.0),  # all dropped -> scored against [""]
])
def test_pair(v2: bool, golds: list[str], pred: str, em: float, f1: float) -> None:
    assert one(golds, pred, v2) == pytest.approx((em, f1), abs=TOL)


# --------------------------------------------------------------------------- corpus scores


def score_v2(refs: dict, preds: dict, na: dict | None, thresh: float | None) -> dict:
    """None: the default threshold (the official 1.0)."""
    return sm.score_v2(refs, preds, na, **({} if thresh is None else {"na_prob_thresh": thresh}))


def subset(result: dict, expected: dict) -> None:
    """The expected keys (None: absent) with their values."""
    assert {k: result.get(k) for k in expected} == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize(("preds", "expected"), [(V1_PREDS, V1_EXPECTED), ({**V1_PREDS, "zzz": "Broncos"}, V1_EXPECTED)])
def test_score_v1_hand_computed_and_ignores_unknown_ids(preds: dict, expected: dict) -> None:
    assert_scores(sm.score_v1(V1_REFS, preds), expected)


@pytest.mark.parametrize(("refs", "preds", "match"), [
    ({"q": []}, {"q": ""}, "no gold answers"),
    ({}, {}, "empty"),
    ({"q1": ["x"]}, {"q1": 3}, "'q1'"),
])
def test_score_v1_rejects(refs: dict, preds: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sm.score_v1(refs, preds)


@pytest.mark.parametrize(("refs", "preds", "na", "thresh", "expected"), [
    # raw (see V2_EXPECTED): exact = 100*2/4 = 50; f1 = 100*(1 + 2/3 + 1 + 0)/4 = 200/3
    # HasAns {a,b}: exact 50, f1 100*(5/3)/2 = 250/3; NoAns {c,d}: 50, 50
    (V2_REFS, V2_PREDS, None, None, {
        "exact": 50.0, "f1": 200 / 3, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 250 / 3, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2}),
    ({"a": ["Paris"]}, {"a": "paris."}, None, None, {  # only HasAns keys when all answerable
        "exact": 100.0, "f1": 100.0, "total": 1, "HasAns_exact": 100.0, "HasAns_f1": 100.0, "HasAns_total": 1}),
    (V2_REFS, V2_PREDS, V2_NA, 0.5, V2_EXPECTED),  # the na_prob threshold and the best thresholds
])
def test_score_v2_hand_computed(refs: dict, preds: dict, na: dict | None, thresh: float | None,
                                expected: dict) -> None:
    assert_scores(score_v2(refs, preds, na, thresh), expected)


TIE_REFS, TIE_PREDS = {"y": ["cat"], "z": []}, {"y": "cat", "z": "dog"}


@pytest.mark.parametrize(("refs", "preds", "na", "thresh", "expected"), [
    # default threshold with na probs: no probability exceeds 1.0: the raw 50 and 200/3, plus best_f1
    (V2_REFS, V2_PREDS, V2_NA, None, {"exact": 50.0, "f1": 200 / 3, "best_f1": 275 / 3}),
    # Tie order quirk: tied probabilities are walked one by one in na_probs order (official).
    # order y, z: start 1 (z abstains); y +1 -> 2 (best, thresh .5); z -1 -> 1: best_exact 100*2/2 = 100 at 0.5 ...
    (TIE_REFS, TIE_PREDS, {"y": 0.5, "z": 0.5}, None, {"best_exact": 100.0, "best_exact_thresh": 0.5}),
    (TIE_REFS, TIE_PREDS, {"y": 0.5, "z": 0.5}, 0.5, {"exact": 50.0}),  # ... though thresh 0.5 answers both (50)
    # order z, y: z -1 -> 0; y +1 -> 1, not > 1 -> best stays 1 at 0.0 -> 50
    (TIE_REFS, TIE_PREDS, {"z": 0.5, "y": 0.5}, None, {"best_exact": 50.0, "best_exact_thresh": 0.0}),
    # " " scores as empty (exact 1 vs no-answer) but is a truthy string, so find_best_thresh charges
    # it -1 when un-abstaining: start 1 -> 0 -> best stays 1 at 0.0
    ({"z": []}, {"z": " "}, {"z": 0.2}, None, {"exact": 100.0, "best_exact": 100.0, "best_exact_thresh": 0.0}),
    # gold ["The"] -> filtered to [""], but the question is HasAns (raw list non-empty)
    ({"e": ["The"]}, {"e": ""}, None, None, {"HasAns_total": 1, "HasAns_exact": 100.0, "HasAns_f1": 100.0,
                                            "NoAns_total": None}),
    # a right (1); c (unanswerable) missing -> 0, not credited as "": exact = 100*1/2 = 50; NoAns 0/1
    # best: start counts only predicted unanswerables = 0; a +1 -> 1 at .1 -> 100*1/2 = 50
    ({"a": ["Paris"], "c": []}, {"a": "Paris"}, {"a": 0.1}, None, {
        "exact": 50.0, "total": 2, "NoAns_exact": 0.0, "NoAns_total": 1, "best_exact": 50.0, "best_exact_thresh": 0.1}),
    # officially "no answer" only when P(no answer) > threshold: at 0.5 == 0.5 "Paris" stands (1)
    ({"a": ["Paris"]}, {"a": "Paris"}, {"a": 0.5}, 0.5, {"exact": 100.0}),
    # official default P(no answer) = 0.0 for every prediction; 0.0 > -1: all "no answer": a 0, c 1 -> 50
    ({"a": ["Paris"], "c": []}, {"a": "Paris", "c": "x"}, None, -1.0, {"exact": 50.0}),
])
def test_score_v2_thresholds_and_quirks(refs: dict, preds: dict, na: dict | None, thresh: float,
                                         expected: dict) -> None:
    subset(score_v2(refs, preds, na, thresh), expected)


def test_score_v2_requires_na_prob_for_each_prediction() -> None:
    with pytest.raises(ValueError, match="'b'"):
        sm.score_v2(V2_REFS, V2_PREDS, {"a": 0.1, "c": 0.2, "d": 0.3})


# --------------------------------------------------------------------------- real data


def need(path: Path, what: str) -> Path:
    if not path.exists():
        skip_or_fail(f"{what} not found at {path}")
    return path


@pytest.fixture(scope="module")
def dev_refs() -> dict[str, list[str]]:
    return load_references(shared_squad_file("dev-v1.1.json"))


def test_dev_set_empty_predictions_score_near_0(dev_refs: dict) -> None:
    assert len(dev_refs) == 10570
    # Empty predictions: F1 is exactly 0, but EM is not: 3 dev questions list "." among their gold
    # answers, which normalizes to "" == normalize(""): the official EM is 100 * 3/10570
    empty = sm.score_v1(dev_refs, {qid: "" for qid in dev_refs})
    assert empty["f1"] == 0.0
    assert empty["exact_match"] == pytest.approx(100 * 3 / 10570, abs=TOL)
    assert [qid for qid, golds in dev_refs.items() if "." in golds] == [
        "5725bad5271a42140099d0c1", "5730b7ce069b5314008322c4", "57340d124776f419006617bf"]


def test_dev_set_equals_the_official_v11_script(dev_refs: dict) -> None:
    # imperfect answers of every kind (partial, padded, from another gold, empty, missing): the official
    # evaluate-v1.1.py (HF's copy beside the checkout) must give bitwise the same floats
    spec = importlib.util.spec_from_file_location("official_squad_v11", need(OFFICIAL_V11, "the official v1.1 script"))
    official = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(official)
    preds = {}
    for i, (qid, golds) in enumerate(dev_refs.items()):
        words = golds[-1].split()
        kind = i % 6
        if kind == 5:
            continue
        preds[qid] = [golds[0], " ".join(words[1:]), f"the {golds[-1]} and more", "",
                      " ".join(words[: len(words) // 2 + 1]).upper()][kind]
    dataset = json.loads(shared_squad_file("dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    assert sm.score_v1(dev_refs, preds) == official.compute_score(dataset, preds)


# --------------------------------------------------------------------------- score_squad.py, in-process


def write(path: Path, content: object) -> Path:
    """bytes and str as they are, anything else as JSON."""
    text = content if isinstance(content, (bytes, str)) else json.dumps(content, ensure_ascii=False)
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def nested(questions: dict[str, list[str]]) -> dict:
    """The official nested layout; [] -> unanswerable (v2 style)."""
    qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in golds],
            **({} if golds else {"is_impossible": True})} for qid, golds in questions.items()]
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
    """dev.json, preds.json (and na.json) of the v1 or v2 case above, with these contents changed."""
    files = {"data": nested(V2_REFS if v2 else V1_REFS), "preds": V2_PREDS if v2 else V1_PREDS, **(changes or {})}
    names = {"data": "dev.json", "preds": "preds.json", "na": "na.json"}
    return {key: write(tmp_path / names[key], content) for key, content in files.items()}


BOM = b"\xef\xbb\xbf" + json.dumps(V1_PREDS).encode()


@pytest.mark.parametrize(("changes", "args", "expected", "err_has", "err_lacks"), [
    # the missing q4 scores 0 and is named
    ({}, [], V1_EXPECTED, ["1 of 4 question(s)", "'q4'", "score 0"], []),
    # the missing-ids warning lists at most five: 1 right of 8
    ({"data": nested({f"q{i}": ["x"] for i in range(8)}), "preds": {"q0": "x"}}, [],
     {"exact_match": 12.5, "f1": 12.5}, ["7 of 8", "'q5'", "(2 more)"], ["'q6'"]),
    ({}, ["--version_2_with_negative"], {"exact": 50.0, "f1": 200 / 3, "best_f1": None}, [], []),
    ({"preds": {**V1_PREDS, "zz1": "x"}}, ["--ignore_unknown_ids"], {"exact_match": 25.0}, ["warning", "'zz1'"], []),
    ({"preds": BOM}, [], {}, [], []),  # a UTF-8 byte order mark is accepted
])
def test_cli_scores(tmp_path: Path, capsys, changes: dict, args: list, expected: dict, err_has: list,
                    err_lacks: list) -> None:
    paths = squad_files(tmp_path, "--version_2_with_negative" in args, changes)
    code, out, err = cli(capsys, paths["data"], paths["preds"], *args)
    assert code == 0, err
    assert len(out.splitlines()) == 1
    subset(json.loads(out), expected)
    if len(expected) > 1 and None not in expected.values():  # every key, in the scorer's order
        assert list(json.loads(out)) == list(expected)
    assert all(w in err for w in err_has) and not any(w in err for w in err_lacks), err


@pytest.mark.parametrize("out_name", ["eval.json", "scores/eval.json"])  # its directory is created
def test_cli_v2_with_na_prob_file_and_out_file(tmp_path: Path, capsys, out_name: str) -> None:
    paths, out_file = squad_files(tmp_path, True, {"na": V2_NA}), tmp_path / out_name
    code, out, err = cli(capsys, paths["data"], paths["preds"], "--version_2_with_negative", "--na_prob_file",
                         paths["na"], "--na_prob_thresh", "0.5", "--out_file", out_file)
    assert (code, err) == (0, "")
    assert_scores(json.loads(out), V2_EXPECTED)
    assert json.loads(out_file.read_text(encoding="utf-8")) == json.loads(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["dev.json", "na.json", "preds.json",
                                                                 out_name.split("/")[0]])
    if out_file.parent != tmp_path:
        assert [p.name for p in out_file.parent.iterdir()] == ["eval.json"]  # no temp file left


def test_cli_dataset_in_any_format_run_qa_reads(tmp_path: Path, capsys) -> None:
    # the reader training uses: flat records as JSON Lines and as CSV give the nested file's numbers
    preds = write(tmp_path / "preds.json", V1_PREDS)
    records = [{"id": qid, "answers": {"text": g, "answer_start": [0] * len(g)}} for qid, g in V1_REFS.items()]
    jsonl = write(tmp_path / "dev.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    table = tmp_path / "dev.csv"
    with open(table, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["id", "answers"], *([r["id"], json.dumps(r["answers"])] for r in records)])
    for data in (jsonl, table):
        code, out, err = cli(capsys, data, preds)
        assert code == 0, err
        assert_scores(json.loads(out), V1_EXPECTED)


def expect_input_error(result: tuple[int, str, str], *fragments: str) -> None:
    code, out, err = result
    assert (code, out) == (2, ""), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


BAD_INPUTS = {  # case: (the files that differ, the one the message names first; words of the message)
    "preds_truncated_json": ({"preds": '{\n  "q1": "Broncos",\n  "q2": "Lev'}, ["not valid JSON", "line 3, column"]),
    "preds_invalid_utf8": ({"preds": b'{"q1": "Bronc\xff"}'}, ["not valid UTF-8", "0xff", "offset 13"]),
    "preds_empty_file": ({"preds": ""}, ["not valid JSON", "line 1, column 1"]),
    "preds_not_object": ({"preds": '["Broncos"]'}, ["JSON object", "array"]),
    "preds_value_not_string": ({"preds": '{"q1": "Broncos", "q2": ["x"]}'}, ["id 'q2'", "string", "array"]),
    "preds_value_null": ({"preds": '{"q1": null}'}, ["id 'q1'", "null"]),
    "preds_unknown_ids": ({"preds": '{"q1": "x", "zz1": "y", "zz2": "y"}'},
                          ["2 id(s)", "not questions of", "'zz1'", "'zz2'", "--ignore_unknown_ids"]),
    "data_no_data": ({"data": {"version": "1.1"}}, ["'data'"]),
    "data_not_list": ({"data": {"data": {"title": "t"}}}, ["'data'", "array"]),
    "data_missing_id": ({"data": {"data": [{"paragraphs": [{"qas": [{"answers": []}]}]}]}},
                        ["data[0].paragraphs[0].qas[0]", "'id'"]),
    "data_answer_text_not_string": ({"data": {"data": [{"paragraphs": [{"qas": [{"id": "q1", "answers": [{"text": 3}]}]}]}]}},
                                    ["'q1'", "'answers[0].text'"]),
    "data_no_questions": ({"data": {"data": []}}, ["no questions"]),
    "data_v2_without_flag": ({"data": nested({**V1_REFS, "q5": []}), "preds": {**V1_PREDS, "q5": ""}},
                             ["'q5'", "no gold answers", "--version_2_with_negative"]),
    "data_truncated": ({"data": '{"data": [\n{"paragraphs": '}, ["not valid JSON", "line 2, column"]),
    "na_string": ({"na": {"a": 0.1, "b": "high", "c": 0.9, "d": 0.8}}, ["id 'b'", "finite number", "string"]),
    "na_boolean": ({"na": {"a": 0.1, "b": True, "c": 0.9, "d": 0.8}}, ["id 'b'", "boolean"]),
    "na_missing_id": ({"na": {"a": 0.1, "c": 0.9, "d": 0.8}}, ["1 predicted question", "'b'"]),
    "na_unknown_id": ({"na": {**V2_NA, "zz": 0.5}}, ["1 id(s)", "'zz'"]),
    "na_not_object": ({"na": [0.1, 0.2]}, ["JSON object", "array"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_cli_bad_input_exit_2_and_write_nothing(tmp_path: Path, capsys, case: str) -> None:
    changes, fragments = BAD_INPUTS[case]
    v2 = "na" in changes  # na_prob files go with v2 data and predictions
    paths = squad_files(tmp_path, v2, changes)
    extra = ["--version_2_with_negative", "--na_prob_file", paths["na"]] if v2 else []
    out_file = tmp_path / "eval.json"
    result = cli(capsys, paths["data"], paths["preds"], *extra, "--out_file", out_file)
    expect_input_error(result, str(paths[next(iter(changes))]), *fragments)
    assert not out_file.exists()


def test_cli_missing_files_exit_2(tmp_path: Path, capsys) -> None:
    data, preds = squad_files(tmp_path, False).values()
    ghost = tmp_path / "nope.json"
    expect_input_error(cli(capsys, ghost, preds), str(ghost), "dataset file not found")
    expect_input_error(cli(capsys, data, ghost), str(ghost), "predictions file not found")
    expect_input_error(cli(capsys, data, preds, "--version_2_with_negative", "--na_prob_file", ghost),
                       str(ghost), "na_prob file not found")
    expect_input_error(cli(capsys, data, data), str(data))  # a dataset is no id -> text map


def test_cli_na_prob_options_require_v2(tmp_path: Path, capsys) -> None:
    paths = squad_files(tmp_path, False, {"na": {}})
    for extra in (["--na_prob_file", paths["na"]], ["--na_prob_thresh", "0.5"]):
        code, _, err = cli(capsys, paths["data"], paths["preds"], *extra)
        assert code == 2 and "--version_2_with_negative" in err


def test_cli_unwritable_out_file_exit_2(tmp_path: Path, capsys) -> None:
    target = tmp_path / "a_directory"
    target.mkdir()
    expect_input_error(cli(capsys, *squad_files(tmp_path, False).values(), "--out_file", target), str(target), "cannot write output file")
    assert target.is_dir() and list(target.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_directory", "dev.json", "preds.json"]


def test_cli_dev_set_first_gold_answers_score_100(tmp_path: Path, capsys) -> None:
    official = json.loads(shared_squad_file("dev-v1.1.json").read_text(encoding="utf-8"))
    preds = {qa["id"]: qa["answers"][0]["text"]
             for article in official["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]}
    assert cli(capsys, shared_squad_file("dev-v1.1.json"), write(tmp_path / "preds.json", preds)) == (
        0, json.dumps({"exact_match": 100.0, "f1": 100.0}) + "\n", "")


# --------------------------------------------------------------------------- the `evaluate` modules, make_score


@pytest.fixture(scope="module")
def metrics() -> dict:
    return {v2: load_squad_metric(None, version_2_with_negative=v2) for v2 in (False, True)}


def refs_rows(golds: dict[str, list[str]]) -> list[dict]:
    return [{"id": qid, "answers": {"text": texts, "answer_start": [0] * len(texts)}} for qid, texts in golds.items()]


def pred_rows(answers: dict[str, str], probs: dict[str, float] | None = None) -> list[dict]:
    return [{"id": qid, "prediction_text": text, **({} if probs is None else {"no_answer_probability": probs[qid]})}
            for qid, text in answers.items()]


def examples(golds: dict[str, list[str]]) -> dict[str, list]:
    return {"id": list(golds), "answers": [{"text": t, "answer_start": [0] * len(t)} for t in golds.values()]}


# v1: "zz" is no question -> ignored (evaluate pairs rows, so the missing q4 shows as one more unknown id)
HAND_COMPUTED = {False: ({**V1_PREDS, "zz": "unknown id"}, None, V1_REFS, V1_EXPECTED),
                 True: (V2_PREDS, V2_NA, V2_REFS, V2_EXPECTED)}


@pytest.mark.parametrize(("v2", "hub"), [
    (False, False), (True, False),
    (False, True),  # HF's own `squad` metric module (what --squad_metric squad fetches), beside the checkout
])
def test_make_score_hand_computed(v2: bool, hub: bool) -> None:
    # make_score takes the run's threshold: at 1.0 (the metric's default) v2 exact would be 50, not 75
    answers, probs, golds, expected = HAND_COMPUTED[v2]
    path = [str(need(OFFICIAL_V11.parent / "squad.py", "HF's squad metric module").parent)] if hub else []
    score = make_score(v2, 0.5 if v2 else 0.0, *path)
    assert_scores(score(QAPredictions(answers=answers, nbest={}, null_odds=probs), examples(golds)), expected)


@pytest.mark.parametrize(("v2", "answers", "probs", "golds", "kwargs", "expected"), [
    # a: gold "." normalizes to "" and so does the empty prediction: EM 1, but F1 0 (no common token)
    # b: [cat, sat, down] vs [cat, sat]: P 2/3, R 1, F1 = (4/3)/(5/3) = 4/5; EM 0
    # EM = 100 * 1/2 = 50; F1 = 100 * (0 + 4/5) / 2 = 40
    (False, {"a": "", "b": "a cat sat down"}, None, {"a": ["."], "b": ["the cat sat"]}, {},
     {"exact_match": 50.0, "f1": 40.0}),
    # no_answer_threshold defaults to the official 1.0: no probability exceeds it, the raw 50 and 200/3 stand
    (True, V2_PREDS, V2_NA, V2_REFS, {}, {"exact": 50.0, "f1": 200 / 3}),
    # "The" -> "": HasAns (decided on the raw list), scored against "": the empty prediction gets 1, 1
    (True, {"e": ""}, {"e": 0.0}, {"e": ["The"]}, {}, {"exact": 100.0, "f1": 100.0, "HasAns_total": 1,
                                                       "NoAns_total": None}),
])
def test_evaluate_modules(metrics: dict, v2, answers, probs, golds, kwargs, expected) -> None:
    result = metrics[v2].compute(predictions=pred_rows(answers, probs), references=refs_rows(golds), **kwargs)
    subset(result, expected)
    if not v2:
        assert list(result) == list(expected)


def test_repeated_ids_are_an_error(metrics: dict) -> None:
    with pytest.raises(ValueError, match="'q1' appears more than once"):
        metrics[False].compute(predictions=pred_rows({"q1": "x", "q2": "y"}), references=refs_rows({"q1": ["x"]}) * 2)


def test_v2_probabilities_stay_float64(metrics: dict) -> None:
    # p = 0.1 - 1e-12 does not exceed the threshold 0.1, so "Paris" stands (exact 100) and the best
    # threshold is p itself. As float32 (the hub's type) p would round to 0.10000000149 > 0.1: exact 0.
    p = 0.1 - 1e-12
    result = metrics[True].compute(predictions=pred_rows({"x": "Paris"}, {"x": p}),
                                   references=refs_rows({"x": ["Paris"]}), no_answer_threshold=0.1)
    assert (result["exact"], result["best_exact_thresh"]) == (100.0, p)


def test_a_path_chooses_another_metric(tmp_path: Path) -> None:
    module = tmp_path / "always_half" / "always_half.py"
    module.parent.mkdir()
    module.write_text(
        "import evaluate\n"
        "from qa_hpc.metric.squad import metric_features\n\n"
        "class AlwaysHalf(evaluate.Metric):\n"
        "    def _info(self):\n"
        "        return evaluate.MetricInfo(description='', citation='', features=metric_features(False))\n\n"
        "    def _compute(self, predictions, references):\n"
        "        return {'exact_match': 50.0, 'f1': 50.0}\n",
        encoding="utf-8",
    )
    score = make_score(False, 0.0, str(module.parent))
    result = score(QAPredictions(answers={"q4": "Paris"}, nbest={}, null_odds=None), examples({"q4": ["Paris"]}))
    assert result == {"exact_match": 50.0, "f1": 50.0}


def test_a_path_that_is_no_metric_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--squad_metric '.*no_such_metric' could not be loaded.*no local path"):
        make_score(False, 0.0, str(tmp_path / "no_such_metric"))
    not_a_metric = tmp_path / "plain.py"
    not_a_metric.write_text("X = 1\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"plain\.py' could not be loaded.*no evaluate module"):
        make_score(False, 0.0, str(not_a_metric))


def test_a_v1_metric_cannot_score_a_v2_run() -> None:
    with pytest.raises(UsageError, match=r"takes predictions \['id', 'prediction_text'\].*SQuAD v2\.0 run sends "
                                         r"predictions \['id', 'no_answer_probability', 'prediction_text'\]"):
        make_score(True, 0.0, str(LOCAL_MODULES[False]))
