"""The one SQuAD reader: official nested JSON (v1.1/v2.0), flat JSON / JSON Lines, CSV or Parquet -> flat records.

Every record is checked (qa_hpc.squad_records) as it is read; a problem raises DataError naming file,
record and field before any record is returned. Parsed here, not by ``load_dataset``: its JSON errors
name no line or column, a missing field reads as null, and pandas reads the CSV id 007 as the number 7.
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

SPLITS = ("train", "validation", "test")
ANSWER_CHECKS = ("error", "fix", "skip")
_FORMATS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "csv",
            ".parquet": "parquet", ".pq": "parquet"}
_SHAPES = ('expected the official SQuAD layout {"version": ..., "data": [{"title", "paragraphs": '
           '[{"context", "qas": [...]}]}]}, an array of flat records [{"id", "question", "context", '
           '"answers"}], {"data": [flat records]}, or JSON Lines (one record per line)')
_RECORD_KEYS = frozenset({"id", "question", "context", "answers"})  # an article of the nested layout has none


def load_qa_records(path: str | os.PathLike, *, split: str = "train", version_2_with_negative: bool = False,
                    answer_check: str = "error") -> tuple[list[dict], LoadReport]:
    """Every record of a QA file, flat, or DataError. ``split="test"`` may lack answers; ``answer_check``:
    an answer not at its ``answer_start`` raises ("error"), moves to the nearest occurrence ("fix") or is skipped."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if answer_check not in ANSWER_CHECKS:
        raise ValueError(f"answer_check must be one of {ANSWER_CHECKS}, got {answer_check!r}")
    r = _Reader(os.fspath(path), split, bool(version_2_with_negative), answer_check)
    fmt = r.read()
    if r.n_seen == 0:
        raise r.fail(None, f"contains no records (format {fmt})")
    if not r.records:
        raise r.fail(None, f"all {r.n_seen} records were skipped ({r.skipped}); nothing left to use")
    n_impossible = sum(1 for rec in r.records if not rec["answers"]["text"])
    return r.records, LoadReport(r.path, fmt, len(r.records), n_impossible, dict(r.skipped), r.fixed)


def load_references(path: str | os.PathLike) -> dict[str, list[str]]:
    """Question id -> gold texts in file order (unanswerable: ``[]``); only what the official scripts read."""
    r = _Reader(os.fspath(path), "validation", scoring=True)  # gold answers must be there
    fmt = r.read()
    if not r.references:
        raise r.fail(None, f"contains no questions (format {fmt})")
    return r.references


class _Reader(RecordChecker):
    """Reads one file in any supported format; :meth:`read` returns the format it was read as."""

    def read(self) -> str:
        p = Path(self.path)
        if not p.exists():
            raise self.fail(None, f"{self.what} not found (resolved to {p.resolve()}, cwd {os.getcwd()})")
        if p.is_dir():
            inside = sorted(x.name for x in p.iterdir() if x.is_file() and x.suffix.lower() in _FORMATS)
            hint = f"; data files in it: {', '.join(inside[:10])}" if inside else ""
            raise self.fail(None, f"is a directory, expected a data file{hint}")
        suffixes = [s.lower() for s in p.suffixes]
        gz = bool(suffixes) and suffixes[-1] == ".gz"
        ext = (suffixes[-2] if len(suffixes) > 1 else "") if gz else (suffixes[-1] if suffixes else "")
        kind = _FORMATS.get(ext)
        data = b"" if kind == "parquet" else self._bytes(p, gz)  # pyarrow reads Parquet itself
        if kind is None and data[:4] == b"PAR1":
            kind = "parquet"
        elif kind is None and data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
            kind = "json"
        elif kind is None:
            raise self.fail(None, f"cannot tell the format from the extension {ext or '(none)'!r} or the content; "
                                  "use .json (SQuAD or flat records), .jsonl, .csv, .tsv or .parquet")
        if kind == "parquet":
            if gz:
                raise self.fail(None, "gzip-compressed Parquet is not supported; Parquet compresses internally")
            self._parquet(p)
            return kind
        text = self._decode(data)
        if kind == "csv":
            self._csv(text, "\t" if ext == ".tsv" else ",")
            return kind
        return self._json(text, jsonl_ext=kind == "jsonl")

    def _bytes(self, p: Path, gz: bool) -> bytes:
        try:
            data = p.read_bytes()
        except OSError as e:
            raise self.fail(None, f"cannot read file: {e}") from None
        try:
            return gzip.decompress(data) if gz else data
        except (OSError, EOFError) as e:
            raise self.fail(None, f"not a valid gzip file: {e}") from None

    def _decode(self, data: bytes) -> str:
        try:
            return data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
            raise self.fail(None, f"not valid UTF-8 at byte offset {e.start} (line {line}, byte {col} of the line; "
                                  f"bytes {data[e.start:e.start + 4]!r}): {e.reason}. Re-save the file as UTF-8 "
                                  "(e.g. iconv -f latin1 -t utf-8)") from None

    # ----------------------------------------------------------------- JSON and JSON Lines
    def _json(self, text: str, jsonl_ext: bool) -> str:
        if jsonl_ext:
            try:
                self._jsonl(text)
                return "jsonl"
            except DataError as first:  # a pretty-printed JSON document saved as .jsonl is read whole
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError:
                    raise first from None
                if self.n_seen:  # some lines were records: it is JSON Lines, broken
                    raise first from None
                return self._json_value(obj)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data" and _first_line_is_object(text):  # JSON Lines in a .json file
                self._jsonl(text)
                return "jsonl"
            truncated = e.pos >= len(text.rstrip()) or (
                e.msg.startswith("Unterminated string") and '"' not in text[e.pos + 1:])
            hint = " - the file ends early; it looks truncated (incomplete copy or download?)" if truncated else ""
            raise self.fail(None, f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}{hint}") from None
        return self._json_value(obj)

    def _jsonl(self, text: str) -> None:
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                trunc = " (the line ends early; truncated?)" if e.pos >= len(line.rstrip()) else ""
                raise self.fail(f"line {n}", f"not valid JSON: {e.msg} at column {e.colno}{trunc}") from None
            self.add_flat(f"line {n}", obj)

    def _json_value(self, obj: Any) -> str:
        if isinstance(obj, dict):
            if "data" not in obj:
                what = ("a single record" if {"question", "context"} <= set(obj) else
                        f"an object with keys {keys_of(obj)}")
                raise self.fail(None, f"wrong top-level shape: found {what}, without a 'data' field; {_SHAPES}")
            items, prefix = obj["data"], "data"
            if not isinstance(items, list):
                raise self.fail(None, f"wrong shape: found {kind_of(items)}; {_SHAPES}", fld="data")
        elif isinstance(obj, list):
            items, prefix = obj, ""
        else:
            raise self.fail(None, f"wrong top-level shape: found {kind_of(obj)}; {_SHAPES}")
        if _looks_nested(items):
            for i, art in enumerate(items):
                self._article(f"{prefix}[{i}]", art)
            return "squad-nested"
        for i, rec in enumerate(items):
            self.add_flat(f"{prefix}[{i}]", rec)
        return "json"

    def _article(self, aloc: str, art: Any) -> None:
        if not isinstance(art, dict):
            raise self.fail(aloc, f"expected an article object with title and paragraphs; found {kind_of(art)}")
        if "paragraphs" not in art:
            raise self.fail(aloc, f"missing (article has keys {keys_of(art)})", fld="paragraphs")
        title, paragraphs = art.get("title", ""), art["paragraphs"]
        check_title(title, lambda msg, fld: self.fail(aloc, msg, fld=fld))
        if not isinstance(paragraphs, list):
            raise self.fail(aloc, f"must be a list, found {kind_of(paragraphs)}", fld="paragraphs")
        for j, para in enumerate(paragraphs):
            ploc = f"{aloc}.paragraphs[{j}]"
            if not isinstance(para, dict):
                raise self.fail(ploc, f"expected a paragraph object with context and qas; found {kind_of(para)}")
            if not self.scoring and para.get("context") is None:
                raise self.fail(ploc, f"missing (paragraph has keys {keys_of(para)})", fld="context")
            qas = para.get("qas")
            if not isinstance(qas, list):
                raise self.fail(ploc, f"missing (paragraph has keys {keys_of(para)})" if qas is None else
                                f"must be a list, found {kind_of(qas)}", fld="qas")
            for k, qa in enumerate(qas):
                self._question(f"{ploc}.qas[{k}]", qa, para.get("context"), title)

    def _question(self, qloc: str, qa: Any, context: Any, title: Any) -> None:
        if not isinstance(qa, dict):
            raise self.fail(qloc, f"expected a question object; found {kind_of(qa)}")
        impossible = qa.get("is_impossible", False)
        impossible = False if impossible is None else impossible
        if not isinstance(impossible, bool):
            raise self.fail(qloc, f"must be true or false, got {impossible!r}", rid=qa.get("id"), fld="is_impossible")
        present = ("answers" in qa and qa["answers"] is not None) or impossible
        self.add(qloc, dict(qa, context=context), title=title, present=present, answers=qa.get("answers"),
                 impossible=impossible)

    # ----------------------------------------------------------------- CSV and Parquet
    def _csv(self, text: str, delimiter: str) -> None:
        old_limit = csv.field_size_limit(2**31 - 1)  # long contexts exceed csv's 128 KiB field limit
        try:
            reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
            try:
                cols = [h.strip() for h in next(reader, [])]
            except csv.Error as e:
                raise self.fail("CSV line 1", f"unreadable header: {e}") from None
            if not cols:
                raise self.fail(None, "empty CSV file (no header row); expected columns id, question, context, "
                                      "and answers or answer_text + answer_start")
            self._table(cols, self._csv_rows(reader, cols), "CSV line 1", " (JSON)")
        finally:
            csv.field_size_limit(old_limit)

    def _csv_rows(self, reader: Any, cols: list[str]) -> Iterator[tuple[str, dict]]:
        """(location, row) per record: the row's first line, as quoted fields may span several."""
        line = reader.line_num + 1
        while True:
            try:
                values = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise self.fail(f"CSV line {reader.line_num}", f"malformed CSV: {e}") from None
            loc, line, row = f"CSV line {line}", reader.line_num + 1, dict(zip(cols, values))
            if len(values) > len(cols):
                raise self.fail(loc, f"row has {len(values)} fields but the header has {len(cols)}", rid=row.get("id"))
            if values and len(values) < len(cols):
                missing = cols[len(values):]
                raise self.fail(loc, f"row has fewer fields than the header (no value for {', '.join(missing)})",
                                rid=row.get("id"), fld=missing[0])
            if values:
                yield loc, row

    def _parquet(self, p: Path) -> None:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(p)
        except Exception as e:  # pyarrow raises ArrowInvalid/OSError for non-Parquet content
            raise self.fail(None, f"not a readable Parquet file: {e}") from None
        self._table(table.column_names, ((f"row {i}", row) for i, row in enumerate(table.to_pylist())), None, "")

    def _table(self, cols: list[str], rows: Iterator[tuple[str, dict]], where: str | None, json_hint: str) -> None:
        """Rows of a CSV or Parquet file; answers in an ``answers`` column or an answer_text + answer_start pair."""
        found = ", ".join(repr(c) for c in cols)
        for col in self.required:
            if col not in cols:
                raise self.fail(where, f"missing required column '{col}' (columns found: {found})", fld=col)
        pair = "answers" not in cols and ("answer_text" in cols or "answer_start" in cols)
        for col in self.pair if pair else ():
            if col not in cols:
                raise self.fail(where, f"missing column '{col}': answer_text and answer_start go together "
                                       f"(columns found: {found})", fld=col)
        if "answers" not in cols and not pair and self.split != "test":
            raise self.fail(where, f"missing answer column: need 'answers'{json_hint} or 'answer_text' + "
                                   f"'answer_start' unless split='test' (columns found: {found})", fld="answers")
        for loc, row in rows:
            if not pair:
                self.add_flat(loc, row, json_strings=True)
                continue
            rec = {k: v for k, v in row.items() if k not in ("answer_text", "answer_start")}
            self.add(loc, rec, title=row.get("title", ""), present=True, answers=self._pair(loc, row),
                     fld="answer_text", csv_pair=True)

    def _pair(self, loc: str, row: dict) -> list[dict]:
        """The row's answer_text/answer_start as a list of at most one answer (both empty: none)."""
        text, start = row.get("answer_text"), row.get("answer_start")
        start = start.strip() if isinstance(start, str) else start
        has_text, has_start = not (text is None or isinstance(text, str) and not text.strip()), start not in (None, "")
        if self.scoring:  # texts are all the scorer reads
            return [{"text": text}] if has_text else []
        if has_text != has_start:
            empty, other = ("answer_text", "answer_start") if has_start else ("answer_start", "answer_text")
            raise self.fail(loc, f"is empty but {other} is set", rid=row.get("id"), fld=empty)
        if isinstance(start, str):
            try:
                start = int(start)
            except ValueError:
                pass  # reported by the answer check as "must be an integer"
        return [{"text": text, "answer_start": start}] if has_text else []


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


