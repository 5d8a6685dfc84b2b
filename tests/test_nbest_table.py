"""NBestTable reads like the loop's dict of n-best lists, and its n-best file holds the same JSON values.

The expected values are plain dicts built here by hand, not through the table.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from qa_hpc.postprocess.files import nbest_json, write_prediction_files
from qa_hpc.postprocess.nbest_table import NBestTable, SpanTexts
from qa_hpc.postprocess.reference import QAPredictions


def _texts(texts: list[str]) -> SpanTexts:
    """Each text as its own whole context."""
    return SpanTexts(texts, np.arange(len(texts)), np.zeros(len(texts), dtype=np.int64),
                     np.array([len(t) for t in texts], dtype=np.int64))


def _table_and_dicts():
    """Three examples: two spans with awkward texts, a v2 null (logits None), one single entry."""
    ids = ["q-1", "é\"2", "q\\3"]
    rows = [
        ("Zürich \"old\" town", 0.75, 3.5, 1.25, 2.25, False),
        ("line\nbreak\ttab", 0.25, 2.4000000000000004, 1e-7, 2.4, False),
        ("", 0.6, -0.5, 0.0, 0.0, True),
        ("日本", 0.4, -1.0, -123456789.125, 5e20, False),
        ("", 1.0, 0.0, 0.0, 0.0, False),
    ]
    bounds = np.array([0, 2, 4, 5])
    text, prob, score, start, end, none = (list(c) for c in zip(*rows))
    table = NBestTable(ids, bounds, _texts(text), np.array(prob), np.array(score), np.array(start), np.array(end),
                       np.array(none))
    dicts = {}
    for i, qid in enumerate(ids):
        dicts[qid] = [
            {"text": t, "probability": p, "score": s, "start_logit": None if n else a,
             "end_logit": None if n else b}
            for t, p, s, a, b, n in rows[bounds[i]:bounds[i + 1]]
        ]
    return table, dicts


def test_reads_like_a_dict():
    table, dicts = _table_and_dicts()
    assert len(table) == 3 and list(table) == list(dicts)
    assert table == dicts and dicts == table
    assert table["é\"2"][0]["start_logit"] is None
    assert "q-1" in table and "nope" not in table
    with pytest.raises(KeyError):
        table["nope"]
    assert dict(table.items()) == dicts


def test_json_file_holds_the_dicts():
    table, dicts = _table_and_dicts()
    text = nbest_json(table)
    assert json.loads(text) == dicts
    assert text.endswith("}\n") and '\n  "q-1": [\n' in text, "indented, one trailing newline"
    assert "Zürich" in text and "日本" in text, "UTF-8 as is"
    assert json.loads(nbest_json(dicts)) == dicts
    assert table.as_dict() == dicts and list(table.as_dict()) == list(dicts)


def test_non_finite_values_are_written_as_null_and_repeated_ids_keep_the_last_list():
    table = NBestTable(["a", "a"], np.array([0, 1, 2]), _texts(["x", "y"]), np.array([1.0, 1.0]),
                       np.array([np.nan, 1.0]), np.array([np.inf, 0.5]), np.array([-np.inf, 0.5]))
    as_dict = {"a": [{"text": "y", "probability": 1.0, "score": 1.0, "start_logit": 0.5, "end_logit": 0.5}]}
    assert len(table) == 1 and list(table) == ["a"] and table == as_dict  # a dict keeps the last list
    assert json.loads(nbest_json(table)) == as_dict
    nan_table = NBestTable(["b"], np.array([0, 1]), _texts(["x"]), np.array([1.0]), np.array([np.nan]),
                           np.array([np.inf]), np.array([-np.inf]))
    # JSON has no NaN or Infinity: orjson writes null, so strict parsers read the file too
    assert json.loads(nbest_json(nan_table)) == {
        "b": [{"text": "x", "probability": 1.0, "score": None, "start_logit": None, "end_logit": None}]}
    empty = NBestTable([], np.array([0]), _texts([]), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0))
    assert nbest_json(empty) == "{}\n"


def test_columns_must_match_the_bounds():
    with pytest.raises(ValueError, match="column score has 1 rows, bounds say 2"):
        NBestTable(["a"], np.array([0, 2]), _texts(["x", "y"]), np.zeros(2), np.zeros(1), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="bounds has 2 entries for 2 examples"):
        NBestTable(["a", "b"], np.array([0, 2]), _texts(["x", "y"]), *[np.zeros(2)] * 4)


def test_prediction_files_hold_the_same_values_from_table_and_dicts(tmp_path):
    table, dicts = _table_and_dicts()
    answers = {qid: lst[0]["text"] for qid, lst in dicts.items()}
    null_odds = {"q-1": -0.5, "é\"2": 1.25, "q\\3": 0.0}
    write_prediction_files(QAPredictions(answers, table, null_odds), str(tmp_path / "t"), "eval")
    write_prediction_files(QAPredictions(answers, dicts, null_odds), str(tmp_path / "d"), "eval")
    for name in ("eval_predictions.json", "eval_nbest_predictions.json", "eval_null_odds.json"):
        from_table = json.loads((tmp_path / "t" / name).read_text("utf-8"))
        assert from_table == json.loads((tmp_path / "d" / name).read_text("utf-8")), name
    assert json.loads((tmp_path / "t" / "eval_nbest_predictions.json").read_text("utf-8")) == dicts
    assert json.loads((tmp_path / "t" / "eval_predictions.json").read_text("utf-8")) == answers
    assert json.loads((tmp_path / "t" / "eval_null_odds.json").read_text("utf-8")) == null_odds


def test_nbest_file_is_not_written_by_json_dumps(monkeypatch):
    """json.dumps with an indent encodes in pure Python (seconds for a dev set): the n-best writer must not use it."""
    table, dicts = _table_and_dicts()

    def refuse(*args, **kwargs):
        raise AssertionError("json.dumps called for the n-best file")

    monkeypatch.setattr(json, "dumps", refuse)
    text = nbest_json(table)
    monkeypatch.undo()
    assert json.loads(text) == dicts
