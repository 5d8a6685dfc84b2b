"""NBestTable reads like the loop's dict of n-best lists and writes the same JSON bytes, faster.

The expected text is json.dumps of plain dicts built here by hand, not through the table.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from qa_hpc.postprocess import nbest_table as nbest_table
from qa_hpc.postprocess.nbest_table import NBestTable, nbest_json
from qa_hpc.postprocess.files import write_prediction_files
from qa_hpc.postprocess.reference import QAPredictions


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
    table = NBestTable(ids, bounds, text, np.array(prob), np.array(score), np.array(start), np.array(end),
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


@pytest.mark.parametrize("indent", [2, 4])
def test_json_text_is_what_json_dumps_writes(indent):
    table, dicts = _table_and_dicts()
    assert table.to_json(indent=indent) == json.dumps(dicts, indent=indent, ensure_ascii=False)
    assert json.loads(table.to_json()) == dicts


def test_non_finite_values_and_repeated_ids_fall_back_to_json():
    table = NBestTable(["a", "a"], np.array([0, 1, 2]), ["x", "y"], np.array([1.0, 1.0]),
                       np.array([np.nan, 1.0]), np.array([np.inf, 0.5]), np.array([-np.inf, 0.5]))
    as_dict = {"a": [{"text": "y", "probability": 1.0, "score": 1.0, "start_logit": 0.5, "end_logit": 0.5}]}
    assert len(table) == 1 and list(table) == ["a"] and table == as_dict  # a dict keeps the last list
    assert table.to_json() == json.dumps(as_dict, indent=2, ensure_ascii=False)
    nan_table = NBestTable(["b"], np.array([0, 1]), ["x"], np.array([1.0]), np.array([np.nan]),
                           np.array([np.inf]), np.array([-np.inf]))
    assert nan_table.to_json() == json.dumps(dict(nan_table.items()), indent=2, ensure_ascii=False)
    assert '"score": NaN' in nan_table.to_json()
    assert NBestTable([], np.array([0]), [], np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)).to_json() == "{}"


def test_columns_must_match_the_bounds():
    with pytest.raises(ValueError, match="column score has 1 rows, bounds say 2"):
        NBestTable(["a"], np.array([0, 2]), ["x", "y"], np.zeros(2), np.zeros(1), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="bounds has 2 entries for 2 examples"):
        NBestTable(["a", "b"], np.array([0, 2]), ["x", "y"], *[np.zeros(2)] * 4)


def test_prediction_files_identical_from_table_and_dicts(tmp_path):
    table, dicts = _table_and_dicts()
    answers = {qid: lst[0]["text"] for qid, lst in dicts.items()}
    write_prediction_files(QAPredictions(answers, table, None), str(tmp_path / "t"), "eval")
    write_prediction_files(QAPredictions(answers, dicts, None), str(tmp_path / "d"), "eval")
    for name in ("eval_predictions.json", "eval_nbest_predictions.json"):
        assert (tmp_path / "t" / name).read_bytes() == (tmp_path / "d" / name).read_bytes()
    assert json.loads((tmp_path / "t" / "eval_nbest_predictions.json").read_text("utf-8")) == dicts


def test_finite_tables_are_written_without_json_dumps(monkeypatch):
    """The seconds saved come from never building the dicts: json.dumps must not be on that path."""
    table, dicts = _table_and_dicts()
    expected = json.dumps(dicts, indent=2, ensure_ascii=False)

    def refuse(*args, **kwargs):
        raise AssertionError("json.dumps called for a finite table")

    monkeypatch.setattr(nbest_table.json, "dumps", refuse)
    assert nbest_json(table) == expected
