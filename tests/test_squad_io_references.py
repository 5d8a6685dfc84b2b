"""squad_io.load_references: what the scorer reads (id -> gold texts), from every format, errors named.

The scorer asks for what the official evaluation scripts read and nothing more: a unique
string id and the answers' texts. Context, question and answer_start are not looked at,
so a file those scripts score is never refused; a malformed id or answer still names
the file, the record and the field.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import needed_module
from qa_hpc.squad_io import DataError, load_qa_records, load_references


def _dataset(qas: list) -> dict:
    """The official nested layout with one article and one paragraph."""
    paragraph = {"context": "c", "qas": qas}
    return {"version": "x", "data": [{"title": "t", "paragraphs": [paragraph]}]}


def _write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_v1_and_v2_texts_in_file_order(tmp_path: Path) -> None:
    data = _dataset([
        {"id": "q1", "question": "?", "answers": [
            {"text": "Denver", "answer_start": 0}, {"text": "Denver", "answer_start": 0},
            {"text": "the Broncos", "answer_start": 5}]},
        {"id": "q2", "question": "?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "x", "answer_start": 0}]},
        {"id": "q3", "question": "?", "answers": [{"text": "y", "answer_start": 0}],
         "is_impossible": False},
    ])
    refs = load_references(_write(tmp_path / "dev.json", data))
    # duplicates kept, the unanswerable q2 maps to [] (its plausible answer is ignored)
    assert refs == {"q1": ["Denver", "Denver", "the Broncos"], "q2": [], "q3": ["y"]}
    assert list(refs) == ["q1", "q2", "q3"]


def test_only_ids_and_texts_are_required(tmp_path: Path) -> None:
    # What evaluate-v1.1.py scores without complaint: no context, no question, no
    # answer_start, a text that is not in the (absent) context, an empty text.
    data = {"data": [{"paragraphs": [{"qas": [
        {"id": "a", "answers": [{"text": "Paris"}, {"text": ""}]},
        {"id": "b", "answers": [{"text": "Seine", "answer_start": 999}]},
    ]}]}]}
    path = _write(tmp_path / "dev.json", data)
    assert load_references(path) == {"a": ["Paris", ""], "b": ["Seine"]}
    with pytest.raises(DataError):  # training, by contrast, needs every field
        load_qa_records(path, split="validation")


CASES = [
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
    (_dataset([{"id": "q1", "answers": []}, {"id": "q1", "answers": []}]),
     ["qas[1]", "duplicate", "'q1'", "qas[0]"]),
]


@pytest.mark.parametrize(("content", "fragments"), CASES)
def test_errors_name_file_record_and_field(tmp_path: Path, content: Any, fragments: list[str]) -> None:
    path = _write(tmp_path / "dev.json", content)
    with pytest.raises(DataError) as info:
        load_references(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_missing_file_is_named_as_the_dataset(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="dataset file not found") as info:
        load_references(tmp_path / "nope.json")
    assert str(tmp_path / "nope.json") in str(info.value)


# ----------------------------------------------------------------------- every format run_qa reads

EXPECTED = {"q1": ["Paris", "the city of Paris"], "q2": [], "q3": ["Seine"]}


def _flat_records() -> list[dict]:
    return [
        {"id": "q1", "answers": {"text": ["Paris", "the city of Paris"], "answer_start": [0, 5]}},
        {"id": "q2", "answers": {"text": [], "answer_start": []}},
        {"id": "q3", "answers": {"text": ["Seine"], "answer_start": [7]}},
    ]


def _csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([header, *rows])
    return path


def test_same_references_from_every_format(tmp_path: Path) -> None:
    recs = _flat_records()
    flat = _write(tmp_path / "flat.json", recs)
    hf = _write(tmp_path / "hf.json", {"version": "0.1", "data": recs})
    jsonl = tmp_path / "recs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    answers_json = _csv(tmp_path / "answers.csv", ["id", "answers"],
                        [[r["id"], json.dumps(r["answers"])] for r in recs])
    for path in (flat, hf, jsonl, answers_json):
        assert load_references(path) == EXPECTED, path
    # one answer per row: the texts are all a scorer reads, so answer_start may be left out
    pair = _csv(tmp_path / "pair.csv", ["id", "answer_text"], [["q1", "Paris"], ["q2", ""], ["q3", "Seine"]])
    assert load_references(pair) == {"q1": ["Paris"], "q2": [], "q3": ["Seine"]}


def test_parquet_references(tmp_path: Path) -> None:
    pa = needed_module("pyarrow")
    pq = needed_module("pyarrow.parquet")
    path = tmp_path / "dev.parquet"
    pq.write_table(pa.Table.from_pylist(_flat_records()), path)
    assert load_references(path) == EXPECTED


def test_csv_needs_an_id_column(tmp_path: Path) -> None:
    path = _csv(tmp_path / "dev.csv", ["qid", "answers"], [["q1", "[]"]])
    with pytest.raises(DataError, match=r"CSV line 1: field 'id': missing required column 'id'"):
        load_references(path)
