"""The one SQuAD reader: official nested JSON (v1.1/v2.0), flat JSON / JSON Lines, CSV or Parquet -> flat records.

Each format becomes flat records handed one by one to a LoadedFile (qa_hpc.squad_records), which
raises DataError naming file, record and field before any record is returned. Parsed here, not by
``load_dataset``: its JSON errors name no line or column, a missing field reads as null, and pandas
reads the CSV id 007 as the number 7. The file is read once: the bytes checked are the bytes digested.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from qa_hpc.squad_records import PAIR, DataError, LoadedFile, keys_of, kind_of

__all__ = ["ANSWER_CHECKS", "DataError", "load_qa_records", "load_references"]  # what callers import

SPLITS = ("train", "validation", "test")
ANSWER_CHECKS = ("error", "fix", "skip")
_FORMATS = {
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_SHAPES = (
    'expected the official SQuAD layout {"version": ..., "data": [{"title", "paragraphs": '
    '[{"context", "qas": [...]}]}]}, an array of flat records [{"id", "question", "context", '
    '"answers"}], {"data": [flat records]}, or JSON Lines (one record per line)'
)
_RECORD_KEYS = frozenset({"id", "question", "context", "answers"})  # an article of the nested layout has none
csv.field_size_limit(2**31 - 1)  # long contexts exceed csv's 128 KiB default field limit


def load_qa_records(
    path: str | os.PathLike,
    *,
    split: str = "train",
    version_2_with_negative: bool = False,
    answer_check: str = "error",
) -> tuple[list[dict], LoadedFile]:
    """Every record of a QA file, flat, and what was loaded, or DataError. ``split="test"`` may lack answers;
    ``answer_check``: an answer not at its ``answer_start`` raises ("error"), moves to the nearest one ("fix") or is
    skipped."""
    if split not in SPLITS or answer_check not in ANSWER_CHECKS:
        raise ValueError(
            f"split must be one of {SPLITS} (got {split!r}), answer_check one of {ANSWER_CHECKS} "
            f"(got {answer_check!r})"
        )
    c = LoadedFile(os.fspath(path), split, bool(version_2_with_negative), answer_check)
    _read(c)
    if not c.seen:
        raise c.fail(None, f"contains no records (format {c.fmt})")
    if not c.records:
        raise c.fail(None, f"all {len(c.seen)} records were skipped ({c.skipped}); nothing left to use")
    return c.records, c


def load_references(path: str | os.PathLike) -> dict[str, list[str]]:
    """Question id -> gold texts in file order (unanswerable: ``[]``); only what the official scripts read."""
    c = LoadedFile(os.fspath(path), "validation", scoring=True)  # gold answers must be there
    _read(c)
    if not c.references:
        raise c.fail(None, f"contains no questions (format {c.fmt})")
    return c.references


def _read(c: LoadedFile) -> None:
    """Hands every record of ``c.path`` to ``c``; sets the format it was read as and the bytes' digest."""
    p = Path(c.path)
    if not p.exists():
        what = "dataset file" if c.scoring else "file"
        raise c.fail(None, f"{what} not found (resolved to {p.resolve()}, cwd {os.getcwd()})")
    if p.is_dir():
        inside = ", ".join(
            sorted(x.name for x in p.iterdir() if x.is_file() and x.suffix.lower() in _FORMATS)[:10]
        )
        raise c.fail(
            None, "is a directory, expected a data file" + (f"; data files in it: {inside}" if inside else "")
        )
    name = p.name.lower()
    ext = Path(name.removesuffix(".gz")).suffix
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise c.fail(None, f"cannot read file: {e}") from None
    try:
        data = gzip.decompress(raw) if name.endswith(".gz") else raw
    except (OSError, EOFError) as e:
        raise c.fail(None, f"not a valid gzip file: {e}") from None
    kind = _FORMATS.get(ext) or (
        "parquet"
        if data[:4] == b"PAR1"
        else "json"
        if data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"[")
        else None
    )
    if kind is None:
        raise c.fail(
            None,
            f"cannot tell the format from the extension {ext or '(none)'!r} or the content; "
            "use .json (SQuAD or flat records), .jsonl, .csv, .tsv or .parquet",
        )
    c.digest = hashlib.sha256(raw).hexdigest()
    if kind == "parquet":
        c.fmt = _table(c, *_parquet_rows(c, data), kind)
    elif kind == "csv":
        c.fmt = _table(c, *_csv_rows(c, _decode(c, data), "\t" if ext == ".tsv" else ","), kind)
    else:
        c.fmt = _json(c, _decode(c, data), jsonl_ext=kind == "jsonl")


def _decode(c: LoadedFile, data: bytes) -> str:
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise c.fail(
            None,
            f"not valid UTF-8 at byte offset {e.start} (line {line}, byte {col} of the line; "
            f"bytes {data[e.start : e.start + 4]!r}): {e.reason}. Re-save the file as UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8)",
        ) from None


# ----------------------------------------------------------------- JSON and JSON Lines
def _json(c: LoadedFile, text: str, jsonl_ext: bool) -> str:
    """A JSON document (even saved as .jsonl), or JSON Lines (even saved as .json)."""
    try:
        obj = json.loads(text)
        lines = (
            jsonl_ext and isinstance(obj, dict) and "\n" not in text.strip()
        )  # JSON Lines holding one record
    except json.JSONDecodeError as e:  # a one-line object followed by more: JSON Lines
        lines = jsonl_ext or (
            e.msg == "Extra data" and text.lstrip()[:1] == "{" and "\n" not in text[: e.pos].strip()
        )
        truncated = e.pos >= len(text.rstrip()) or (
            e.msg.startswith("Unterminated string") and '"' not in text[e.pos + 1 :]
        )
        hint = (
            " - the file ends early; it looks truncated (incomplete copy or download?)" if truncated else ""
        )
        if not lines:
            raise c.fail(
                None, f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}{hint}"
            ) from None
    if not lines:
        return _json_value(c, obj)
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            c.add(f"line {n}", json.loads(line))
        except json.JSONDecodeError as e:
            trunc = " (the line ends early; truncated?)" if e.pos >= len(line.rstrip()) else ""
            raise c.fail(f"line {n}", f"not valid JSON: {e.msg} at column {e.colno}{trunc}") from None
    return "jsonl"


def _json_value(c: LoadedFile, obj: Any) -> str:
    if isinstance(obj, dict) and "data" not in obj:
        what = (
            "a single record"
            if {"question", "context"} <= set(obj)
            else f"an object with keys {keys_of(obj)}"
        )
        raise c.fail(None, f"wrong top-level shape: found {what}, without a 'data' field; {_SHAPES}")
    if isinstance(obj, dict) and not isinstance(obj["data"], list):
        raise c.fail(None, f"wrong shape: found {kind_of(obj['data'])}; {_SHAPES}", fld="data")
    if not isinstance(obj, (dict, list)):
        raise c.fail(None, f"wrong top-level shape: found {kind_of(obj)}; {_SHAPES}")
    items, prefix = (obj["data"], "data") if isinstance(obj, dict) else (obj, "")
    nested = _looks_nested(items)
    for i, item in enumerate(items):
        if nested:
            _article(c, f"{prefix}[{i}]", item)
        else:
            c.add(f"{prefix}[{i}]", item)
    return "squad-nested" if nested else "json"


def _article(c: LoadedFile, aloc: str, art: Any) -> None:
    """One article of the official layout: every question of every paragraph, with its context and title."""
    if not isinstance(art, dict):
        raise c.fail(aloc, f"expected an article object with title and paragraphs; found {kind_of(art)}")
    paragraphs = art.get("paragraphs")
    if not isinstance(paragraphs, list):
        raise c.fail(
            aloc,
            f"missing (article has keys {keys_of(art)})"
            if paragraphs is None
            else f"must be a list, found {kind_of(paragraphs)}",
            fld="paragraphs",
        )
    for j, para in enumerate(paragraphs):
        ploc = f"{aloc}.paragraphs[{j}]"
        if not isinstance(para, dict):
            raise c.fail(ploc, f"expected a paragraph object with context and qas; found {kind_of(para)}")
        missing = [key for key in (("qas",) if c.scoring else ("context", "qas")) if para.get(key) is None]
        if missing:
            raise c.fail(ploc, f"missing (paragraph has keys {keys_of(para)})", fld=missing[0])
        if not isinstance(para["qas"], list):
            raise c.fail(ploc, f"must be a list, found {kind_of(para['qas'])}", fld="qas")
        for k, qa in enumerate(para["qas"]):
            qloc = f"{ploc}.qas[{k}]"
            if not isinstance(qa, dict):
                raise c.fail(qloc, f"expected a question object; found {kind_of(qa)}")
            impossible = False if qa.get("is_impossible") is None else qa["is_impossible"]
            if not isinstance(impossible, bool):
                raise c.fail(
                    qloc, f"must be true or false, got {impossible!r}", rid=qa.get("id"), fld="is_impossible"
                )
            rec = dict(qa, context=para.get("context"), title=art.get("title"))
            if rec.get("answers") is None:  # null answers are no answers here
                rec.pop("answers", None)
            c.add(qloc, rec, impossible=impossible)


# ----------------------------------------------------------------- CSV and Parquet: one flat table
def _table(c: LoadedFile, cols: list[str], rows: Iterable[tuple[str, dict]], kind: str) -> str:
    """Rows of a CSV or Parquet table, each a flat record; answers in an ``answers`` column (a JSON
    string in CSV) or an answer_text + answer_start pair of columns (one answer per row)."""
    where, found = "CSV line 1" if kind == "csv" else None, ", ".join(map(repr, cols))
    pair = "answers" not in cols and any(col in cols for col in PAIR)
    together = (PAIR[:1] if c.scoring else PAIR) if pair else ()
    for col in (("id",) if c.scoring else ("id", "question", "context")) + together:
        if col not in cols:
            why = ": answer_text and answer_start go together" if col in together else ""
            raise c.fail(where, f"missing required column '{col}'{why} (columns found: {found})", fld=col)
    if "answers" not in cols and not pair and c.split != "test":
        raise c.fail(
            where,
            f"missing answer column: need 'answers'{' (JSON)' if where else ''} or 'answer_text' + "
            f"'answer_start' unless split='test' (columns found: {found})",
            fld="answers",
        )
    for loc, row in rows:
        c.add(loc, row, cell=True, pair=pair)
    return kind


def _parquet_rows(c: LoadedFile, data: bytes) -> tuple[list[str], Iterator[tuple[str, dict]]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for non-Parquet content
        raise c.fail(None, f"not a readable Parquet file: {e}") from None
    return table.column_names, ((f"row {i}", row) for i, row in enumerate(table.to_pylist()))


def _csv_rows(c: LoadedFile, text: str, delimiter: str) -> tuple[list[str], list[tuple[str, dict]]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    rows, line = [], 1  # each row located at its first line: quoted fields may span several
    try:
        for values in reader:
            rows.append((f"CSV line {line}", values))
            line = reader.line_num + 1
    except csv.Error as e:
        raise c.fail(f"CSV line {reader.line_num}", f"malformed CSV: {e}") from None
    if not rows or not rows[0][1]:
        raise c.fail(
            None,
            "empty CSV file (no header row); expected columns id, question, context, "
            "and answers or answer_text + answer_start",
        )
    cols = [h.strip() for h in rows[0][1]]
    for loc, values in rows[1:]:
        if values and len(values) != len(cols):
            missing, rid = cols[len(values) :], dict(zip(cols, values)).get("id")
            no_value = f" (no value for {', '.join(missing)})" if missing else ""
            raise c.fail(
                loc,
                f"row has {len(values)} fields but the header has {len(cols)}{no_value}",
                rid=rid,
                fld=missing[0] if missing else None,
            )
    return cols, [(loc, dict(zip(cols, values))) for loc, values in rows[1:] if values]


def _looks_nested(items: list) -> bool:
    """More items look like articles than flat records: one broken item does not decide the layout."""
    articles = records = 0
    for item in items:
        if isinstance(item, dict) and _RECORD_KEYS & item.keys():
            records += 1
        elif isinstance(item, dict) and ("title" in item or any(key.startswith("paragraph") for key in item)):
            articles += 1
    return articles > records
