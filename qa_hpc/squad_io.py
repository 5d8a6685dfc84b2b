"""The one SQuAD reader: official nested JSON (v1.1/v2.0), flat JSON / JSON Lines, CSV or Parquet -> flat records.

Each format becomes flat records handed one by one to a RecordChecker (qa_hpc.squad_records), which
raises DataError naming file, record and field before any record is returned. Parsed here, not by
``load_dataset``: its JSON errors name no line or column, a missing field reads as null, and pandas
reads the CSV id 007 as the number 7.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qa_hpc.squad_records import DataError, LoadReport, RecordChecker, check_title, keys_of, kind_of

__all__ = ["ANSWER_CHECKS", "DataError", "LoadReport", "load_qa_records", "load_references"]  # what callers import

SPLITS = ("train", "validation", "test")
ANSWER_CHECKS = ("error", "fix", "skip")
_FORMATS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "csv",
            ".parquet": "parquet", ".pq": "parquet"}
_SHAPES = ('expected the official SQuAD layout {"version": ..., "data": [{"title", "paragraphs": '
           '[{"context", "qas": [...]}]}]}, an array of flat records [{"id", "question", "context", '
           '"answers"}], {"data": [flat records]}, or JSON Lines (one record per line)')
_RECORD_KEYS = frozenset({"id", "question", "context", "answers"})  # an article of the nested layout has none
csv.field_size_limit(2**31 - 1)  # long contexts exceed csv's 128 KiB default field limit


def load_qa_records(path: str | os.PathLike, *, split: str = "train", version_2_with_negative: bool = False,
                    answer_check: str = "error") -> tuple[list[dict], LoadReport]:
    """Every record of a QA file, flat, or DataError. ``split="test"`` may lack answers; ``answer_check``:
    an answer not at its ``answer_start`` raises ("error"), moves to the nearest occurrence ("fix") or is skipped."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if answer_check not in ANSWER_CHECKS:
        raise ValueError(f"answer_check must be one of {ANSWER_CHECKS}, got {answer_check!r}")
    c = RecordChecker(os.fspath(path), split, bool(version_2_with_negative), answer_check)
    fmt = _read(c)
    if c.n_seen == 0:
        raise c.fail(None, f"contains no records (format {fmt})")
    if not c.records:
        raise c.fail(None, f"all {c.n_seen} records were skipped ({c.skipped}); nothing left to use")
    n_impossible = sum(1 for rec in c.records if not rec["answers"]["text"])
    return c.records, LoadReport(c.path, fmt, len(c.records), n_impossible, dict(c.skipped), c.fixed)


def load_references(path: str | os.PathLike) -> dict[str, list[str]]:
    """Question id -> gold texts in file order (unanswerable: ``[]``); only what the official scripts read."""
    c = RecordChecker(os.fspath(path), "validation", scoring=True)  # gold answers must be there
    fmt = _read(c)
    if not c.references:
        raise c.fail(None, f"contains no questions (format {fmt})")
    return c.references


def _read(c: RecordChecker) -> str:
    """Hands every record of ``c.path`` to ``c``; returns the format it was read as."""
    p = Path(c.path)
    if not p.exists():
        raise c.fail(None, f"{c.what} not found (resolved to {p.resolve()}, cwd {os.getcwd()})")
    if p.is_dir():
        inside = sorted(x.name for x in p.iterdir() if x.is_file() and x.suffix.lower() in _FORMATS)
        hint = f"; data files in it: {', '.join(inside[:10])}" if inside else ""
        raise c.fail(None, f"is a directory, expected a data file{hint}")
    suffixes = [s.lower() for s in p.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    ext = (suffixes[-2] if len(suffixes) > 1 else "") if gz else (suffixes[-1] if suffixes else "")
    kind = _FORMATS.get(ext)
    data = b"" if kind == "parquet" else _bytes(c, p, gz)  # pyarrow reads Parquet itself
    if kind is None and data[:4] == b"PAR1":
        kind = "parquet"
    elif kind is None and data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
        kind = "json"
    elif kind is None:
        raise c.fail(None, f"cannot tell the format from the extension {ext or '(none)'!r} or the content; "
                           "use .json (SQuAD or flat records), .jsonl, .csv, .tsv or .parquet")
    if kind == "parquet" and gz:
        raise c.fail(None, "gzip-compressed Parquet is not supported; Parquet compresses internally")
    if kind == "parquet":
        return _table(c, *_parquet_rows(c, p), kind)
    text = _decode(c, data)
    if kind == "csv":
        return _table(c, *_csv_rows(c, text, "\t" if ext == ".tsv" else ","), kind)
    return _json(c, text, jsonl_ext=kind == "jsonl")


def _bytes(c: RecordChecker, p: Path, gz: bool) -> bytes:
    try:
        data = p.read_bytes()
    except OSError as e:
        raise c.fail(None, f"cannot read file: {e}") from None
    try:
        return gzip.decompress(data) if gz else data
    except (OSError, EOFError) as e:
        raise c.fail(None, f"not a valid gzip file: {e}") from None


def _decode(c: RecordChecker, data: bytes) -> str:
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise c.fail(None, f"not valid UTF-8 at byte offset {e.start} (line {line}, byte {col} of the line; "
                           f"bytes {data[e.start:e.start + 4]!r}): {e.reason}. Re-save the file as UTF-8 "
                           "(e.g. iconv -f latin1 -t utf-8)") from None


# ----------------------------------------------------------------- JSON and JSON Lines
def _json(c: RecordChecker, text: str, jsonl_ext: bool) -> str:
    """A JSON document (even saved as .jsonl), or JSON Lines (even saved as .json)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        if jsonl_ext or (e.msg == "Extra data" and _first_line_is_object(text)):
            _jsonl(c, text)
            return "jsonl"
        truncated = e.pos >= len(text.rstrip()) or (
            e.msg.startswith("Unterminated string") and '"' not in text[e.pos + 1:])
        hint = " - the file ends early; it looks truncated (incomplete copy or download?)" if truncated else ""
        raise c.fail(None, f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}{hint}") from None
    if jsonl_ext and isinstance(obj, dict) and "paragraphs" not in obj and len(text.strip().splitlines()) == 1:
        _jsonl(c, text)  # JSON Lines holding one record
        return "jsonl"
    return _json_value(c, obj)


def _jsonl(c: RecordChecker, text: str) -> None:
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            trunc = " (the line ends early; truncated?)" if e.pos >= len(line.rstrip()) else ""
            raise c.fail(f"line {n}", f"not valid JSON: {e.msg} at column {e.colno}{trunc}") from None
        c.add_flat(f"line {n}", obj)


def _json_value(c: RecordChecker, obj: Any) -> str:
    if isinstance(obj, dict):
        if "data" not in obj:
            what = "a single record" if {"question", "context"} <= set(obj) else f"an object with keys {keys_of(obj)}"
            raise c.fail(None, f"wrong top-level shape: found {what}, without a 'data' field; {_SHAPES}")
        items, prefix = obj["data"], "data"
        if not isinstance(items, list):
            raise c.fail(None, f"wrong shape: found {kind_of(items)}; {_SHAPES}", fld="data")
    elif isinstance(obj, list):
        items, prefix = obj, ""
    else:
        raise c.fail(None, f"wrong top-level shape: found {kind_of(obj)}; {_SHAPES}")
    nested = _looks_nested(items)
    for i, item in enumerate(items):
        if nested:
            _article(c, f"{prefix}[{i}]", item)
        else:
            c.add_flat(f"{prefix}[{i}]", item)
    return "squad-nested" if nested else "json"


def _article(c: RecordChecker, aloc: str, art: Any) -> None:
    if not isinstance(art, dict):
        raise c.fail(aloc, f"expected an article object with title and paragraphs; found {kind_of(art)}")
    if "paragraphs" not in art:
        raise c.fail(aloc, f"missing (article has keys {keys_of(art)})", fld="paragraphs")
    title, paragraphs = art.get("title", ""), art["paragraphs"]
    check_title(title, lambda msg, fld: c.fail(aloc, msg, fld=fld))
    if not isinstance(paragraphs, list):
        raise c.fail(aloc, f"must be a list, found {kind_of(paragraphs)}", fld="paragraphs")
    for j, para in enumerate(paragraphs):
        ploc = f"{aloc}.paragraphs[{j}]"
        if not isinstance(para, dict):
            raise c.fail(ploc, f"expected a paragraph object with context and qas; found {kind_of(para)}")
        if not c.scoring and para.get("context") is None:
            raise c.fail(ploc, f"missing (paragraph has keys {keys_of(para)})", fld="context")
        qas = para.get("qas")
        if not isinstance(qas, list):
            raise c.fail(ploc, f"missing (paragraph has keys {keys_of(para)})" if qas is None else
                         f"must be a list, found {kind_of(qas)}", fld="qas")
        for k, qa in enumerate(qas):
            qloc = f"{ploc}.qas[{k}]"
            if not isinstance(qa, dict):
                raise c.fail(qloc, f"expected a question object; found {kind_of(qa)}")
            impossible = False if qa.get("is_impossible") is None else qa["is_impossible"]
            if not isinstance(impossible, bool):
                raise c.fail(qloc, f"must be true or false, got {impossible!r}", rid=qa.get("id"), fld="is_impossible")
            present = qa.get("answers") is not None or impossible
            c.add(qloc, dict(qa, context=para.get("context")), title=title, present=present,
                  answers=qa.get("answers"), impossible=impossible)


# ----------------------------------------------------------------- CSV and Parquet: one flat table
def _table(c: RecordChecker, cols: list[str], rows: Iterator[tuple[str, dict]], kind: str) -> str:
    """Rows of a CSV or Parquet table, each a flat record; answers in an ``answers`` column (a JSON
    string in CSV) or an answer_text + answer_start pair of columns (one answer per row)."""
    where, json_hint = ("CSV line 1", " (JSON)") if kind == "csv" else (None, "")
    found = ", ".join(map(repr, cols))
    for col in c.required:
        if col not in cols:
            raise c.fail(where, f"missing required column '{col}' (columns found: {found})", fld=col)
    pair = "answers" not in cols and ("answer_text" in cols or "answer_start" in cols)
    for col in c.pair if pair else ():
        if col not in cols:
            raise c.fail(where, f"missing column '{col}': answer_text and answer_start go together "
                                f"(columns found: {found})", fld=col)
    if "answers" not in cols and not pair and c.split != "test":
        raise c.fail(where, f"missing answer column: need 'answers'{json_hint} or 'answer_text' + "
                            f"'answer_start' unless split='test' (columns found: {found})", fld="answers")
    for loc, row in rows:
        c.add_flat(loc, row, cell=True, pair=pair)
    return kind


def _parquet_rows(c: RecordChecker, p: Path) -> tuple[list[str], Iterator[tuple[str, dict]]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for non-Parquet content
        raise c.fail(None, f"not a readable Parquet file: {e}") from None
    return table.column_names, ((f"row {i}", row) for i, row in enumerate(table.to_pylist()))


def _csv_rows(c: RecordChecker, text: str, delimiter: str) -> tuple[list[str], Iterator[tuple[str, dict]]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        cols = [h.strip() for h in next(reader, [])]
    except csv.Error as e:
        raise c.fail("CSV line 1", f"unreadable header: {e}") from None
    if not cols:
        raise c.fail(None, "empty CSV file (no header row); expected columns id, question, context, "
                           "and answers or answer_text + answer_start")

    def rows() -> Iterator[tuple[str, dict]]:  # located at a row's first line: quoted fields may span several
        line = reader.line_num + 1
        try:
            for values in reader:
                loc, line, row = f"CSV line {line}", reader.line_num + 1, dict(zip(cols, values))
                if len(values) > len(cols):
                    raise c.fail(loc, f"row has {len(values)} fields but the header has {len(cols)}", rid=row.get("id"))
                if values and len(values) < len(cols):
                    missing = cols[len(values):]
                    raise c.fail(loc, f"row has fewer fields than the header (no value for {', '.join(missing)})",
                                 rid=row.get("id"), fld=missing[0])
                if values:
                    yield loc, row
        except csv.Error as e:
            raise c.fail(f"CSV line {reader.line_num}", f"malformed CSV: {e}") from None

    return cols, rows()


def _looks_nested(items: list) -> bool:
    """More items look like articles than flat records: one broken item does not decide the layout."""
    articles = records = 0
    for item in items:
        if isinstance(item, dict) and _RECORD_KEYS & item.keys():
            records += 1
        elif isinstance(item, dict) and ("title" in item or any(key.startswith("paragraph") for key in item)):
            articles += 1
    return articles > records


def _first_line_is_object(text: str) -> bool:
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False
