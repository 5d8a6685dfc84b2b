"""squad_io: every input format gives the same records; every bad input names file, record and field.

load_qa_records is what training reads; load_references what the scorer reads (a unique string id
and the answers' texts, nothing more, so a file the official scripts score is never refused).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import needed_module, shared_squad_file
from qa_hpc.squad_io import DataError, LoadReport, load_qa_records, load_references
from qa_hpc.tools.make_demo_data import generate_squad

# --------------------------------------------------------------------------- a small data set

HAND = [
    {  # non-ASCII text, a comma, quotes and a newline: CSV quoting and UTF-8 both matter
        "id": "hand-0",
        "title": "Zürich, \"quoted\"",
        "context": "Café Grüner opened in 1901.\nIts owner, Ana Núñez, sold \"strong\" coffee.",
        "question": "Who owned Café Grüner?",
        "answers": {"text": ["Ana Núñez"], "answer_start": [39]},
    },
    {
        "id": "hand-1",
        "title": "",
        "context": "The tower is 40 metres tall and was built in 1650.",
        "question": "How tall is the tower?",
        "answers": {"text": ["40 metres"], "answer_start": [13]},
    },
]


def _from_nested(ds: dict) -> list[dict]:
    out = []
    for art in ds["data"]:
        for par in art["paragraphs"]:
            for qa in par["qas"]:
                ans = [] if qa.get("is_impossible") else qa["answers"]
                out.append({"id": qa["id"], "title": art["title"], "context": par["context"],
                            "question": qa["question"],
                            "answers": {"text": [a["text"] for a in ans],
                                        "answer_start": [a["answer_start"] for a in ans]}})
    return out


def _records(v2: bool) -> list[dict]:
    recs = HAND + _from_nested(generate_squad(10, seed=5, with_impossible=v2, context_words=40))
    assert all(r["context"][s:s + len(t)] == t for r in recs
               for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"]))
    assert not v2 or any(not r["answers"]["text"] for r in recs)
    return recs


def _to_nested(recs: list[dict], v2: bool) -> dict:
    arts: dict[str, dict] = {}
    for r in recs:
        art = arts.setdefault(r["title"], {"title": r["title"], "paragraphs": []})
        if not art["paragraphs"] or art["paragraphs"][-1]["context"] != r["context"]:
            art["paragraphs"].append({"context": r["context"], "qas": []})
        ans = [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]
        qa = {"id": r["id"], "question": r["question"], "answers": ans}
        if v2:
            qa["is_impossible"] = not ans
            if not ans:  # official v2 keeps a plausible answer that must be ignored
                qa["plausible_answers"] = [{"text": r["context"][:5], "answer_start": 0}]
        art["paragraphs"][-1]["qas"].append(qa)
    return {"version": "v2.0" if v2 else "1.1", "data": list(arts.values())}


def _list_answers(r: dict) -> dict:
    return dict(r, answers=[{"text": t, "answer_start": s}
                            for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])])


def _csv_text(header: list[str], rows: list[list], lineterminator: str = "\r\n") -> str:
    buf = io.StringIO(newline="")
    w = csv.writer(buf, lineterminator=lineterminator)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def _write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.write_text(_csv_text(header, rows), encoding="utf-8", newline="")
    return path


def _parquet_bytes(rows: list[dict]) -> bytes:
    pa, pq = needed_module("pyarrow"), needed_module("pyarrow.parquet")
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def _pair_row(r: dict) -> list:
    t, s = r["answers"]["text"], r["answers"]["answer_start"]
    return [r["id"], r["title"], r["question"], r["context"], t[0] if t else "", s[0] if s else ""]


# format id -> (file name, bytes of the records in that form (recs, v2), the format the report names)
WRITERS = {
    "nested": ("nested.json", lambda recs, v2: json.dumps(_to_nested(recs, v2), indent=1, ensure_ascii=False).encode(),
               "squad-nested"),
    "flat_list": ("flat.json", lambda recs, v2: json.dumps(recs, ensure_ascii=False).encode(), "json"),
    "flat_list_of_answer_dicts": ("flat_listanswers.json",
                                  lambda recs, v2: json.dumps([_list_answers(r) for r in recs]).encode(), "json"),
    "hf_data": ("hf.json", lambda recs, v2: json.dumps({"version": "0.1", "data": recs}).encode(), "json"),
    "jsonl": ("recs.jsonl", lambda recs, v2: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode(),
              "jsonl"),
    "jsonl_as_json": ("lines.json", lambda recs, v2: ("\n".join(json.dumps(r) for r in recs) + "\n\n").encode(), "jsonl"),
    "csv_answers_json": ("answers_json.csv", lambda recs, v2: _csv_text(
        ["id", "title", "question", "context", "answers"],
        [[r["id"], r["title"], r["question"], r["context"], json.dumps(r["answers"])] for r in recs]).encode(), "csv"),
    "csv_pair": ("pair.csv", lambda recs, v2: _csv_text(
        ["id", "title", "question", "context", "answer_text", "answer_start"], [_pair_row(r) for r in recs]).encode(),
                 "csv"),
    "csv_bom_crlf": ("excel.csv", lambda recs, v2: b"\xef\xbb\xbf" + _csv_text(  # what Excel on Windows writes
        ["id", "question", "context", "answers", "title"],
        [[r["id"], r["question"], r["context"], json.dumps(_list_answers(r)["answers"]), r["title"]] for r in recs],
    ).encode(), "csv"),
    "parquet_struct": ("struct.parquet", lambda recs, v2: _parquet_bytes(recs), "parquet"),
    "parquet_list": ("list.parquet", lambda recs, v2: _parquet_bytes([_list_answers(r) for r in recs]), "parquet"),
    "parquet_json_string": ("jsonstr.parquet", lambda recs, v2: _parquet_bytes(
        [dict(r, answers=json.dumps(r["answers"])) for r in recs]), "parquet"),
}


def _write(tmp_path: Path, form: str, recs: list[dict], v2: bool = False) -> tuple[Path, str]:
    name, to_bytes, fmt = WRITERS[form]
    path = tmp_path / name
    path.write_bytes(to_bytes(recs, v2))
    return path, fmt


@pytest.mark.parametrize("v2", [False, True], ids=["v1.1", "v2.0"])
@pytest.mark.parametrize("form", list(WRITERS))
def test_every_format_loads_identical_records(tmp_path, form, v2):
    expected = _records(v2)
    path, fmt = _write(tmp_path, form, expected, v2)
    recs, rep = load_qa_records(path, version_2_with_negative=v2)
    assert recs == expected
    assert all(list(r) == ["id", "title", "context", "question", "answers"] for r in recs)
    assert all(list(r["answers"]) == ["text", "answer_start"] for r in recs)
    assert isinstance(rep, LoadReport)
    assert (rep.fmt, rep.n_records, rep.skipped, rep.fixed) == (fmt, len(expected), {}, 0)
    assert rep.n_impossible == sum(not r["answers"]["text"] for r in expected)
    assert rep.path == str(path)


@pytest.mark.parametrize("form", ["nested", "jsonl", "csv_answers_json", "parquet_list"])
def test_multiple_answers_all_kept_and_validated(tmp_path, form):
    ctx = "Rome was founded in 753 BC, or so the story says: 753 BC."
    rec = {"id": "m0", "title": "t", "context": ctx, "question": "When was Rome founded?",
           "answers": {"text": ["753 BC", "753", "753 BC"], "answer_start": [20, 20, 50]}}
    path, _ = _write(tmp_path, form, [rec])
    for split in ("train", "validation"):
        assert load_qa_records(path, split=split)[0] == [rec]
    path, _ = _write(tmp_path, form, [dict(rec, answers={"text": ["753 BC", "story"], "answer_start": [20, 3]})])
    with pytest.raises(DataError, match=r"answers\[1\]\.text|answer"):
        load_qa_records(path, split="train")


def test_test_split_allows_missing_answers(tmp_path):
    recs = [{k: v for k, v in r.items() if k != "answers"} for r in HAND]
    for name, body in [("t.json", json.dumps(recs)), ("t.jsonl", "\n".join(json.dumps(r) for r in recs))]:
        p = tmp_path / name
        p.write_text(body, encoding="utf-8")
        got, rep = load_qa_records(p, split="test")
        assert [r["id"] for r in got] == ["hand-0", "hand-1"]
        assert all(r["answers"] == {"text": [], "answer_start": []} for r in got)
        with pytest.raises(DataError, match="answers"):
            load_qa_records(p, split="train")
    p = _write_csv(tmp_path / "t.csv", ["id", "question", "context"], [[r["id"], r["question"], r["context"]] for r in recs])
    assert len(load_qa_records(p, split="test")[0]) == 2
    nested = _to_nested(HAND, False)
    for art in nested["data"]:
        for par in art["paragraphs"]:
            for qa in par["qas"]:
                del qa["answers"]
    p = tmp_path / "nested_test.json"
    p.write_text(json.dumps(nested), encoding="utf-8")
    assert len(load_qa_records(p, split="test")[0]) == 2


def test_summary_is_one_greppable_line(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps(HAND), encoding="utf-8")
    line = load_qa_records(p)[1].summary()
    assert "\n" not in line and line.startswith("DATA_LOADED ")
    assert f"file={p}" in line and "format=json" in line and "records=2" in line
    assert "skipped=0" in line and "fixed=0" in line


@pytest.mark.parametrize("kwargs,needle", [({"answer_check": "ignore"}, "answer_check"), ({"split": "dev"}, "split")])
def test_bad_options_are_value_errors(tmp_path, kwargs, needle):
    p = tmp_path / "d.json"
    p.write_text(json.dumps(HAND), encoding="utf-8")
    with pytest.raises(ValueError, match=needle):
        load_qa_records(p, **kwargs)


# --------------------------------------------------------------------------- bad input

CTX = "Paris is the capital of France. It lies on the Seine."


def _rec(i: int = 0, **kw) -> dict:
    r = {"id": f"q{i}", "title": "T", "context": CTX, "question": "What is the capital of France?",
         "answers": {"text": ["Paris"], "answer_start": [0]}}
    r.update(kw)
    return r


_DROP = object()


def _nested(*qas_kw: dict, context: str = CTX) -> dict:
    qas = []
    for i, kw in enumerate(qas_kw):
        qa = {"id": f"q{i}", "question": "What is the capital of France?",
              "answers": [{"text": "Paris", "answer_start": 0}]}
        qa.update(kw)
        qas.append({k: v for k, v in qa.items() if v is not _DROP})
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


def _articles(count: int, broken: dict[int, dict]) -> bytes:
    """``count`` articles of the official layout (ids unique across them), article i replaced by broken[i]."""
    data = []
    for i in range(count):
        qa = {"id": f"a{i}", "question": "What is the capital of France?",
              "answers": [{"text": "Paris", "answer_start": 0}]}
        data.append(broken.get(i, {"title": f"T{i}", "paragraphs": [{"context": CTX, "qas": [qa]}]}))
    return _json({"version": "1.1", "data": data})


def _drop(r: dict, key: str) -> dict:
    return {k: v for k, v in r.items() if k != key}


def _json(obj) -> bytes:
    return json.dumps(obj).encode("utf-8")


def _csv_bytes(header, rows) -> bytes:
    return _csv_text(header, rows).encode("utf-8")


# (case id, file name, content bytes or a callable producing them, kwargs, substrings the message must hold)
BAD = [
    ("invalid_utf8", "latin1.json", b'[{"id": "q0", "context": "caf\xe9"}]', {}, ["byte offset 29", "UTF-8"]),
    ("truncated_json", "cut.json", _json(_nested({}))[:-9], {}, ["line 1, column", "truncated"]),
    ("not_json", "notes.json", b"id,question\nq1,hello\n", {}, ["not valid JSON", "line 1, column 1"]),
    ("top_level_string", "str.json", b'"hello"', {}, ["top-level", "found a str", "expected"]),
    ("top_level_object_no_data", "obj.json", _json({"articles": []}), {},
     ["top-level", "'articles'", "expected", "data"]),
    ("top_level_single_record", "one.json", _json(_rec()), {}, ["a single record", "expected"]),
    ("data_not_list", "d.json", _json({"data": {"x": 1}}), {}, ["'data'", "found an object", "expected"]),
    ("nested_missing_id", "n.json", _json(_nested({}, {"id": _DROP})), {},
     ["data[0].paragraphs[0].qas[1]", "'id'", "missing"]),
    ("nested_int_id", "n.json", _json(_nested({"id": 17})), {}, ["data[0].paragraphs[0].qas[0]", "'id'", "int"]),
    ("nested_missing_question", "n.json", _json(_nested({"question": _DROP})), {}, ["'q0'", "'question'"]),
    ("nested_missing_context", "n.json",
     _json({"data": [{"title": "T", "paragraphs": [{"qas": [{"id": "q0"}]}]}]}), {},
     ["data[0].paragraphs[0]", "'context'", "missing"]),
    # the layout is read from every article: a broken first article is still reported as an article
    ("nested_first_article_misspelt", "n.json",
     lambda: _articles(3, {0: {"title": "T0", "paragraph": [{"context": CTX, "qas": []}]}}), {},
     ["data[0]: field 'paragraphs': missing", "'paragraph'"]),
    ("nested_first_article_without_paragraphs", "n.json", lambda: _articles(3, {0: {"title": "T0"}}), {},
     ["data[0]: field 'paragraphs': missing", "['title']"]),
    ("nested_later_article_misspelt", "n.json", lambda: _articles(3, {2: {"title": "T2", "paragraph": []}}), {},
     ["data[2]: field 'paragraphs': missing", "'paragraph'"]),
    ("flat_first_record_only_title", "f.json", _json([{"title": "T"}, _rec(1), _rec(2)]), {},
     ["[0]: field 'id': missing", "['title']"]),
    ("nested_missing_answers_train", "n.json", _json(_nested({"answers": _DROP})), {},
     ["'q0'", "'answers'", "test"]),
    ("nested_empty_question", "n.json", _json(_nested({"question": "   \n"})), {}, ["'q0'", "'question'", "empty"]),
    ("nested_empty_context", "n.json", _json(_nested({}, context=" \t ")), {}, ["'q0'", "'context'", "empty"]),
    ("nested_start_is_string", "n.json", _json(_nested({"answers": [{"text": "Paris", "answer_start": "0"}]})),
     {}, ["'q0'", "answers[0].answer_start", "integer"]),
    ("nested_start_out_of_range", "n.json",
     _json(_nested({"answers": [{"text": "Paris", "answer_start": 999}]})), {},
     ["'q0'", "answers[0].answer_start", "out of range", "999"]),
    ("nested_negative_start", "n.json", _json(_nested({"answers": [{"text": "Paris", "answer_start": -1}]})),
     {}, ["'q0'", "answer_start", "out of range"]),
    ("nested_text_not_at_start", "n.json",
     _json(_nested({}, {"answers": [{"text": "France", "answer_start": 3}]})), {},
     ["'q1'", "answers[0].text", "not found at answer_start 3", "fix"]),
    ("nested_second_answer_bad", "n.json",
     _json(_nested({"answers": [{"text": "Paris", "answer_start": 0}, {"text": "Seine", "answer_start": 0}]})),
     {"split": "validation"}, ["'q0'", "answers[1].text"]),
    ("nested_duplicate_id", "n.json", _json(_nested({}, {}, {"id": "q0"})), {},
     ["duplicate id 'q0'", "data[0].paragraphs[0].qas[0]", "data[0].paragraphs[0].qas[2]"]),
    ("nested_impossible_without_v2", "n.json", _json(_nested({"answers": [], "is_impossible": True})), {},
     ["'q0'", "'is_impossible'", "version_2_with_negative"]),
    ("nested_is_impossible_not_bool", "n.json", _json(_nested({"is_impossible": "yes"})),
     {"version_2_with_negative": True}, ["'q0'", "'is_impossible'"]),
    ("flat_no_answers_v1_validation", "f.json", _json([_rec(0), _rec(1, answers={"text": [], "answer_start": []})]),
     {"split": "validation"}, ["[1]", "'q1'", "'answers'", "version_2_with_negative"]),
    ("flat_context_not_string", "f.json", _json([_rec(0, context=["a", "b"])]), {},
     ["[0]", "'q0'", "'context'", "list"]),
    ("flat_answer_lists_mismatch", "f.json", _json([_rec(0, answers={"text": ["Paris"], "answer_start": []})]),
     {}, ["'q0'", "answers.answer_start", "1 texts but 0"]),
    ("flat_answers_missing_key", "f.json", _json([_rec(0, answers={"text": ["Paris"]})]), {},
     ["'q0'", "answers.answer_start", "missing"]),
    ("flat_record_not_object", "f.json", _json([_rec(0), "q1"]), {}, ["[1]", "found a str"]),
    ("hf_data_missing_question", "hf.json", _json({"data": [_rec(0), _drop(_rec(1), "question")]}), {},
     ["data[1]", "'q1'", "'question'"]),
    ("jsonl_bad_line", "r.jsonl", (json.dumps(_rec(0)) + "\n" + json.dumps(_rec(1)) + "\n{\"id\": \"q2\",\n").encode(),
     {}, ["line 3", "not valid JSON"]),
    ("jsonl_duplicate_id", "r.jsonl", (json.dumps(_rec(0)) + "\n\n" + json.dumps(_rec(0)) + "\n").encode(), {},
     ["duplicate id 'q0'", "line 1", "line 3", "'id'"]),
    ("csv_missing_column", "c.csv", _csv_bytes(["id", "question", "answers"], [["q0", "?", "{}"]]), {},
     ["'context'", "columns found", "'id', 'question', 'answers'"]),
    ("csv_pair_start_not_int", "c.csv",
     _csv_bytes(["id", "question", "context", "answer_text", "answer_start"],
                [["q0", "Capital?", CTX, "Paris", "0"], ["q1", "Capital?", CTX, "Paris", "zero"]]), {},
     ["CSV line 3", "'q1'", "'answer_start'", "integer"]),
    ("csv_pair_text_not_at_start", "c.csv",
     _csv_bytes(["id", "question", "context", "answer_text", "answer_start"],
                [["q0", "Capital?", CTX, "Paris", "0"], ["q1", "River?", CTX, "Seine", "40"]]), {},
     ["CSV line 3", "'q1'", "'answer_text'", "not found at answer_start 40"]),
    ("csv_answers_bad_json", "c.csv",
     _csv_bytes(["id", "question", "context", "answers"], [["q0", "Capital?", CTX, "{'text': ['Paris']}"]]), {},
     ["CSV line 2", "'q0'", "'answers'", "not valid JSON"]),
    ("csv_empty_question", "c.csv",
     _csv_bytes(["id", "question", "context", "answer_text", "answer_start"], [["q0", " ", CTX, "Paris", "0"]]),
     {}, ["CSV line 2", "'q0'", "'question'", "empty"]),
    ("parquet_missing_column", "p.parquet", lambda: _parquet_bytes([_drop(_rec(0), "question")]), {},
     ["'question'", "columns found"]),
    ("parquet_int_id", "p.parquet", lambda: _parquet_bytes([_rec(0, id=5)]), {}, ["row 0", "'id'", "int"]),
    ("parquet_text_not_at_start", "p.parquet",
     lambda: _parquet_bytes([_rec(0), _rec(1, answers={"text": ["Seine"], "answer_start": [3]})]), {},
     ["row 1", "'q1'", "answers[0].text"]),
    ("not_parquet", "x.parquet", b"this is not parquet", {}, ["Parquet"]),
    ("empty_list", "e.json", b"[]", {}, ["no records"]),
]


@pytest.mark.parametrize("case_id,name,content,kwargs,needles", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_named(tmp_path, case_id, name, content, kwargs, needles):
    path = tmp_path / name
    path.write_bytes(content() if callable(content) else content)
    with pytest.raises(DataError) as ei:
        load_qa_records(path, **kwargs)
    msg = str(ei.value)
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in: {msg}"


@pytest.mark.parametrize("load,what", [(load_qa_records, "not found"), (load_references, "dataset file not found")])
def test_missing_file_and_directory(tmp_path, load, what):
    with pytest.raises(DataError, match=what) as ei:
        load(tmp_path / "nope.json")
    assert str(tmp_path / "nope.json") in str(ei.value)
    (tmp_path / "train.json").write_text(json.dumps([_rec()]), encoding="utf-8")
    with pytest.raises(DataError, match="directory") as ei:
        load(tmp_path)
    assert str(tmp_path) in str(ei.value) and "train.json" in str(ei.value)


# --------------------------------------------------------------------------- answer_check


def _fixable(tmp_path) -> Path:
    ctx = "Bern is a city. Bern has a bear park. The river is the Aare."
    recs = [
        _rec(0, context=ctx, answers={"text": ["Bern"], "answer_start": [0]}),  # fine
        _rec(1, context=ctx, answers={"text": ["Bern"], "answer_start": [18]}),  # nearest is 16
        _rec(2, context=ctx, answers={"text": ["Aare", "the Aare"], "answer_start": [54, 52]}),  # both off by 1
        _rec(3, context=ctx, answers={"text": ["Bern"], "answer_start": [5]}),  # nearest is 0 (5 vs 11)
    ]
    p = tmp_path / "fix.json"
    p.write_text(json.dumps(recs), encoding="utf-8")
    return p


def test_answer_check_fix(tmp_path):
    recs, rep = load_qa_records(_fixable(tmp_path), answer_check="fix")
    assert [r["answers"]["answer_start"] for r in recs] == [[0], [16], [55, 51], [0]]
    assert all(r["context"][s:s + len(t)] == t for r in recs
               for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"]))
    assert rep.fixed == 4 and rep.skipped == {} and rep.n_records == 4
    assert "fixed=4" in rep.summary()


def test_answer_check_skip(tmp_path):
    recs, rep = load_qa_records(_fixable(tmp_path), answer_check="skip")
    assert [r["id"] for r in recs] == ["q0"]
    assert rep.skipped == {"answer_not_at_start": 3} and rep.fixed == 0 and rep.n_records == 1
    assert "skipped=3" in rep.summary() and "skipped_answer_not_at_start=3" in rep.summary()


def test_answer_check_error_is_default(tmp_path):
    with pytest.raises(DataError, match=r"'q1'.*answers\[0\]\.text.*does occur at 16"):
        load_qa_records(_fixable(tmp_path))


def test_fix_still_raises_when_text_is_absent(tmp_path):
    p = tmp_path / "absent.json"
    p.write_text(json.dumps([_rec(0), _rec(1, answers={"text": ["Lyon"], "answer_start": [0]})]), encoding="utf-8")
    with pytest.raises(DataError, match=r"'q1'.*answers\[0\]\.text.*does not occur"):
        load_qa_records(p, answer_check="fix")
    recs, rep = load_qa_records(p, answer_check="skip")
    assert [r["id"] for r in recs] == ["q0"] and rep.skipped == {"answer_not_at_start": 1}


@pytest.mark.parametrize("mode", ["fix", "skip"])
def test_check_modes_do_not_relax_other_errors(tmp_path, mode):
    p = tmp_path / "range.json"
    p.write_text(json.dumps([_rec(0, answers={"text": ["Paris"], "answer_start": [500]})]), encoding="utf-8")
    with pytest.raises(DataError, match="out of range"):
        load_qa_records(p, answer_check=mode)


# --------------------------------------------------------------------------- real SQuAD v1.1


@pytest.mark.parametrize("name,split,n,titles", [("dev-v1.1.json", "validation", 10570, 48),
                                                 ("train-v1.1.first44articles.json", "train", 11877, 44)])
def test_real_squad(name, split, n, titles):
    recs, rep = load_qa_records(shared_squad_file(name), split=split)
    assert rep.n_records == len(recs) == n
    assert len({r["title"] for r in recs}) == titles
    assert (rep.fmt, rep.n_impossible, rep.skipped, rep.fixed) == ("squad-nested", 0, {}, 0)
    assert split == "train" or sum(len(r["answers"]["text"]) > 1 for r in recs) > 5000


# --------------------------------------------------------------------------- detection details


def test_gzip_and_sniffed_extensions(tmp_path):
    recs = _records(False)
    p = tmp_path / "train.json.gz"
    p.write_bytes(gzip.compress(json.dumps(_to_nested(recs, False)).encode("utf-8")))
    got, rep = load_qa_records(p)
    assert got == recs and rep.fmt == "squad-nested"
    p = tmp_path / "records.txt"  # unknown extension, JSON content
    p.write_text(json.dumps(recs), encoding="utf-8")
    assert load_qa_records(p)[0] == recs
    p = tmp_path / "notes.txt"
    p.write_text("just some words\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"notes\.txt.*cannot tell the format"):
        load_qa_records(p)


def test_pretty_printed_json_named_jsonl(tmp_path):
    p = tmp_path / "pretty.jsonl"
    p.write_text(json.dumps(HAND, indent=2), encoding="utf-8")
    recs, rep = load_qa_records(p)
    assert recs == HAND and rep.fmt == "json"


@pytest.mark.parametrize("last_row,needles", [
    (["b", "Who?", "x", "Bob", "0", "extra"], ["CSV line 5", "6 fields but the header has 5"]),
    (["b", "Who?", "Bob did.", "Bob", ""], ["CSV line 5 (id 'b'): field 'answer_start': is empty"]),
])
def test_csv_line_numbers_count_multiline_fields(tmp_path, last_row, needles):
    p = _write_csv(tmp_path / "multi.csv", ["id", "question", "context", "answer_text", "answer_start"],
                   [["a", "Who owned it?", "Line one\nline two\nAna owned it.", "Ana", "18"], last_row])
    with pytest.raises(DataError) as ei:
        load_qa_records(p)
    assert all(needle in str(ei.value) for needle in needles), str(ei.value)


# --------------------------------------------------------------------------- what the scorer reads


def _dataset(qas: list) -> dict:
    """The official nested layout with one article and one paragraph."""
    return {"version": "x", "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}


def _write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_references_v1_and_v2_texts_in_file_order(tmp_path):
    data = _dataset([
        {"id": "q1", "question": "?", "answers": [
            {"text": "Denver", "answer_start": 0}, {"text": "Denver", "answer_start": 0},
            {"text": "the Broncos", "answer_start": 5}]},
        {"id": "q2", "question": "?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "x", "answer_start": 0}]},
        {"id": "q3", "question": "?", "answers": [{"text": "y", "answer_start": 0}], "is_impossible": False},
    ])
    refs = load_references(_write_json(tmp_path / "dev.json", data))
    # duplicates kept, the unanswerable q2 maps to [] (its plausible answer is ignored)
    assert refs == {"q1": ["Denver", "Denver", "the Broncos"], "q2": [], "q3": ["y"]}
    assert list(refs) == ["q1", "q2", "q3"]


def test_references_need_only_ids_and_texts(tmp_path):
    # What evaluate-v1.1.py scores without complaint: no context, no question, no
    # answer_start, a text that is not in the (absent) context, an empty text.
    data = {"data": [{"paragraphs": [{"qas": [
        {"id": "a", "answers": [{"text": "Paris"}, {"text": ""}]},
        {"id": "b", "answers": [{"text": "Seine", "answer_start": 999}]},
    ]}]}]}
    path = _write_json(tmp_path / "dev.json", data)
    assert load_references(path) == {"a": ["Paris", ""], "b": ["Seine"]}
    with pytest.raises(DataError):  # training, by contrast, needs every field
        load_qa_records(path, split="validation")


REFERENCE_ERRORS = [
    # an empty array is an empty list of flat records (every format is read now): no questions
    ([], ["no questions"]),
    ({"version": "1.1"}, ["top-level", "'data'"]),
    ({"data": {}}, ["'data'", "array"]),
    ({"data": [{"title": "t"}]}, ["data[0]", "'paragraphs'"]),
    ({"data": []}, ["no questions"]),
    # a nested file whose first article is broken is still read (and reported) as nested
    ({"data": [{"title": "A", "paragraph": []}, _dataset([{"id": "q1", "answers": []}])["data"][0]]},
     ["data[0]: field 'paragraphs': missing", "'paragraph'"]),
    (_dataset([{"question": "?", "answers": []}]), ["data[0].paragraphs[0].qas[0]", "'id'"]),
    (_dataset([{"id": 7, "answers": []}]), ["qas[0]", "'id'", "string", "int"]),
    (_dataset([{"id": "q1"}]), ["qas[0] (id 'q1')", "'answers'"]),
    (_dataset([{"id": "q1", "answers": [{"answer_start": 0}]}]), ["q1", "'answers[0].text'", "missing"]),
    (_dataset([{"id": "q1", "answers": [{"text": 3}]}]), ["q1", "'answers[0].text'", "string"]),
    (_dataset([{"id": "q1", "answers": "Paris"}]), ["q1", "'answers'", "str"]),
    (_dataset([{"id": "q1", "answers": [], "is_impossible": "yes"}]), ["q1", "'is_impossible'"]),
    (_dataset([{"id": "q1", "answers": []}, {"id": "q1", "answers": []}]), ["qas[1]", "duplicate", "'q1'", "qas[0]"]),
]


@pytest.mark.parametrize(("content", "fragments"), REFERENCE_ERRORS)
def test_reference_errors_name_file_record_and_field(tmp_path, content, fragments):
    path = _write_json(tmp_path / "dev.json", content)
    with pytest.raises(DataError) as info:
        load_references(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_same_references_from_every_format(tmp_path):
    recs = [{"id": "q1", "answers": {"text": ["Paris", "the city of Paris"], "answer_start": [0, 5]}},
            {"id": "q2", "answers": {"text": [], "answer_start": []}},
            {"id": "q3", "answers": {"text": ["Seine"], "answer_start": [7]}}]
    files = {"flat.json": json.dumps(recs).encode(), "hf.json": json.dumps({"version": "0.1", "data": recs}).encode(),
             "recs.jsonl": "".join(json.dumps(r) + "\n" for r in recs).encode(),
             "answers.csv": _csv_bytes(["id", "answers"], [[r["id"], json.dumps(r["answers"])] for r in recs]),
             "dev.parquet": _parquet_bytes(recs)}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        assert load_references(tmp_path / name) == {"q1": ["Paris", "the city of Paris"], "q2": [], "q3": ["Seine"]}
    # one answer per row: the texts are all a scorer reads, so answer_start may be left out
    pair = _write_csv(tmp_path / "pair.csv", ["id", "answer_text"], [["q1", "Paris"], ["q2", ""], ["q3", "Seine"]])
    assert load_references(pair) == {"q1": ["Paris"], "q2": [], "q3": ["Seine"]}


def test_references_csv_needs_an_id_column(tmp_path):
    path = _write_csv(tmp_path / "dev.csv", ["qid", "answers"], [["q1", "[]"]])
    with pytest.raises(DataError, match=r"CSV line 1: field 'id': missing required column 'id'"):
        load_references(path)
