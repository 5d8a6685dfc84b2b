"""squad_io: every input format gives the same records; any other format is refused naming the ones read;
every bad input names file, record and field. The scorer's load_references needs only a unique string id and
the answers' texts, so a file the official scripts score is never refused."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from conftest import shared_squad_file

from qa_hpc.squad_io import DataError, load_qa_records, load_references

CTX = "Paris is the capital of France. It lies on the Seine."
_DROP = object()


def _rec(i: int = 0, **kw) -> dict:
    """A flat record; a value _DROP leaves its key out."""
    r = {
        "id": f"q{i}",
        "title": "T",
        "context": CTX,
        "question": "What is the capital of France?",
        "answers": {"text": ["Paris"], "answer_start": [0]},
        **kw,
    }
    return {k: v for k, v in r.items() if v is not _DROP}


RECORDS = [  # non-ASCII text, a comma, quotes and a newline: JSON escapes and UTF-8 both matter
    _rec(
        0,
        title='Zürich, "quoted"',
        context='Café Grüner opened in 1901.\nIts owner, Ana Núñez, sold "strong" coffee.',
        question="Who owned Café Grüner?",
        answers={"text": ["Ana Núñez"], "answer_start": [39]},
    ),
    _rec(1, title=""),
    # the same paragraph
    _rec(2, title="", question="Which river?", answers={"text": ["Seine"], "answer_start": [47]}),
]
IMPOSSIBLE = _rec(3, title="", context="No answer here.", answers={"text": [], "answer_start": []})


def _pairs(r: dict) -> list[dict]:
    return [
        {"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])
    ]


def _nested(recs: list[dict], v2: bool = False) -> dict:
    """The official layout: one article per title, one paragraph per run of equal contexts."""
    arts: dict[str, dict] = {}
    for r in recs:
        art = arts.setdefault(r["title"], {"title": r["title"], "paragraphs": []})
        if not art["paragraphs"] or art["paragraphs"][-1]["context"] != r["context"]:
            art["paragraphs"].append({"context": r["context"], "qas": []})
        qa = {k: v for k, v in r.items() if k not in ("title", "context", "answers")}
        if "answers" in r:
            qa["answers"] = r["answers"] if isinstance(r["answers"], list) else _pairs(r)
        if v2:  # official v2 keeps a plausible answer that must be ignored
            qa.update(is_impossible=not qa["answers"], plausible_answers=[{"text": "No", "answer_start": 0}])
        art["paragraphs"][-1]["qas"].append(qa)
    return {"version": "v2.0" if v2 else "1.1", "data": list(arts.values())}


def _j(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


# format id -> (file name, records -> bytes, the format the report names)
FORMATS = {
    "nested": ("nested.json", lambda recs, v2: _j(_nested(recs, v2)), "squad-nested"),
    "flat_list": ("flat.json", lambda recs, v2: _j(recs), "json"),
    "flat_answer_objects": (
        "objs.json",
        lambda recs, v2: _j([dict(r, answers=_pairs(r)) for r in recs]),
        "json",
    ),
    "hf_data": ("hf.json", lambda recs, v2: _j({"version": "0.1", "data": recs}), "json"),
    "sniffed_txt": ("records.txt", lambda recs, v2: _j(recs), "json"),
    "pretty_json_named_jsonl": ("pretty.jsonl", lambda recs, v2: json.dumps(recs, indent=2).encode(), "json"),
    "jsonl": ("recs.jsonl", lambda recs, v2: b"".join(_j(r) + b"\n" for r in recs), "jsonl"),
    "jsonl_as_json": ("lines.json", lambda recs, v2: b"\n".join(_j(r) for r in recs) + b"\n\n", "jsonl"),
    "ndjson": ("recs.ndjson", lambda recs, v2: b"".join(_j(r) + b"\n" for r in recs), "jsonl"),
}


def test_json_lines_end_records_at_newlines_only(tmp_path):
    """U+2028, U+2029 and U+0085 may stand unescaped inside a JSON string (json.dumps(ensure_ascii=False)
    writes them so): they end no record, and a broken line is still named by its newline-counted number,
    with json's message read once ("starting at column", not "starting at at column")."""
    separated = [dict(RECORDS[0], question=f"Who{sep}wrote it?") for sep in ("\u2028", "\u2029", "\x85")]
    recs = [dict(r, id=f"s{i}") for i, r in enumerate(separated)]
    path = tmp_path / "recs.jsonl"
    path.write_bytes(b"".join(_j(r) + b"\n" for r in recs))
    assert load_qa_records(path)[0] == recs
    path.write_bytes(b"".join(_j(r) + b"\n" for r in recs) + b'{"id": "s3", "question": "Who\xe2\x80\xa8\n')
    with pytest.raises(DataError) as err:
        load_qa_records(path)
    assert "line 4: not valid JSON: Unterminated string starting at column 26" in str(err.value), err.value


def _write(tmp_path: Path, form: str, recs: list[dict], v2: bool = False) -> Path:
    name, to_bytes, _ = FORMATS[form]
    (tmp_path / name).write_bytes(to_bytes(recs, v2))
    return tmp_path / name


@pytest.mark.parametrize("v2", [False, True], ids=["v1.1", "v2.0"])
@pytest.mark.parametrize("form", list(FORMATS))
def test_every_format_gives_the_same_records_and_references(tmp_path, form, v2):
    expected = RECORDS + [IMPOSSIBLE] * v2
    path = _write(tmp_path, form, expected, v2)
    recs, rep = load_qa_records(path, version_2_with_negative=v2)
    assert recs == expected
    assert (rep.path, rep.fmt, rep.n_records, rep.n_impossible, rep.skipped, rep.fixed) == (
        str(path),
        FORMATS[form][2],
        len(expected),
        int(v2),
        {},
        0,
    )
    assert load_references(path) == {r["id"]: r["answers"]["text"] for r in expected}


@pytest.mark.parametrize("wrapped", [True, False], ids=["data", "list"])
def test_nested_articles_with_ids_of_their_own_are_articles(tmp_path, wrapped):
    """CMRC2018 and DRCD give each article (and paragraph) an "id" of its own, as a flat record has: such a
    file is still the official layout, which evaluate-v1.1.py scores, not flat records."""
    nested = _nested(RECORDS)
    for a, art in enumerate(nested["data"]):
        art["id"] = f"ART_{a}"
        for p, para in enumerate(art["paragraphs"]):
            para["id"] = f"ART_{a}_P{p}"
    path = tmp_path / "cmrc.json"
    path.write_bytes(_j(nested if wrapped else nested["data"]))
    recs, rep = load_qa_records(path)
    assert recs == RECORDS
    assert (rep.fmt, rep.n_records) == ("squad-nested", len(RECORDS))
    assert load_references(path) == {r["id"]: r["answers"]["text"] for r in RECORDS}


@pytest.mark.parametrize("form", ["nested", "jsonl", "flat_answer_objects"])
def test_multiple_answers_all_kept_and_each_checked(tmp_path, form):
    rec = _rec(
        0,
        context="Rome was founded in 753 BC, or so the story says: 753 BC.",
        answers={"text": ["753 BC", "753", "753 BC"], "answer_start": [20, 20, 50]},
    )
    assert load_qa_records(_write(tmp_path, form, [rec]))[0] == [rec]
    path = _write(tmp_path, form, [dict(rec, answers={"text": ["753 BC", "story"], "answer_start": [20, 3]})])
    with pytest.raises(
        DataError, match=r"\(id 'q0'\): field 'answers\[1\]\.text': answer text 'story' not found"
    ):
        load_qa_records(path)


@pytest.mark.parametrize("form", ["nested", "flat_list", "jsonl"])
def test_test_split_may_leave_answers_out(tmp_path, form):
    path = _write(tmp_path, form, [_rec(i, answers=_DROP) for i in range(2)])
    recs, _ = load_qa_records(path, split="test")
    assert [(r["id"], r["answers"]) for r in recs] == [
        (f"q{i}", {"text": [], "answer_start": []}) for i in range(2)
    ]
    with pytest.raises(DataError, match="answers"):
        load_qa_records(path, split="train")


def test_a_test_file_is_scored_with_answers_for_all_records_or_predicted_for_none(tmp_path):
    """Unlabelled test records (no 'answers') make the file predicted, not scored; a file that mixes them with
    labelled ones is refused, naming the first (those would be scored as wrong answers); labelled test
    records are checked as any split's, an empty answer list without --version_2_with_negative too."""
    none = _write(tmp_path, "flat_list", [_rec(i, answers=_DROP) for i in range(2)])
    loaded = load_qa_records(none, split="test")[1]
    assert not loaded.scorable and loaded.summary().endswith("impossible=0 skipped=0 fixed=0 unlabelled=2")
    assert load_qa_records(_write(tmp_path, "jsonl", RECORDS), split="test")[1].scorable
    mixed = _write(tmp_path, "nested", [RECORDS[0], _rec(1, answers=_DROP), _rec(2, answers=_DROP)])
    with pytest.raises(DataError) as err:
        load_qa_records(mixed, split="test")
    assert str(err.value) == (
        f"{mixed}: 2 of 3 records have no 'answers' (the first: data[1].paragraphs[0].qas[0] (id 'q1')); "
        "a test file is scored when every record has answers and only predicted when none has: give them "
        "to all records or to none"
    )
    empty = _write(tmp_path, "flat_list", [IMPOSSIBLE])
    with pytest.raises(DataError, match="field 'answers': record has no answer .*--version_2_with_negative"):
        load_qa_records(empty, split="test")


@pytest.mark.parametrize("form", ["flat_list", "jsonl"])
def test_flat_records_say_unanswerable_with_is_impossible_as_nested_ones_do(tmp_path, form):
    """A flattened SQuAD 2.0 record: is_impossible true, its span under plausible_answers, no answers."""
    flat_v2 = dict(IMPOSSIBLE, is_impossible=True, plausible_answers=[{"text": "No", "answer_start": 0}])
    del flat_v2["answers"]
    path = _write(tmp_path, form, RECORDS + [flat_v2])
    recs, rep = load_qa_records(path, version_2_with_negative=True)
    assert recs == RECORDS + [IMPOSSIBLE] and rep.n_impossible == 1
    with pytest.raises(
        DataError, match=r"\(id 'q3'\): field 'is_impossible': record has no answer \(is_impossible"
    ):
        load_qa_records(path)


@pytest.mark.parametrize("kwargs", [{"answer_check": "ignore"}, {"split": "dev"}])
def test_bad_options_are_value_errors(tmp_path, kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        load_qa_records(_write(tmp_path, "flat_list", RECORDS), **kwargs)


# --------------------------------------------------------------------------- bad input


def _ans(text: str, start) -> dict:
    return {"answers": {"text": [text], "answer_start": [start]}}


def _qas(*qas: dict) -> dict:
    """The official layout: one article, one paragraph, these questions."""
    return {"version": "x", "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": list(qas)}]}]}


QAS = "data[0].paragraphs[0].qas"
REF = {"load": load_references}  # what the scorer reads
# what the error for any other format names: every format that is read
READ = (
    "the formats read are the official nested SQuAD JSON (v1.1, v2.0), flat JSON (a list of records or "
    '{"data": [records]}) and JSON Lines (.jsonl, .ndjson): convert the file to one of them',
)


def _case(case: str, name: str, content, *fragments: str, load=load_qa_records, **kwargs):
    """A file ``name`` holding ``content`` (bytes or a JSON value); what the message holds after "path: "."""
    return pytest.param(name, content, load, kwargs, fragments, id=case)


BAD = [  # the cases docs/REFERENCE.md lists first: each names the record (position and id) and the field
    _case(
        "missing_context",
        "n.json",
        {"data": [{"title": "T", "paragraphs": [{"qas": [{"id": "q0"}]}]}]},
        "data[0].paragraphs[0]: field 'context': missing (paragraph has keys ['qas'])",
    ),
    _case(
        "missing_question",
        "f.json",
        [_rec(0), _rec(1, question=_DROP)],
        "[1] (id 'q1'): field 'question': missing (record has keys ['id', 'title', 'context', 'answers'])",
    ),
    _case(
        "missing_answers",
        "f.json",
        [_rec(0), _rec(1, answers=_DROP)],
        "[1] (id 'q1'): field 'answers': missing (",
        "answers may be left out only for split='test'",
    ),
    _case(
        "missing_answers_nested",
        "n.json",
        _nested([_rec(0, answers=_DROP)]),
        f"{QAS}[0] (id 'q0'): field 'answers': missing (record has keys",
    ),
    _case(
        "null_answers_nested",
        "n.json",
        _qas({"id": "q0", "question": "?", "answers": None}),  # null: absent
        # the question object's own keys: its context and title are its paragraph's and article's
        f"{QAS}[0] (id 'q0'): field 'answers': missing (record has keys ['id', 'question'])",
    ),
    _case(
        "missing_question_nested",
        "n.json",
        _qas({"id": "q0", "answers": []}),
        f"{QAS}[0] (id 'q0'): field 'question': missing (record has keys ['id', 'answers'])",
    ),
    _case(
        "missing_id",
        "hf.json",
        {"data": [_rec(0), _rec(1, id=_DROP)]},
        "data[1]: field 'id': missing (record has",
    ),
    _case(
        "start_out_of_range",
        "f.json",
        [_rec(0, **_ans("Paris", 999))],
        "[0] (id 'q0'): field 'answers[0].answer_start': 999 is out of range for a context of 53 characters; "
        "the text does occur at 0 (answer_check='fix' corrects such offsets, 'skip' drops such records)",
    ),
    _case(
        "text_not_at_start",
        "f.json",
        [_rec(0), _rec(1, **_ans("France", 3))],
        "[1] (id 'q1'): field 'answers[0].text': answer text 'France' not found at answer_start 3 "
        "(context has",
        "the text does occur at 24 (answer_check='fix' corrects such offsets, 'skip' drops such records)",
    ),
    _case(
        "empty_question",
        "n.json",
        _nested([_rec(0), _rec(1, question="  \n")]),
        f"{QAS}[1] (id 'q1'): field 'question': is empty or whitespace only",
    ),
    _case(
        "empty_context",
        "f.json",
        [_rec(0, context=" \t ")],
        "[0] (id 'q0'): field 'context': is empty or",
        split="validation",
    ),
    _case(
        "duplicate_id",
        "f.json",
        [_rec(0), _rec(1), _rec(0)],
        "[2] (id 'q0'): field 'id': duplicate id 'q0': first seen at [0], again at [2]",
    ),
    _case(
        "duplicate_id_jsonl",
        "r.jsonl",
        _j(_rec(0)) + b"\n\n" + _j(_rec(0)),
        "line 3 (id 'q0'): field 'id': duplicate id 'q0': first seen at line 1, again at line 3",
    ),
    _case(
        "invalid_utf8",
        "latin1.json",
        b'[{"id": "q0", "context": "caf\xe9"}]',
        "not valid UTF-8 at byte offset 29 (line 1, byte 30 of the line; bytes b'\\xe9\"}]'",
        "Re-save",
    ),
    _case(
        "truncated_json",
        "cut.json",
        _j(_nested([_rec(0)]))[:-9],
        "not valid JSON: ",
        "at line 1, column",
        "- the file ends early; it looks truncated",
    ),
    _case(
        "not_json",
        "notes.json",
        b"id,question\nq1,hello\n",
        "not valid JSON: Expecting value at line 1, column 1",
    ),
    _case(
        "top_level_without_data",
        "obj.json",
        {"version": "1.1", "articles": []},
        "wrong top-level shape: found an object with keys ['version', 'articles'], without a 'data' field; "
        "expected",
    ),
    _case(
        "csv", "train.csv", b"id,question,context,answers\nq0,?,c,[]\n", "(extension '.csv', content", *READ
    ),
    # formats told by their first bytes, whatever the name: the way out, not a UTF-8 or JSON complaint
    _case(
        "gzip_as_json",
        "train.json",
        gzip.compress(_j([_rec(0)])),
        "is gzip-compressed (by its first bytes), which this reader does not read: decompress it (gunzip); "
        "the formats read are the official nested SQuAD JSON",
    ),
    _case(
        "utf16",
        "u16.json",
        _j([_rec(0)]).decode().encode("utf-16"),
        "is UTF-16 text (by its first bytes), which this reader does not read: re-save it as UTF-8 (iconv -f "
        "utf-16 -t utf-8)",
    ),
    _case("empty_file", "empty.json", b"", "is empty (0 bytes)"),
    _case("whitespace_file", "blank.json", b" \n\t\n", "holds only whitespace"),
    # the other shapes, formats and fields
    _case("top_level_string", "s.json", "hello", "wrong top-level shape: found a str ('hello'); expected"),
    _case("top_level_single_record", "one.json", _rec(), "found a single record, without a 'data' field"),
    _case(
        "data_not_a_list",
        "d.json",
        {"data": {"x": 1}},
        "field 'data': wrong shape: found an object with keys",
    ),
    _case(
        "record_not_an_object",
        "f.json",
        [_rec(0), "q1"],
        "[1]: expected a record object",
        "found a str ('q1')",
    ),
    _case(
        "article_in_flat_file",
        "f.json",
        [_rec(0), _rec(1), {"paragraphs": []}],
        "[2]: field 'paragraphs': this",
    ),
    # an article's own "id" does not make it a record: among flat records it is still refused as an article
    _case(
        "article_with_id_in_flat_file",
        "f.json",
        {"data": [_rec(0), _rec(1), {"id": "A0", "title": "T", "paragraphs": []}]},
        "data[2]: field 'paragraphs': this looks like a nested SQuAD article (it has 'paragraphs') inside a "
        "file of flat records",
    ),
    # the layout is voted by every item: a broken first article is still reported as an article
    _case(
        "first_article_misspelt",
        "n.json",
        {"data": [{"paragraph": []}, *_nested([_rec(1), _rec(2, title="U")])["data"]]},
        "data[0]: field 'paragraphs': missing (article has keys ['paragraph'])",
    ),
    _case(
        "first_record_only_title", "f.json", [{"title": "T"}, _rec(1), _rec(2)], "[0]: field 'id': missing ("
    ),
    _case(
        "int_id", "n.json", _nested([_rec(0, id=17)]), f"{QAS}[0]: field 'id': must be a string, got int 17"
    ),
    _case(
        "context_not_string",
        "f.json",
        [_rec(0, context=["a"])],
        "(id 'q0'): field 'context': must be a string",
    ),
    _case(
        "start_is_string",
        "n.json",
        _nested([_rec(0, **_ans("Paris", "0"))]),
        "'answers[0].answer_start': must be",
    ),
    _case(
        "negative_start",
        "f.json",
        [_rec(0, **_ans("Paris", -1))],
        "field 'answers[0].answer_start': -1 is out",
    ),
    _case(
        "answer_lists_differ",
        "f.json",
        [_rec(0, answers={"text": ["P"], "answer_start": []})],
        "has 1 texts but 0",
    ),
    _case(
        "start_key_missing",
        "f.json",
        [_rec(0, answers={"text": ["Paris"]})],
        "'answers.answer_start': missing",
    ),
    _case(
        "no_answer_without_v2",
        "f.json",
        [_rec(0), _rec(1, answers={"text": [], "answer_start": []})],
        "[1] (id 'q1'): field 'answers': record has no answer",
        "--version_2_with_negative",
        split="validation",
    ),
    _case(
        "impossible_without_v2",
        "n.json",
        _nested([_rec(0, answers=[], is_impossible=True)]),
        f"{QAS}[0] (id 'q0'): field 'is_impossible': record has no answer (is_impossible is true)",
    ),
    _case(
        "impossible_not_bool",
        "n.json",
        _nested([_rec(0, is_impossible="yes")]),
        "(id 'q0'): field 'is_impossible'",
        version_2_with_negative=True,
    ),
    _case(
        "fix_text_nowhere",
        "f.json",
        [_rec(0, **_ans("Lyon", 0))],
        "(id 'q0'): field 'answers[0].text'",
        "the text does not occur anywhere in the context",
        answer_check="fix",
    ),
    _case(
        "fix_out_of_range_text_nowhere",
        "f.json",
        [_rec(0, **_ans("Lyon", 500))],
        "(id 'q0'): field 'answers[0].answer_start': 500 is out of range for a context of 53 characters; "
        "the text does not occur anywhere in the context",
        answer_check="fix",
    ),
    _case(
        "jsonl_bad_line",
        "r.jsonl",
        _j(_rec(0)) + b'\n{"id": "q2",\n',
        "line 2: not valid JSON: ",
        "(the line ends",
    ),
    # every other format: one error naming the formats that are read
    _case("tsv", "train.tsv", b"id\tquestion\nq0\t?\n", "(extension '.tsv', content not JSON)", *READ),
    _case("parquet", "train.parquet", b"PAR1\x15\x04\x15", "is Parquet (by its first bytes)", "convert it"),
    _case(
        "gzip",
        "train.json.gz",
        lambda: gzip.compress(_j(_nested(RECORDS))),
        "is gzip-compressed (by its first bytes), which this reader does not read: decompress it (gunzip)",
    ),
    _case("text", "notes.txt", b"just some words\n", "(extension '.txt', content not JSON)", *READ),
    _case("no_extension", "train", b"id,question\n", "(extension '(none)', content not JSON)", *READ),
    _case("empty_list", "e.json", [], "contains no records (format json)"),
    _case(
        "all_skipped",
        "f.json",
        [_rec(0, **_ans("Paris", 3))],
        "all 1 records were skipped",
        answer_check="skip",
    ),
    _case(
        "impossible_with_answers",
        "n.json",
        _nested([_rec(0, is_impossible=True)]),
        f"{QAS}[0] (id 'q0'): field 'answers': is_impossible is true but 1 answer(s) are given",
        version_2_with_negative=True,
    ),
    _case(
        "flat_impossible_not_bool",
        "f.jsonl",
        _j(_rec(0, is_impossible=1)),
        "line 1 (id 'q0'): field 'is_impossible': must be true or false, got 1",
    ),
    _case(
        "lone_surrogate",
        "f.json",
        _j([_rec(0, question="Who QQ?")]).replace(b"QQ", b"\\ud800"),
        "[0] (id 'q0'): field 'question': holds a lone surrogate '\\ud800' at character 4",
    ),
    _case(
        "lone_surrogate_answer",
        "f.jsonl",
        _j(_rec(0)).replace(b'["Paris"]', b'["Paris\\udfff"]'),
        "line 1 (id 'q0'): field 'answers[0].text': holds a lone surrogate",
    ),
    # an article's title and a paragraph's context are named where they are
    _case(
        "title_not_string_nested",
        "n.json",
        _nested([_rec(0, title=7)]),
        "data[0]: field 'title': must be a string, got int",
    ),
    _case(
        "context_not_string_nested",
        "n.json",
        _nested([_rec(0, context=["Paris"])]),
        "data[0].paragraphs[0]: field 'context': must be a string, got list",
    ),
    _case(
        "empty_context_nested",
        "n.json",
        _nested([_rec(0, context=" ")]),
        "data[0].paragraphs[0]: field 'context': is empty or whitespace only",
    ),
    # the scorer's reading: only ids and answer texts, still named by file, record and field
    _case("ref_empty", "dev.json", [], "contains no questions (format json)", **REF),
    _case("ref_no_id", "dev.json", _qas({"answers": []}), f"{QAS}[0]: field 'id': missing", **REF),
    _case(
        "ref_no_answers",
        "dev.json",
        _qas({"id": "q1"}),
        f"{QAS}[0] (id 'q1'): field 'answers': missing",
        **REF,
    ),
    _case(
        "ref_no_text",
        "dev.json",
        _qas({"id": "q1", "answers": [{"answer_start": 0}]}),
        f"{QAS}[0] (id 'q1'): field 'answers[0].text': missing (answer has keys ['answer_start'])",
        **REF,
    ),
    _case(
        "ref_text_not_string",
        "dev.json",
        _qas({"id": "q1", "answers": [{"text": 3}]}),  # as docs/REFERENCE.md
        f"{QAS}[0] (id 'q1'): field 'answers[0].text': must be a string, got int",
        **REF,
    ),
    _case(
        "ref_answers_string",
        "dev.json",
        _qas({"id": "q1", "answers": "P"}),
        "field 'answers': must be a",
        **REF,
    ),
    _case(
        "ref_duplicate",
        "dev.json",
        _qas(*[{"id": "q1", "answers": []}] * 2),
        f"{QAS}[1] (id 'q1'): field 'id'",
        **REF,
    ),
    _case("ref_csv", "dev.csv", b"id,answers\nq1,[]\n", "not a format this reader reads", *READ, **REF),
    _case("ref_gzip", "dev.json", gzip.compress(b"{}"), "is gzip-compressed (by its first bytes)", **REF),
]


@pytest.mark.parametrize("name,content,load,kwargs,fragments", BAD)
def test_bad_input_names_file_record_and_field(tmp_path, name, content, load, kwargs, fragments):
    path = tmp_path / name
    content = content() if callable(content) else content
    path.write_bytes(content if isinstance(content, bytes) else _j(content))
    with pytest.raises(DataError) as info:
        load(path, **kwargs)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and all(
        f in message.removeprefix(f"{path}: ") for f in fragments
    ), message


@pytest.mark.parametrize("load,what", [(load_qa_records, "file"), (load_references, "dataset file")])
def test_missing_file_and_directory(tmp_path, load, what):
    with pytest.raises(
        DataError, match=re.escape(f"{tmp_path / 'nope.json'}: {what} not found (resolved to")
    ):
        load(tmp_path / "nope.json")
    (tmp_path / "train.json").write_bytes(_j(RECORDS))
    with pytest.raises(
        DataError,
        match=re.escape(f"{tmp_path}: is a directory, expected a data file; data files in it: train.json"),
    ):
        load(tmp_path)


FIXABLE = [
    _rec(i, context="Bern is a city. Bern has a bear park. The river is the Aare.", **a)
    for i, a in enumerate(
        [
            _ans("Bern", 0),  # fine
            _ans("Bern", 18),  # nearest is 16
            {"answers": {"text": ["Aare", "the Aare"], "answer_start": [54, 52]}},  # both off by one
            _ans("Bern", 5),  # nearest is 0 (5 away, not 11)
            _ans("Aare", 70),  # past the context's end: the nearest is 55
            _ans("Bern", -3),  # before its start: the nearest is 0
            _ans("Bern", 8),  # 0 and 16 are both 8 away: the earlier
        ]
    )
]


@pytest.mark.parametrize(
    "mode,starts,counts",
    [
        ("fix", [[0], [16], [55, 51], [0], [55], [0], [0]], "records=7 impossible=0 skipped=0 fixed=7"),
        ("skip", [[0]], "records=1 impossible=0 skipped=6 fixed=0 skipped_answer_not_at_start=6"),
    ],
)
def test_answer_check_fix_and_skip_are_counted(tmp_path, mode, starts, counts):
    (tmp_path / "fix.json").write_bytes(_j(FIXABLE))
    recs, rep = load_qa_records(tmp_path / "fix.json", answer_check=mode)
    assert [r["answers"]["answer_start"] for r in recs] == starts
    assert all(r["context"][s : s + len(t)] == t for r in recs for t, s in zip(*r["answers"].values()))
    assert rep.summary() == f"DATA_LOADED file={tmp_path / 'fix.json'} format=json {counts}"


@pytest.mark.parametrize(
    "name,split,n,titles",
    [("dev-v1.1.json", "validation", 10570, 48), ("train-v1.1.first44articles.json", "train", 11877, 44)],
)
def test_real_squad(name, split, n, titles):
    recs, rep = load_qa_records(shared_squad_file(name), split=split)
    assert rep.n_records == len(recs) == n and len({r["title"] for r in recs}) == titles
    assert (rep.fmt, rep.n_impossible, rep.skipped, rep.fixed) == ("squad-nested", 0, {}, 0)
    assert split == "train" or sum(len(r["answers"]["text"]) > 1 for r in recs) > 5000


def test_references_need_only_ids_and_texts(tmp_path):
    """What evaluate-v1.1.py/v2.0.py score without complaint: no context, question or answer_start, a text
    not in any context, an empty text, duplicates; an unanswerable question's plausible answer is ignored."""
    data = {
        "data": [
            {
                "paragraphs": [
                    {
                        "qas": [
                            {"id": "a", "answers": [{"text": "Paris"}, {"text": ""}, {"text": "Paris"}]},
                            {
                                "id": "b",
                                "answers": [{"text": "Seine", "answer_start": 999}],
                                "is_impossible": False,
                            },
                            {
                                "id": "c",
                                "answers": [],
                                "is_impossible": True,
                                "plausible_answers": [{"text": "x", "answer_start": 0}],
                            },
                            # the official v2.0 script reads the answers, not is_impossible
                            {"id": "d", "answers": [{"text": "Seine"}], "is_impossible": True},
                        ]
                    }
                ]
            }
        ]
    }
    flat = [{"id": "q1", "answers": {"text": ["P"], "answer_start": [0]}}, {"id": "q2", "answers": []}]
    files = {
        "dev.json": _j(data),
        "f.jsonl": b"\n".join(map(_j, flat)),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    assert load_references(tmp_path / "dev.json") == {
        "a": ["Paris", "", "Paris"],
        "b": ["Seine"],
        "c": [],
        "d": ["Seine"],
    }
    assert load_references(tmp_path / "f.jsonl") == {"q1": ["P"], "q2": []}
