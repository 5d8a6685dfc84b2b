"""Table readers: CSV/TSV (as spreadsheets export them) and Parquet.

A row is a flat record. Answers are either one ``answers`` column holding JSON (HF columns
or SQuAD objects) or an ``answer_text`` + ``answer_start`` pair of columns (one answer per
row). Errors name the CSV line (counting lines inside quoted multi-line fields) or the
Parquet row.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qa_hpc.data.squad_records import Loader


def read_csv(ld: Loader, text: str, delimiter: str) -> None:
    with _long_fields():
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
        cols, mode = _csv_header(ld, reader)
        line = reader.line_num + 1
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                raise ld.fail(f"CSV line {reader.line_num}", f"malformed CSV: {e}") from None
            loc = f"CSV line {line}"
            line = reader.line_num + 1
            _check_width(ld, loc, row, cols)
            if mode == "pair":
                rec = {k: row[k] for k in cols if k not in ("answer_text", "answer_start")}
                ld.add(loc, rec, title=row.get("title", ""), answers_present=True, answers=_pair(ld, loc, row),
                       answers_field="answer_text", csv_pair=True)
            else:
                ld.add_flat(loc, row, json_strings=True)


@contextmanager
def _long_fields() -> Iterator[None]:
    """Long contexts exceed csv's 128 KiB field limit; lift it while reading, then restore it."""
    old_limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(old_limit)


def _csv_header(ld: Loader, reader: csv.DictReader) -> tuple[list[str], str]:
    """(columns, answer mode): "json" (an answers column), "pair" (answer_text + answer_start) or "none"."""
    try:
        header = reader.fieldnames
    except csv.Error as e:
        raise ld.fail("CSV line 1", f"unreadable header: {e}") from None
    if not header:
        raise ld.fail(None, "empty CSV file (no header row); expected columns id, question, context, "
                            "and answers or answer_text + answer_start")
    cols = [h.strip() if h else h for h in header]
    reader.fieldnames = cols
    found = ", ".join(repr(c) for c in cols)
    for col in ld.required_columns:
        if col not in cols:
            raise ld.fail("CSV line 1", f"missing required column '{col}' (columns found: {found})", fld=col)
    if "answers" in cols:
        return cols, "json"
    if "answer_text" in cols or "answer_start" in cols:
        for col in ld.pair_columns:
            if col not in cols:
                raise ld.fail("CSV line 1", f"missing column '{col}': answer_text and answer_start go "
                                            f"together (columns found: {found})", fld=col)
        return cols, "pair"
    if ld.split == "test":
        return cols, "none"
    raise ld.fail("CSV line 1", "missing answer column: need 'answers' (JSON) or 'answer_text' + "
                                f"'answer_start' unless split='test' (columns found: {found})", fld="answers")


def _check_width(ld: Loader, loc: str, row: dict, cols: list[str]) -> None:
    """A row with more or fewer fields than the header is a broken line, not a record."""
    if None in row:
        raise ld.fail(loc, f"row has {len(cols) + len(row[None])} fields but the header has {len(cols)}",
                      rid=row.get("id"))
    missing = [c for c in cols if row.get(c) is None]
    if missing:
        raise ld.fail(loc, f"row has fewer fields than the header (no value for {', '.join(missing)})",
                      rid=row.get("id"), fld=missing[0])


def _pair(ld: Loader, loc: str, row: dict) -> list[dict]:
    """The row's answer_text/answer_start as a list of at most one answer (both empty: none)."""
    text, start = row["answer_text"], (row.get("answer_start") or "").strip()
    if "answer_start" not in ld.pair_columns:  # texts are all the scorer reads
        return [{"text": text}] if text.strip() else []
    if not text.strip() and not start:
        return []
    if not start:
        raise ld.fail(loc, "is empty but answer_text is set", rid=row["id"], fld="answer_start")
    if not text.strip():
        raise ld.fail(loc, "is empty but answer_start is set", rid=row["id"], fld="answer_text")
    try:
        offset: Any = int(start)
    except ValueError:
        offset = start  # reported by the answer check as "must be an integer"
    return [{"text": text, "answer_start": offset}]


def read_parquet(ld: Loader, path: Path) -> None:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # not a data problem: the environment lacks pyarrow
        raise ImportError(f"reading {ld.path} needs pyarrow (pip install pyarrow)") from e
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for non-Parquet content
        raise ld.fail(None, f"not a readable Parquet file: {e}") from None
    cols = table.column_names
    found = ", ".join(repr(c) for c in cols)
    for col in ld.required_columns:
        if col not in cols:
            raise ld.fail(None, f"missing required column '{col}' (columns found: {found})", fld=col)
    pair = "answers" not in cols and all(c in cols for c in ld.pair_columns)
    if "answers" not in cols and not pair and ld.split != "test":
        raise ld.fail(None, "missing answer column: need 'answers' or 'answer_text' + 'answer_start' "
                            f"unless split='test' (columns found: {found})", fld="answers")
    for i, row in enumerate(table.to_pylist()):
        if pair:
            text, start = row.pop("answer_text"), row.pop("answer_start", None)
            none = (text is None or (isinstance(text, str) and not text.strip())) and start is None
            row["answers"] = [] if none else [{"text": text, "answer_start": start}]
        ld.add_flat(f"row {i}", row, json_strings=True)
