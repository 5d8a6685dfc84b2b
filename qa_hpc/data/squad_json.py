"""JSON readers: the official nested SQuAD layout, flat records, and JSON Lines.

Which layout a document has is decided from all of its items, not the first: a nested
SQuAD file whose first article is broken (``"paragraph"`` misspelt, paragraphs missing)
is still a nested file, and its error names the article and the nested field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from qa_hpc.data.squad_errors import DataError, keys_of, kind_of
from qa_hpc.data.squad_records import Loader

_SHAPES = ('expected the official SQuAD layout {"version": ..., "data": [{"title", "paragraphs": '
           '[{"context", "qas": [...]}]}]}, an array of flat records [{"id", "question", "context", '
           '"answers"}], {"data": [flat records]}, or JSON Lines (one record per line)')

# fields of a flat record; an article of the nested layout has none of them
_RECORD_KEYS = frozenset({"id", "question", "context", "answers"})


def read_json_file(ld: Loader, text: str, jsonl_ext: bool) -> str:
    """Read a .json/.jsonl text (either way round, when the content says so); return the format."""
    if jsonl_ext:
        try:
            _read_jsonl(ld, text)
            return "jsonl"
        except DataError as first:
            # A pretty-printed JSON document saved as .jsonl: accept it if it parses whole.
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                raise first from None
            if ld.n_seen:  # some records were read line by line before failing: it is JSONL
                raise first from None
            return _read_json_value(ld, obj)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data" and _first_line_is_object(text):  # one JSON object per line in a .json file
            _read_jsonl(ld, text)
            return "jsonl"
        raise _json_error(ld, text, e) from None
    return _read_json_value(ld, obj)


def _first_line_is_object(text: str) -> bool:
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def _json_error(ld: Loader, text: str, e: json.JSONDecodeError) -> DataError:
    truncated = e.pos >= len(text.rstrip()) or (
        e.msg.startswith("Unterminated string") and '"' not in text[e.pos + 1:])
    hint = " - the file ends early; it looks truncated (incomplete copy or download?)" if truncated else ""
    return ld.fail(None, f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}{hint}")


def _iter_jsonl(ld: Loader, text: str) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            trunc = " (the line ends early; truncated?)" if e.pos >= len(line.rstrip()) else ""
            raise ld.fail(f"line {n}", f"not valid JSON: {e.msg} at column {e.colno}{trunc}") from None


def _read_jsonl(ld: Loader, text: str) -> None:
    for n, obj in _iter_jsonl(ld, text):
        ld.add_flat(f"line {n}", obj)


def _read_json_value(ld: Loader, obj: Any) -> str:
    """Dispatch a parsed JSON document to the nested or flat reader; return the format name."""
    if isinstance(obj, dict):
        if "data" not in obj:
            what = ("a single record" if {"question", "context"} <= set(obj) else
                    f"an object with keys {keys_of(obj)}")
            raise ld.fail(None, f"wrong top-level shape: found {what}, without a 'data' field; {_SHAPES}")
        items, prefix = obj["data"], "data"
        if not isinstance(items, list):
            raise ld.fail(None, f"wrong shape: found {kind_of(items)}; {_SHAPES}", fld="data")
    elif isinstance(obj, list):
        items, prefix = obj, ""
    else:
        raise ld.fail(None, f"wrong top-level shape: found {kind_of(obj)}; {_SHAPES}")
    if _looks_nested(items):
        _read_nested(ld, items, prefix)
        return "squad-nested"
    for i, rec in enumerate(items):
        ld.add_flat(f"{prefix}[{i}]", rec)
    return "json"


def _looks_nested(items: list) -> bool:
    """More items look like articles (title / paragraph*, no record field) than like flat records.

    Counting every item keeps one broken article (or one broken record) from deciding
    the layout of the whole file; a tie reads as flat records, whose reader names an
    article found among them.
    """
    articles = records = 0
    for item in items:
        if not isinstance(item, dict):
            continue
        if _RECORD_KEYS & item.keys():
            records += 1
        elif "title" in item or any(key.startswith("paragraph") for key in item):
            articles += 1
    return articles > records


def _read_nested(ld: Loader, articles: list, prefix: str) -> None:
    for i, art in enumerate(articles):
        aloc = f"{prefix}[{i}]"
        title, paragraphs = _article(ld, aloc, art)
        for j, para in enumerate(paragraphs):
            _read_paragraph(ld, f"{aloc}.paragraphs[{j}]", para, title)


def _article(ld: Loader, aloc: str, art: Any) -> tuple[Any, list]:
    """(title, paragraphs) of one article, checked."""
    if not isinstance(art, dict):
        raise ld.fail(aloc, f"expected an article object with title and paragraphs; found {kind_of(art)}")
    if "paragraphs" not in art:
        raise ld.fail(aloc, f"missing (article has keys {keys_of(art)})", fld="paragraphs")
    title = art.get("title", "")
    if title is not None and not isinstance(title, str):
        raise ld.fail(aloc, f"must be a string, got {type(title).__name__}", fld="title")
    paragraphs = art["paragraphs"]
    if not isinstance(paragraphs, list):
        raise ld.fail(aloc, f"must be a list, found {kind_of(paragraphs)}", fld="paragraphs")
    return title, paragraphs


def _read_paragraph(ld: Loader, ploc: str, para: Any, title: Any) -> None:
    if not isinstance(para, dict):
        raise ld.fail(ploc, f"expected a paragraph object with context and qas; found {kind_of(para)}")
    ld.check_paragraph(ploc, para)
    qas = para.get("qas")
    if qas is None:
        raise ld.fail(ploc, f"missing (paragraph has keys {keys_of(para)})", fld="qas")
    if not isinstance(qas, list):
        raise ld.fail(ploc, f"must be a list, found {kind_of(qas)}", fld="qas")
    for k, qa in enumerate(qas):
        qloc = f"{ploc}.qas[{k}]"
        if not isinstance(qa, dict):
            raise ld.fail(qloc, f"expected a question object; found {kind_of(qa)}")
        impossible = qa.get("is_impossible", False)
        if impossible is None:
            impossible = False
        if not isinstance(impossible, bool):
            raise ld.fail(qloc, f"must be true or false, got {impossible!r}", rid=qa.get("id"),
                          fld="is_impossible")
        rec = dict(qa, context=para.get("context"))
        present = ("answers" in qa and qa["answers"] is not None) or impossible
        ld.add(qloc, rec, title=title, answers_present=present, answers=qa.get("answers"), impossible=impossible)
