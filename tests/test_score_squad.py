"""score_squad.py run as a real subprocess on tiny files (exit codes, stdout, stderr).

Expected numbers are the hand-computed ones of tests/unit/test_metric.py.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "score_squad.py"
DEV_V11 = ROOT.parent / "shared" / "data" / "squad-v1.1" / "dev-v1.1.json"
TOL = 1e-9


def run_cli(*args: Any, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True, text=True, encoding="utf-8", cwd=cwd, timeout=60,
    )


def dataset(questions: dict[str, list[str] | None]) -> dict:
    """Official nested layout; None -> unanswerable (v2 style)."""
    qas = []
    for qid, golds in questions.items():
        if golds is None:
            qas.append({"id": qid, "question": "?", "answers": [], "is_impossible": True})
        else:
            answers = [{"text": text, "answer_start": 0} for text in golds]
            qas.append({"id": qid, "question": "?", "answers": answers})
    paragraph = {"context": "c", "qas": qas}
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [paragraph]}]}


def write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return path


V1 = {
    "q1": ["Denver Broncos", "the Broncos"],
    "q2": ["Santa Clara, California", "Levi's Stadium"],
    "q3": ["1914—1918"],
    "q4": ["Paris"],
}
V1_PREDS = {"q1": "Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "1914-1918"}
# EM = 100 * 1/4 = 25; F1 = 100 * (1 + 4/7 + 0 + 0)/4 = 1100/28 (q4 missing)

V2 = {"a": ["Paris"], "b": ["the Eiffel Tower", "Eiffel"], "c": None, "d": None}
V2_PREDS = {"a": "Paris", "b": "Eiffel Tower in Paris", "c": "", "d": "London"}
V2_NA = {"a": 0.1, "b": 0.6, "c": 0.9, "d": 0.8}


@pytest.fixture()
def v1_files(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "dev.json", dataset(V1)), write(tmp_path / "preds.json", V1_PREDS)


# --------------------------------------------------------------------------- happy paths


def test_v1_scores_and_warns_about_missing(v1_files) -> None:
    data, preds = v1_files
    proc = run_cli(data, preds)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert list(result) == ["exact_match", "f1"]
    assert result["exact_match"] == pytest.approx(25.0, abs=TOL)
    assert result["f1"] == pytest.approx(1100 / 28, abs=TOL)
    assert "1 of 4 question(s)" in proc.stderr
    assert "'q4'" in proc.stderr and "score 0" in proc.stderr


def test_missing_warning_lists_at_most_five_ids(tmp_path: Path) -> None:
    questions = {f"q{i}": ["x"] for i in range(8)}
    data = write(tmp_path / "dev.json", dataset(questions))
    preds = write(tmp_path / "preds.json", {"q0": "x"})
    proc = run_cli(data, preds)
    assert proc.returncode == 0
    # 1 right of 8 -> EM = F1 = 100/8 = 12.5
    assert json.loads(proc.stdout) == {"exact_match": 12.5, "f1": 12.5}
    assert "7 of 8" in proc.stderr
    assert "'q5'" in proc.stderr and "'q6'" not in proc.stderr and "(2 more)" in proc.stderr


def test_v2_with_na_prob_file_and_out_file(tmp_path: Path) -> None:
    data = write(tmp_path / "dev.json", dataset(V2))
    preds = write(tmp_path / "preds.json", V2_PREDS)
    na = write(tmp_path / "na.json", V2_NA)
    out = tmp_path / "eval.json"
    proc = run_cli(data, preds, "--version_2_with_negative", "--na_prob_file", na,
                   "--na_prob_thresh", "0.5", "--out_file", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    result = json.loads(proc.stdout)
    # see test_score_v2_na_prob_threshold_and_best_thresh for the arithmetic
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
    assert json.loads(out.read_text(encoding="utf-8")) == result
    left = sorted(p.name for p in tmp_path.iterdir())  # no temp file left behind
    assert left == ["dev.json", "eval.json", "na.json", "preds.json"]


def test_v2_without_na_probs(tmp_path: Path) -> None:
    data = write(tmp_path / "dev.json", dataset(V2))
    preds = write(tmp_path / "preds.json", V2_PREDS)
    proc = run_cli(data, preds, "--version_2_with_negative")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # exact 50, f1 200/3, no best_* keys
    assert result["exact"] == pytest.approx(50.0, abs=TOL)
    assert result["f1"] == pytest.approx(200 / 3, abs=TOL)
    assert "best_f1" not in result


def test_unknown_ids_allowed_with_flag(v1_files) -> None:
    data, preds = v1_files
    write(preds, {**V1_PREDS, "zz1": "x"})
    proc = run_cli(data, preds, "--ignore_unknown_ids")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["exact_match"] == pytest.approx(25.0, abs=TOL)
    assert "warning" in proc.stderr and "'zz1'" in proc.stderr


def test_dataset_in_any_format_run_qa_reads(tmp_path: Path) -> None:
    # the reader training uses: flat records as JSON Lines and as CSV give the nested file's numbers
    preds = write(tmp_path / "preds.json", V1_PREDS)
    records = [{"id": qid, "answers": {"text": golds, "answer_start": [0] * len(golds)}} for qid, golds in V1.items()]
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    table = tmp_path / "dev.csv"
    with open(table, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["id", "answers"], *([r["id"], json.dumps(r["answers"])] for r in records)])
    for data in (jsonl, table):
        proc = run_cli(data, preds)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["exact_match"] == pytest.approx(25.0, abs=TOL)  # as test_v1_scores_and_warns_about_missing
        assert result["f1"] == pytest.approx(1100 / 28, abs=TOL)


def test_out_file_directory_is_created(v1_files, tmp_path: Path) -> None:
    data, preds = v1_files
    out = tmp_path / "scores" / "eval.json"
    proc = run_cli(data, preds, "--out_file", out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(proc.stdout)
    assert [p.name for p in out.parent.iterdir()] == ["eval.json"]  # no temp file left


def test_utf8_bom_is_accepted(v1_files) -> None:
    data, preds = v1_files
    preds.write_bytes(b"\xef\xbb\xbf" + preds.read_bytes())
    assert run_cli(data, preds).returncode == 0


# --------------------------------------------------------------------------- bad input


def _expect_input_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)


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
def test_bad_predictions_exit_2_and_write_nothing(v1_files, tmp_path: Path, case: str) -> None:
    data, preds = v1_files
    content, fragments = BAD_PREDICTIONS[case]
    if isinstance(content, bytes):
        preds.write_bytes(content)
    else:
        preds.write_text(content, encoding="utf-8")
    out = tmp_path / "eval.json"
    proc = run_cli(data, preds, "--out_file", out)
    _expect_input_error(proc, str(preds), *fragments)
    assert not out.exists()


BAD_DATASETS = {
    "no_data": ({"version": "1.1"}, ["'data'"]),
    "data_not_list": ({"data": {"title": "t"}}, ["'data'", "array"]),
    "missing_id": ({"data": [{"paragraphs": [{"qas": [{"answers": []}]}]}]},
                   ["data[0].paragraphs[0].qas[0]", "'id'"]),
    "answer_text_not_string": (
        {"data": [{"paragraphs": [{"qas": [{"id": "q1", "answers": [{"text": 3}]}]}]}]},
        ["'q1'", "'answers[0].text'"]),
    "no_questions": ({"data": []}, ["no questions"]),
    "v2_data_without_flag": (dataset({**V1, "q5": None}),
                             ["'q5'", "no gold answers", "--version_2_with_negative"]),
}


@pytest.mark.parametrize("case", sorted(BAD_DATASETS))
def test_bad_dataset_exit_2_and_write_nothing(v1_files, tmp_path: Path, case: str) -> None:
    data, preds = v1_files
    content, fragments = BAD_DATASETS[case]
    write(data, content)
    if case == "v2_data_without_flag":
        write(preds, {**V1_PREDS, "q5": ""})
    out = tmp_path / "eval.json"
    proc = run_cli(data, preds, "--out_file", out)
    _expect_input_error(proc, str(data), *fragments)
    assert not out.exists()


def test_missing_files_exit_2(v1_files, tmp_path: Path) -> None:
    data, preds = v1_files
    ghost = tmp_path / "nope.json"
    _expect_input_error(run_cli(ghost, preds), str(ghost), "dataset file not found")
    _expect_input_error(run_cli(data, ghost), str(ghost), "predictions file not found")
    _expect_input_error(run_cli(data, preds, "--version_2_with_negative", "--na_prob_file", ghost),
                        str(ghost), "na_prob file not found")


def test_truncated_dataset_names_line_and_column(v1_files) -> None:
    data, preds = v1_files
    data.write_text('{"data": [\n{"paragraphs": ', encoding="utf-8")
    _expect_input_error(run_cli(data, preds), str(data), "not valid JSON", "line 2, column")


@pytest.mark.parametrize(
    ("na_probs", "fragments"),
    [
        ({"a": 0.1, "b": "high", "c": 0.9, "d": 0.8}, ["id 'b'", "finite number", "string"]),
        ({"a": 0.1, "b": True, "c": 0.9, "d": 0.8}, ["id 'b'", "boolean"]),
        ({"a": 0.1, "c": 0.9, "d": 0.8}, ["1 predicted question", "'b'"]),
        ({**V2_NA, "zz": 0.5}, ["1 id(s)", "'zz'"]),
        ([0.1, 0.2], ["JSON object", "array"]),
    ],
)
def test_bad_na_prob_file_exit_2(tmp_path: Path, na_probs: Any, fragments: list[str]) -> None:
    data = write(tmp_path / "dev.json", dataset(V2))
    preds = write(tmp_path / "preds.json", V2_PREDS)
    na = write(tmp_path / "na.json", na_probs)
    out = tmp_path / "eval.json"
    proc = run_cli(data, preds, "--version_2_with_negative", "--na_prob_file", na,
                   "--out_file", out)
    _expect_input_error(proc, str(na), *fragments)
    assert not out.exists()


def test_na_prob_options_require_v2(v1_files, tmp_path: Path) -> None:
    data, preds = v1_files
    na = write(tmp_path / "na.json", {})
    for extra in (["--na_prob_file", na], ["--na_prob_thresh", "0.5"]):
        proc = run_cli(data, preds, *extra)
        assert proc.returncode == 2
        assert "--version_2_with_negative" in proc.stderr


def test_unwritable_out_file_exit_2(v1_files, tmp_path: Path) -> None:
    data, preds = v1_files
    target = tmp_path / "a_directory"
    target.mkdir()
    proc = run_cli(data, preds, "--out_file", target)
    _expect_input_error(proc, str(target), "cannot write output file")
    assert target.is_dir() and list(target.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_directory", "dev.json", "preds.json"]


def test_main_in_process_returns_exit_code(v1_files, capsys) -> None:
    import score_squad

    data, preds = v1_files
    assert score_squad.main([str(data), str(preds)]) == 0
    assert json.loads(capsys.readouterr().out)["exact_match"] == pytest.approx(25.0, abs=TOL)
    assert score_squad.main([str(data), str(data)]) == 2  # dataset is not a flat id -> text map


# --------------------------------------------------------------------------- real data


def test_dev_set_first_gold_answers_score_100(tmp_path: Path) -> None:
    if not DEV_V11.is_file():
        skip_or_fail(f"SQuAD dev set not found at ../shared/data/squad-v1.1/dev-v1.1.json: {DEV_V11}")
    official = json.loads(DEV_V11.read_text(encoding="utf-8"))
    preds = {
        qa["id"]: qa["answers"][0]["text"]
        for article in official["data"] for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }
    pred_file = write(tmp_path / "preds.json", preds)
    proc = run_cli(DEV_V11, pred_file)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"exact_match": 100.0, "f1": 100.0}
    assert proc.stderr == ""
