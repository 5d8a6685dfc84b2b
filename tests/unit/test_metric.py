"""The SQuAD metric (qa_hpc/metric/squad.py) through its callers: the scorer functions, score_squad.py's
main() in-process, and the local `evaluate` modules the trainer scores with.

Every expected value was worked out by hand from the official SQuAD evaluation semantics (arithmetic
in the comments) or comes from the official evaluate-v1.1.py beside the checkout, never from the code
under test.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

import qa_hpc.metric.squad as sm
import score_squad
from conftest import skip_or_fail
from qa_hpc.squad_io import load_references
from qa_hpc.metric.squad import LOCAL_MODULES, load_squad_metric, make_score
from qa_hpc.postprocess_loop import QAPredictions
from qa_hpc.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
DEV_V11 = ROOT.parent / "shared" / "data" / "squad-v1.1" / "dev-v1.1.json"
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
    if v2:
        result = sm.score_v2({"q": golds}, {"q": pred})
        return result["exact"], result["f1"]
    result = sm.score_v1({"q": golds}, {"q": pred})
    return result["exact_match"], result["f1"]


# --------------------------------------------------------------------------- normalization and pairs


@pytest.mark.parametrize(("raw", "expected"), [
    ("The Theater", "theater"),  # lower, "the" is a whole word -> removed; "theater" keeps its "the"
    ("another a", "another"),  # "an" inside "another" survives (\b), the trailing "a" does not
    ("An apple a day", "apple day"),
    ("U.S. Army", "us army"),  # ASCII punctuation is deleted, not replaced: "U.S." -> "us", hyphen joins
    ("well-known", "wellknown"),
    ("rock 'n' roll", "rock n roll"),
    ("the_end", "theend"),  # punctuation goes before articles: "the_end" -> "theend" keeps "the",
    ("the. end", "end"),  # while "the." -> "the" is then removed as an article
    ("“Quoted”", "“quoted”"),  # unicode punctuation and letters are NOT ASCII punctuation: kept
    ("1914—1918", "1914—1918"),
    ("Café É", "café é"),
    ("x\ty\nz\u00a0w\u2003v", "x y z w v"),  # tabs, newlines, NBSP and em-space are str.split() separators
    ("  ", ""),
    ("A", ""),
    ("", ""),
    # ’ (U+2019) is no ASCII punctuation and no word character: \b on both sides of "a", which goes
    ("l’a", "l’"),
])
def test_normalize_answer(raw: str, expected: str) -> None:
    assert sm.normalize_answer(raw) == expected


@pytest.mark.parametrize(("gold", "pred", "em", "f1"), [
    ("US", "the U.S.", 100.0, 100.0),  # both -> "us"
    ("US", "“US”", 0.0, 0.0),  # [“us”] vs [us]: no common token
    ("new  york", "New\u00a0York", 100.0, 100.0),
    # pred [cat, sat, on, mat] (4) vs [cat, on, mat] (3): P 3/4, R 1, F1 = 1.5/1.75 = 6/7
    ("a cat on a mat", "the cat sat on the mat", 0.0, 600 / 7),
    # pred {cat: 3, dog: 1} vs gold {cat: 1, dog: 2}: overlap min(3,1) + min(1,2) = 2, P 2/4, R 2/3 -> F1 4/7
    ("cat dog dog", "cat cat cat dog", 0.0, 400 / 7),
    # [new, york, city] vs [new, york]: P 2/3, R 1, F1 4/5
    ("new york", "New\u00a0York City", 0.0, 80.0),
    # official v1: no overlap -> F1 0, even when both normalize to "" (EM 1 then)
    ("the", "", 100.0, 0.0),
    ("a", "the", 100.0, 0.0),
    ("cat", "", 0.0, 0.0),
])
def test_v1_pair(gold: str, pred: str, em: float, f1: float) -> None:
    assert one([gold], pred) == pytest.approx((em, f1), abs=TOL)


@pytest.mark.parametrize(("golds", "pred", "em", "f1"), [
    ([], "", 100.0, 100.0),  # v2: empty vs empty scores 1 (v1 gives F1 0)
    ([], "the", 100.0, 100.0),  # "the" has no tokens after normalization: like ""
    (["cat"], "", 0.0, 0.0),  # one side empty, the other not
    ([], "cat", 0.0, 0.0),
    (["a cat on a mat"], "the cat sat on the mat", 0.0, 600 / 7),  # otherwise the v1 formula
    # golds that normalize to nothing are dropped: "" no longer matches "The" / "..." -> 0
    (["The", "Paris", "..."], "", 0.0, 0.0),
    (["The", "Paris", "..."], "paris", 100.0, 100.0),
    (["The", "!"], "", 100.0, 100.0),  # all dropped -> scored against [""]
])
def test_v2_pair(golds: list[str], pred: str, em: float, f1: float) -> None:
    assert one(golds, pred, v2=True) == pytest.approx((em, f1), abs=TOL)


# --------------------------------------------------------------------------- corpus scores


def test_score_v1_hand_computed() -> None:
    assert_scores(sm.score_v1(V1_REFS, V1_PREDS), V1_EXPECTED)


def test_score_v1_ignores_unknown_prediction_ids() -> None:
    assert_scores(sm.score_v1(V1_REFS, {**V1_PREDS, "zzz": "Broncos"}), V1_EXPECTED)


@pytest.mark.parametrize(("refs", "preds", "match"), [
    ({"q": []}, {"q": ""}, "no gold answers"),
    ({}, {}, "empty"),
    ({"q1": ["x"]}, {"q1": 3}, "'q1'"),
])
def test_score_v1_rejects(refs: dict, preds: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sm.score_v1(refs, preds)


def test_score_v2_has_ans_no_ans_split() -> None:
    # raw (see V2_EXPECTED): exact = 100*2/4 = 50; f1 = 100*(1 + 2/3 + 1 + 0)/4 = 200/3
    # HasAns {a,b}: exact 50, f1 100*(5/3)/2 = 250/3; NoAns {c,d}: 50, 50
    assert_scores(sm.score_v2(V2_REFS, V2_PREDS), {
        "exact": 50.0, "f1": 200 / 3, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 250 / 3, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
    })


def test_score_v2_only_has_ans_keys_when_all_answerable() -> None:
    assert_scores(sm.score_v2({"a": ["Paris"]}, {"a": "paris."}), {
        "exact": 100.0, "f1": 100.0, "total": 1, "HasAns_exact": 100.0, "HasAns_f1": 100.0, "HasAns_total": 1})


def test_score_v2_na_prob_threshold_and_best_thresh() -> None:
    assert_scores(sm.score_v2(V2_REFS, V2_PREDS, V2_NA, na_prob_thresh=0.5), V2_EXPECTED)


def test_score_v2_default_thresh_with_na_probs_changes_nothing_but_adds_best() -> None:
    result = sm.score_v2(V2_REFS, V2_PREDS, V2_NA)  # no probability exceeds 1.0: the raw 50 and 200/3
    assert (result["exact"], result["f1"], result["best_f1"]) == pytest.approx((50.0, 200 / 3, 275 / 3), abs=TOL)


def test_best_thresh_tie_order_quirk() -> None:
    # Tied probabilities are walked one by one in na_probs order (official), so the best depends on it.
    refs, preds = {"y": ["cat"], "z": []}, {"y": "cat", "z": "dog"}
    # order y, z: start 1 (z abstains); y +1 -> 2 (best, thresh .5); z -1 -> 1
    # best_exact = 100*2/2 = 100 at 0.5 ... though thresh 0.5 answers both (50)
    first = sm.score_v2(refs, preds, {"y": 0.5, "z": 0.5})
    assert (first["best_exact"], first["best_exact_thresh"]) == (100.0, 0.5)
    assert sm.score_v2(refs, preds, {"y": 0.5, "z": 0.5}, 0.5)["exact"] == 50.0
    # order z, y: z -1 -> 0; y +1 -> 1, not > 1 -> best stays 1 at 0.0 -> 50
    second = sm.score_v2(refs, preds, {"z": 0.5, "y": 0.5})
    assert (second["best_exact"], second["best_exact_thresh"]) == (50.0, 0.0)


def test_best_thresh_whitespace_prediction_counts_as_answer() -> None:
    # " " scores as empty (exact 1 vs no-answer) but is a truthy string, so find_best_thresh charges
    # it -1 when un-abstaining: start 1 -> 0 -> best stays 1 at 0.0
    result = sm.score_v2({"z": []}, {"z": " "}, {"z": 0.2})
    assert (result["exact"], result["best_exact"], result["best_exact_thresh"]) == (100.0, 100.0, 0.0)


def test_score_v2_gold_that_normalizes_empty_is_has_ans_scored_as_empty() -> None:
    # gold ["The"] -> filtered to [""], but the question is HasAns (raw list non-empty)
    result = sm.score_v2({"e": ["The"]}, {"e": ""})
    assert (result["HasAns_total"], result["HasAns_exact"], result["HasAns_f1"]) == (1, 100.0, 100.0)
    assert "NoAns_total" not in result


def test_score_v2_missing_predictions_score_zero_and_count() -> None:
    # a right (1); c (unanswerable) missing -> 0, not credited as "": exact = 100*1/2 = 50; NoAns 0/1
    # best: start counts only predicted unanswerables = 0; a +1 -> 1 at .1 -> 100*1/2 = 50
    result = sm.score_v2({"a": ["Paris"], "c": []}, {"a": "Paris"}, {"a": 0.1})
    assert (result["exact"], result["total"], result["NoAns_exact"], result["NoAns_total"]) == (50.0, 2, 0.0, 1)
    assert (result["best_exact"], result["best_exact_thresh"]) == (50.0, 0.1)


def test_score_v2_probability_equal_to_the_threshold_keeps_the_answer() -> None:
    # officially "no answer" only when P(no answer) > threshold: at 0.5 == 0.5 "Paris" stands (1)
    assert sm.score_v2({"a": ["Paris"]}, {"a": "Paris"}, {"a": 0.5}, 0.5)["exact"] == 100.0


def test_score_v2_negative_thresh_without_na_probs() -> None:
    # official default P(no answer) = 0.0 for every prediction; 0.0 > -1: all "no answer": a 0, c 1 -> 50
    assert sm.score_v2({"a": ["Paris"], "c": []}, {"a": "Paris", "c": "x"}, None, -1.0)["exact"] == 50.0


def test_score_v2_requires_na_prob_for_each_prediction() -> None:
    with pytest.raises(ValueError, match="'b'"):
        sm.score_v2(V2_REFS, V2_PREDS, {"a": 0.1, "c": 0.2, "d": 0.3})


# --------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def dev_refs() -> dict[str, list[str]]:
    if not DEV_V11.is_file():
        skip_or_fail(f"SQuAD dev set not found at ../shared/data/squad-v1.1/dev-v1.1.json: {DEV_V11}")
    return load_references(DEV_V11)


def test_dev_set_first_gold_scores_100_and_empty_scores_near_0(dev_refs: dict) -> None:
    assert len(dev_refs) == 10570
    assert sm.score_v1(dev_refs, {qid: golds[0] for qid, golds in dev_refs.items()}) == {
        "exact_match": 100.0, "f1": 100.0}
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
    if not OFFICIAL_V11.is_file():
        skip_or_fail(f"the official SQuAD v1.1 script not found at {OFFICIAL_V11}")
    spec = importlib.util.spec_from_file_location("official_squad_v11", OFFICIAL_V11)
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
    dataset = json.loads(DEV_V11.read_text(encoding="utf-8"))["data"]
    assert sm.score_v1(dev_refs, preds) == official.compute_score(dataset, preds)


# --------------------------------------------------------------------------- score_squad.py, in-process


def write(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
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


@pytest.fixture()
def v1_files(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "dev.json", nested(V1_REFS)), write(tmp_path / "preds.json", V1_PREDS)


@pytest.fixture()
def v2_files(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "dev.json", nested(V2_REFS)), write(tmp_path / "preds.json", V2_PREDS)


def test_cli_v1_scores_and_warns_about_missing(v1_files, capsys) -> None:
    code, out, err = cli(capsys, *v1_files)
    assert code == 0, err
    assert len(out.splitlines()) == 1
    assert_scores(json.loads(out), V1_EXPECTED)
    assert "1 of 4 question(s)" in err and "'q4'" in err and "score 0" in err


def test_cli_missing_warning_lists_at_most_five_ids(tmp_path: Path, capsys) -> None:
    data = write(tmp_path / "dev.json", nested({f"q{i}": ["x"] for i in range(8)}))
    code, out, err = cli(capsys, data, write(tmp_path / "preds.json", {"q0": "x"}))
    assert code == 0
    assert json.loads(out) == {"exact_match": 12.5, "f1": 12.5}  # 1 right of 8
    assert "7 of 8" in err and "'q5'" in err and "'q6'" not in err and "(2 more)" in err


def test_cli_v2_with_na_prob_file_and_out_file(v2_files, tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "eval.json"
    code, out, err = cli(capsys, *v2_files, "--version_2_with_negative", "--na_prob_file",
                         write(tmp_path / "na.json", V2_NA), "--na_prob_thresh", "0.5", "--out_file", out_file)
    assert (code, err) == (0, "")
    assert_scores(json.loads(out), V2_EXPECTED)
    assert json.loads(out_file.read_text(encoding="utf-8")) == json.loads(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.json", "eval.json", "na.json", "preds.json"]


def test_cli_v2_without_na_probs(v2_files, capsys) -> None:
    code, out, err = cli(capsys, *v2_files, "--version_2_with_negative")
    assert code == 0, err
    result = json.loads(out)
    assert (result["exact"], result["f1"]) == pytest.approx((50.0, 200 / 3), abs=TOL)
    assert "best_f1" not in result


def test_cli_unknown_ids_allowed_with_flag(v1_files, capsys) -> None:
    data, preds = v1_files
    write(preds, {**V1_PREDS, "zz1": "x"})
    code, out, err = cli(capsys, data, preds, "--ignore_unknown_ids")
    assert code == 0
    assert json.loads(out)["exact_match"] == pytest.approx(25.0, abs=TOL)
    assert "warning" in err and "'zz1'" in err


def test_cli_dataset_in_any_format_run_qa_reads(tmp_path: Path, capsys) -> None:
    # the reader training uses: flat records as JSON Lines and as CSV give the nested file's numbers
    preds = write(tmp_path / "preds.json", V1_PREDS)
    records = [{"id": qid, "answers": {"text": g, "answer_start": [0] * len(g)}} for qid, g in V1_REFS.items()]
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    table = tmp_path / "dev.csv"
    with open(table, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["id", "answers"], *([r["id"], json.dumps(r["answers"])] for r in records)])
    for data in (jsonl, table):
        code, out, err = cli(capsys, data, preds)
        assert code == 0, err
        assert_scores(json.loads(out), V1_EXPECTED)


def test_cli_out_file_directory_is_created(v1_files, tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "scores" / "eval.json"
    code, out, err = cli(capsys, *v1_files, "--out_file", out_file)
    assert code == 0, err
    assert json.loads(out_file.read_text(encoding="utf-8")) == json.loads(out)
    assert [p.name for p in out_file.parent.iterdir()] == ["eval.json"]  # no temp file left


def test_cli_utf8_bom_is_accepted(v1_files, capsys) -> None:
    data, preds = v1_files
    preds.write_bytes(b"\xef\xbb\xbf" + preds.read_bytes())
    assert cli(capsys, data, preds)[0] == 0


def expect_input_error(result: tuple[int, str, str], *fragments: str) -> None:
    code, out, err = result
    assert (code, out) == (2, ""), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


BAD_PREDICTIONS = {
    "truncated_json": ('{\n  "q1": "Broncos",\n  "q2": "Lev', ["not valid JSON", "line 3, column"]),
    "invalid_utf8": (b'{"q1": "Bronc\xff"}', ["not valid UTF-8", "0xff", "offset 13"]),
    "empty_file": ("", ["not valid JSON", "line 1, column 1"]),
    "not_object": ('["Broncos"]', ["JSON object", "array"]),
    "value_not_string": ('{"q1": "Broncos", "q2": ["x"]}', ["id 'q2'", "string", "array"]),
    "value_null": ('{"q1": null}', ["id 'q1'", "null"]),
    "unknown_ids": ('{"q1": "x", "zz1": "y", "zz2": "y"}',
                    ["2 id(s)", "not questions of", "'zz1'", "'zz2'", "--ignore_unknown_ids"]),
}


@pytest.mark.parametrize("case", sorted(BAD_PREDICTIONS))
def test_cli_bad_predictions_exit_2_and_write_nothing(v1_files, tmp_path: Path, capsys, case: str) -> None:
    data, preds = v1_files
    content, fragments = BAD_PREDICTIONS[case]
    preds.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    out_file = tmp_path / "eval.json"
    expect_input_error(cli(capsys, data, preds, "--out_file", out_file), str(preds), *fragments)
    assert not out_file.exists()


BAD_DATASETS = {
    "no_data": ({"version": "1.1"}, ["'data'"]),
    "data_not_list": ({"data": {"title": "t"}}, ["'data'", "array"]),
    "missing_id": ({"data": [{"paragraphs": [{"qas": [{"answers": []}]}]}]},
                   ["data[0].paragraphs[0].qas[0]", "'id'"]),
    "answer_text_not_string": ({"data": [{"paragraphs": [{"qas": [{"id": "q1", "answers": [{"text": 3}]}]}]}]},
                               ["'q1'", "'answers[0].text'"]),
    "no_questions": ({"data": []}, ["no questions"]),
    "v2_data_without_flag": (nested({**V1_REFS, "q5": []}), ["'q5'", "no gold answers", "--version_2_with_negative"]),
}


@pytest.mark.parametrize("case", sorted(BAD_DATASETS))
def test_cli_bad_dataset_exit_2_and_write_nothing(v1_files, tmp_path: Path, capsys, case: str) -> None:
    data, preds = v1_files
    content, fragments = BAD_DATASETS[case]
    write(data, content)
    if case == "v2_data_without_flag":
        write(preds, {**V1_PREDS, "q5": ""})
    out_file = tmp_path / "eval.json"
    expect_input_error(cli(capsys, data, preds, "--out_file", out_file), str(data), *fragments)
    assert not out_file.exists()


def test_cli_missing_files_exit_2(v1_files, tmp_path: Path, capsys) -> None:
    data, preds = v1_files
    ghost = tmp_path / "nope.json"
    expect_input_error(cli(capsys, ghost, preds), str(ghost), "dataset file not found")
    expect_input_error(cli(capsys, data, ghost), str(ghost), "predictions file not found")
    expect_input_error(cli(capsys, data, preds, "--version_2_with_negative", "--na_prob_file", ghost),
                       str(ghost), "na_prob file not found")
    expect_input_error(cli(capsys, data, data), str(data))  # a dataset is no id -> text map


def test_cli_truncated_dataset_names_line_and_column(v1_files, capsys) -> None:
    data, preds = v1_files
    data.write_text('{"data": [\n{"paragraphs": ', encoding="utf-8")
    expect_input_error(cli(capsys, data, preds), str(data), "not valid JSON", "line 2, column")


@pytest.mark.parametrize(("na_probs", "fragments"), [
    ({"a": 0.1, "b": "high", "c": 0.9, "d": 0.8}, ["id 'b'", "finite number", "string"]),
    ({"a": 0.1, "b": True, "c": 0.9, "d": 0.8}, ["id 'b'", "boolean"]),
    ({"a": 0.1, "c": 0.9, "d": 0.8}, ["1 predicted question", "'b'"]),
    ({**V2_NA, "zz": 0.5}, ["1 id(s)", "'zz'"]),
    ([0.1, 0.2], ["JSON object", "array"]),
])
def test_cli_bad_na_prob_file_exit_2(v2_files, tmp_path: Path, capsys, na_probs: object, fragments: list) -> None:
    na, out_file = write(tmp_path / "na.json", na_probs), tmp_path / "eval.json"
    result = cli(capsys, *v2_files, "--version_2_with_negative", "--na_prob_file", na, "--out_file", out_file)
    expect_input_error(result, str(na), *fragments)
    assert not out_file.exists()


def test_cli_na_prob_options_require_v2(v1_files, tmp_path: Path, capsys) -> None:
    na = write(tmp_path / "na.json", {})
    for extra in (["--na_prob_file", na], ["--na_prob_thresh", "0.5"]):
        code, _, err = cli(capsys, *v1_files, *extra)
        assert code == 2 and "--version_2_with_negative" in err


def test_cli_unwritable_out_file_exit_2(v1_files, tmp_path: Path, capsys) -> None:
    target = tmp_path / "a_directory"
    target.mkdir()
    expect_input_error(cli(capsys, *v1_files, "--out_file", target), str(target), "cannot write output file")
    assert target.is_dir() and list(target.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_directory", "dev.json", "preds.json"]


def test_cli_dev_set_first_gold_answers_score_100(tmp_path: Path, capsys) -> None:
    if not DEV_V11.is_file():
        skip_or_fail(f"SQuAD dev set not found at ../shared/data/squad-v1.1/dev-v1.1.json: {DEV_V11}")
    official = json.loads(DEV_V11.read_text(encoding="utf-8"))
    preds = {qa["id"]: qa["answers"][0]["text"]
             for article in official["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]}
    assert cli(capsys, DEV_V11, write(tmp_path / "preds.json", preds)) == (
        0, json.dumps({"exact_match": 100.0, "f1": 100.0}) + "\n", "")


# --------------------------------------------------------------------------- the `evaluate` modules, make_score


@pytest.fixture(scope="module")
def v1():
    return load_squad_metric(None, version_2_with_negative=False)


@pytest.fixture(scope="module")
def v2():
    return load_squad_metric(None, version_2_with_negative=True)


def refs_rows(golds: dict[str, list[str]]) -> list[dict]:
    return [{"id": qid, "answers": {"text": texts, "answer_start": [0] * len(texts)}} for qid, texts in golds.items()]


def pred_rows(answers: dict[str, str], probs: dict[str, float] | None = None) -> list[dict]:
    return [{"id": qid, "prediction_text": text, **({} if probs is None else {"no_answer_probability": probs[qid]})}
            for qid, text in answers.items()]


def examples(golds: dict[str, list[str]]) -> dict[str, list]:
    return {"id": list(golds), "answers": [{"text": t, "answer_start": [0] * len(t)} for t in golds.values()]}


def test_v1_module_hand_computed(v1) -> None:
    # as V1_EXPECTED; "zz" is no question -> ignored (evaluate pairs rows, so the missing q4 shows as
    # one more unknown id)
    result = v1.compute(predictions=pred_rows({**V1_PREDS, "zz": "unknown id"}), references=refs_rows(V1_REFS))
    assert_scores(result, V1_EXPECTED)


def test_v1_module_empty_gold_quirk(v1) -> None:
    # a: gold "." normalizes to "" and so does the empty prediction: EM 1, but F1 0 (no common token)
    # b: [cat, sat, down] vs [cat, sat]: P 2/3, R 1, F1 = (4/3)/(5/3) = 4/5; EM 0
    # EM = 100 * 1/2 = 50; F1 = 100 * (0 + 4/5) / 2 = 40
    result = v1.compute(predictions=pred_rows({"a": "", "b": "a cat sat down"}),
                        references=refs_rows({"a": ["."], "b": ["the cat sat"]}))
    assert_scores(result, {"exact_match": 50.0, "f1": 40.0})


def test_repeated_ids_are_an_error(v1) -> None:
    with pytest.raises(ValueError, match="'q1' appears more than once"):
        v1.compute(predictions=pred_rows({"q1": "x", "q2": "y"}), references=refs_rows({"q1": ["x"]}) * 2)


def test_v2_module_hand_computed(v2) -> None:
    result = v2.compute(predictions=pred_rows(V2_PREDS, V2_NA), references=refs_rows(V2_REFS), no_answer_threshold=0.5)
    assert_scores(result, V2_EXPECTED)


def test_v2_module_default_threshold_is_the_official_one(v2) -> None:
    # no_answer_threshold defaults to 1.0: no probability exceeds it, the raw 50 and 200/3 stand
    result = v2.compute(predictions=pred_rows(V2_PREDS, V2_NA), references=refs_rows(V2_REFS))
    assert (result["exact"], result["f1"]) == pytest.approx((50.0, 200 / 3), abs=TOL)


def test_v2_probabilities_stay_float64(v2) -> None:
    # p = 0.1 - 1e-12 does not exceed the threshold 0.1, so "Paris" stands (exact 100) and the best
    # threshold is p itself. As float32 (the hub's type) p would round to 0.10000000149 > 0.1: exact 0.
    p = 0.1 - 1e-12
    result = v2.compute(predictions=pred_rows({"x": "Paris"}, {"x": p}), references=refs_rows({"x": ["Paris"]}),
                        no_answer_threshold=0.1)
    assert (result["exact"], result["best_exact_thresh"]) == (100.0, p)


def test_v2_module_gold_that_normalizes_to_nothing(v2) -> None:
    # "The" -> "": HasAns (decided on the raw list), scored against "": the empty prediction gets 1, 1
    result = v2.compute(predictions=pred_rows({"e": ""}, {"e": 0.0}), references=refs_rows({"e": ["The"]}))
    assert (result["exact"], result["f1"], result["HasAns_total"]) == (100.0, 100.0, 1)
    assert "NoAns_total" not in result


def test_make_score_v1() -> None:
    score = make_score(False, 0.0)
    assert_scores(score(QAPredictions(answers={**V1_PREDS, "zz": "unknown id"}, nbest={}, null_odds=None), examples(V1_REFS)), V1_EXPECTED)


def test_make_score_v2_uses_the_run_threshold() -> None:
    score = make_score(True, 0.5)  # at 1.0 (the metric's default) exact would be 50, not 75
    assert_scores(score(QAPredictions(answers=V2_PREDS, nbest={}, null_odds=V2_NA), examples(V2_REFS)), V2_EXPECTED)


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


def test_the_hubs_squad_metric_takes_the_same_inputs() -> None:
    # HF's own `squad` metric module (what --squad_metric squad fetches), kept beside the checkout
    hub_squad = OFFICIAL_V11.parent
    if not (hub_squad / "squad.py").is_file():
        skip_or_fail(f"HF's squad metric module not found at {hub_squad}")
    score = make_score(False, 0.0, str(hub_squad))
    assert_scores(score(QAPredictions(answers={**V1_PREDS, "zz": "unknown id"}, nbest={}, null_odds=None), examples(V1_REFS)), V1_EXPECTED)
