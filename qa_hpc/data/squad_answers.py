"""Answers as the formats write them -> one list of (text, answer_start) with the field each came from.

Files write a question's answers as HF columns ``{"text": [...], "answer_start": [...]}``,
as SQuAD objects ``[{"text": ..., "answer_start": ...}]``, as a JSON string of either (a CSV
or Parquet cell), or as a CSV ``answer_text``/``answer_start`` pair. Each answer keeps
the field path it came from, so an error names ``answers[1].text`` or ``answer_start``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qa_hpc.data.squad_errors import DataError, is_int, keys_of

# (message, field) -> the error, already placed at the record by the caller
FieldError = Callable[[str, str], DataError]


@dataclass(frozen=True)
class Answer:
    text: str
    start: int | None  # None when offsets are not asked for (scoring only needs the texts)
    text_field: str
    start_field: str


def parse_answers(answers: Any, *, fld: str, err: FieldError, json_strings: bool = False,
                  csv_pair: bool = False, need_start: bool = True) -> list[Answer]:
    """Every answer of one record, each text a string and, if ``need_start``, each offset an int.

    ``need_start=False`` is what a scorer needs, as the official evaluation scripts read
    only the texts: ``answer_start`` may then be absent and is not looked at, and an
    empty text is kept (v2 scoring ignores golds that normalize to nothing).
    """
    if json_strings and isinstance(answers, str):
        answers = _decode(answers, fld, err)
    if answers is None:
        return []
    if isinstance(answers, dict):
        raw = _from_columns(answers, fld, err, need_start)
    elif isinstance(answers, (list, tuple)):
        raw = _from_objects(answers, fld, err, need_start)
    else:
        raise err(f"must be a list of {{text, answer_start}} objects or "
                  f'{{"text": [...], "answer_start": [...]}}, got {type(answers).__name__}', fld)
    return [_checked(text, start, aloc, err, csv_pair, need_start) for text, start, aloc in raw]


def _decode(answers: str, fld: str, err: FieldError) -> Any:
    """A CSV/Parquet cell holding the answers as JSON; an empty cell means no answer."""
    if not answers.strip():
        return None
    try:
        return json.loads(answers)
    except json.JSONDecodeError as e:
        raise err(f"is not valid JSON ({e.msg} at column {e.colno}); expected "
                  '{"text": [...], "answer_start": [...]} or [{"text": ..., "answer_start": ...}]', fld) from None


def _from_columns(answers: dict, fld: str, err: FieldError, need_start: bool) -> list[tuple[Any, Any, str]]:
    """HF columns {"text": [...], "answer_start": [...]} -> (text, start, field path) per answer."""
    keys = ("text", "answer_start") if need_start else ("text",)
    for key in keys:
        if key not in answers:
            raise err(f"missing (answers has keys {keys_of(answers)})", f"{fld}.{key}")
    texts, starts = answers["text"], answers.get("answer_start")
    if isinstance(texts, str) and (is_int(starts) or not need_start):  # one answer written as scalars
        texts, starts = [texts], [starts]
    for key, val in zip(keys, (texts, starts)):
        if not isinstance(val, (list, tuple)):
            raise err(f"must be a list, got {type(val).__name__}", f"{fld}.{key}")
    if not need_start:
        starts = [None] * len(texts)
    elif len(texts) != len(starts):
        raise err(f"has {len(texts)} texts but {len(starts)} answer_start values", f"{fld}.answer_start")
    return [(t, s, f"{fld}[{i}]") for i, (t, s) in enumerate(zip(texts, starts))]


def _from_objects(answers: list | tuple, fld: str, err: FieldError,
                  need_start: bool) -> list[tuple[Any, Any, str]]:
    """SQuAD objects [{"text": ..., "answer_start": ...}] -> (text, start, field path) per answer."""
    keys = ("text", "answer_start") if need_start else ("text",)
    out = []
    for i, a in enumerate(answers):
        if not isinstance(a, dict):
            raise err(f"must be an object with text and answer_start, got {type(a).__name__}", f"{fld}[{i}]")
        for key in keys:
            if key not in a:
                raise err(f"missing (answer has keys {keys_of(a)})", f"{fld}[{i}].{key}")
        out.append((a["text"], a.get("answer_start"), f"{fld}[{i}]"))
    return out


def _checked(text: Any, start: Any, aloc: str, err: FieldError, csv_pair: bool, need_start: bool) -> Answer:
    # a CSV answer_text/answer_start pair is named by its columns, not by a JSON path
    text_field, start_field = ("answer_text", "answer_start") if csv_pair else (f"{aloc}.text", f"{aloc}.answer_start")
    if not isinstance(text, str):
        raise err(f"must be a string, got {type(text).__name__}", text_field)
    if not need_start:
        return Answer(text, None, text_field, start_field)
    if not text.strip():
        raise err("answer text is empty", text_field)
    if not is_int(start):
        raise err(f"must be an integer character offset, got {type(start).__name__} {start!r}", start_field)
    return Answer(text, int(start), text_field, start_field)
