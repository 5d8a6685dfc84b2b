"""The one SQuAD reader: every local input format -> flat records, checked strictly, in one pass.

Users arrive with the official nested SQuAD JSON (v1.1 / v2.0), flat JSON or JSON Lines, CSV
from a spreadsheet, or Parquet; converting by hand is where records get lost, so all of them
are read here into the HF record ``{"id", "title", "context", "question", "answers": {"text":
[...], "answer_start": [...]}}``. A problem raises :class:`DataError` naming the file, the record
(position and id) and the field before any record is returned; nothing is dropped silently
(only ``answer_check="skip"`` leaves records out, counted in :class:`LoadReport`).

The files are parsed here, not by ``load_dataset``: Arrow infers one type per column, so a
record with an int id or a list context would fail with no position, and "missing" and "null"
would look alike. Training wraps the records in a cached ``datasets.Dataset`` (qa_hpc.features);
the scorer reads the same files through :func:`load_references`, which needs only what the
official evaluation scripts read (a unique string id and the answers' texts).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import numbers
import os
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from qa_hpc.reliability.errors import UsageError

SPLITS = ("train", "validation", "test")
ANSWER_CHECKS = ("error", "fix", "skip")
_FORMATS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "csv",
            ".parquet": "parquet", ".pq": "parquet"}
_SHAPES = ('expected the official SQuAD layout {"version": ..., "data": [{"title", "paragraphs": '
           '[{"context", "qas": [...]}]}]}, an array of flat records [{"id", "question", "context", '
           '"answers"}], {"data": [flat records]}, or JSON Lines (one record per line)')
_RECORD_KEYS = frozenset({"id", "question", "context", "answers"})  # an article of the nested layout has none
_MISSING = object()  # an absent key, as opposed to one present with the value None


class DataError(UsageError):
    """Bad input data: ``str(e)`` is ``path: location (id 'x'): field 'f': what is wrong``.

    The location is ``data[3].paragraphs[0].qas[2]``, ``[5]``, ``line 7``, ``CSV line 12`` or
    ``row 4``; the same pieces are kept as attributes for programs that want them.
    """

    def __init__(self, message: str, *, path: str | None = None, location: str | None = None,
                 record_id: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path, self.location, self.record_id, self.field = path, location, record_id, field


@dataclass
class LoadReport:
    """What was loaded, so logs show at a glance that no data went missing."""

    path: str
    fmt: str  # "squad-nested" | "json" | "jsonl" | "csv" | "parquet"
    n_records: int
    n_impossible: int  # records with no answer (SQuAD v2 style)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count (answer_check="skip")
    fixed: int = 0  # answers whose answer_start was corrected (answer_check="fix")

    def summary(self) -> str:
        """One greppable ``DATA_LOADED key=value ...`` line for job logs."""
        parts = ["DATA_LOADED", f"file={shlex.quote(self.path)}", f"format={self.fmt}", f"records={self.n_records}",
                 f"impossible={self.n_impossible}", f"skipped={sum(self.skipped.values())}", f"fixed={self.fixed}"]
        return " ".join(parts + [f"skipped_{reason}={n}" for reason, n in sorted(self.skipped.items())])


def load_qa_records(path: str | os.PathLike, *, split: str = "train", version_2_with_negative: bool = False,
                    answer_check: str = "error") -> tuple[list[dict], LoadReport]:
    """Every record of a QA file as a flat record, or DataError.

    ``split="test"`` may lack answers; other splits need one per record unless
    ``version_2_with_negative``. ``answer_check``: an answer text not at its ``answer_start``
    raises (``"error"``), moves to the nearest occurrence (``"fix"``) or drops the record (``"skip"``).
    """
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
    """Question id -> gold answer texts in file order (unanswerable: ``[]``), or DataError.

    Context, question and ``answer_start`` are not looked at, so a file the official scripts
    score is accepted; duplicate texts are kept (they do not change a max).
    """
    r = _Reader(os.fspath(path), "validation", scoring=True)  # gold answers must be there
    fmt = r.read()
    if not r.references:
        raise r.fail(None, f"contains no questions (format {fmt})")
    return r.references


class _Answer(NamedTuple):
    text: str
    start: int | None  # None when only texts are asked for (scoring)
    text_field: str
    start_field: str


FieldError = Callable[[str, str], DataError]  # (message, field) -> the error, placed at the record


class _Reader:
    """One file read into records (or, ``scoring``, id -> gold texts), every record checked as it comes."""

    def __init__(self, path: str, split: str, v2: bool = False, answer_check: str = "error",
                 scoring: bool = False) -> None:
        self.path, self.split, self.v2, self.answer_check, self.scoring = path, split, v2, answer_check, scoring
        self.what = "dataset file" if scoring else "file"
        self.required = ("id",) if scoring else ("id", "question", "context")  # columns of a table
        self.pair = ("answer_text",) if scoring else ("answer_text", "answer_start")  # one answer per row
        self.seen: dict[str, str] = {}  # id -> location of its first occurrence
        self.n_seen, self.fixed = 0, 0
        self.records: list[dict] = []
        self.references: dict[str, list[str]] = {}
        self.skipped: dict[str, int] = {}

    def fail(self, loc: str | None, msg: str, *, rid: Any = None, fld: str | None = None) -> DataError:
        rid = rid if isinstance(rid, str) and rid else None
        where = " ".join(p for p in (loc, rid and f"(id {rid!r})") if p)
        head = f"{self.path}: {where}" if where else self.path
        return DataError(f"{head}: " + (f"field '{fld}': {msg}" if fld else msg), path=self.path, location=loc,
                         record_id=rid, field=fld)

    # ----------------------------------------------------------------- the file
    def read(self) -> str:
        """Hand every record of the file to :meth:`add`; return the format it was read as."""
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
                        f"an object with keys {_keys(obj)}")
                raise self.fail(None, f"wrong top-level shape: found {what}, without a 'data' field; {_SHAPES}")
            items, prefix = obj["data"], "data"
            if not isinstance(items, list):
                raise self.fail(None, f"wrong shape: found {_kind(items)}; {_SHAPES}", fld="data")
        elif isinstance(obj, list):
            items, prefix = obj, ""
        else:
            raise self.fail(None, f"wrong top-level shape: found {_kind(obj)}; {_SHAPES}")
        if _looks_nested(items):
            for i, art in enumerate(items):
                self._article(f"{prefix}[{i}]", art)
            return "squad-nested"
        for i, rec in enumerate(items):
            self.add_flat(f"{prefix}[{i}]", rec)
        return "json"

    def _article(self, aloc: str, art: Any) -> None:
        if not isinstance(art, dict):
            raise self.fail(aloc, f"expected an article object with title and paragraphs; found {_kind(art)}")
        if "paragraphs" not in art:
            raise self.fail(aloc, f"missing (article has keys {_keys(art)})", fld="paragraphs")
        title, paragraphs = art.get("title", ""), art["paragraphs"]
        if title is not None and not isinstance(title, str):
            raise self.fail(aloc, f"must be a string, got {type(title).__name__}", fld="title")
        if not isinstance(paragraphs, list):
            raise self.fail(aloc, f"must be a list, found {_kind(paragraphs)}", fld="paragraphs")
        for j, para in enumerate(paragraphs):
            ploc = f"{aloc}.paragraphs[{j}]"
            if not isinstance(para, dict):
                raise self.fail(ploc, f"expected a paragraph object with context and qas; found {_kind(para)}")
            if not self.scoring and para.get("context") is None:
                raise self.fail(ploc, f"missing (paragraph has keys {_keys(para)})", fld="context")
            qas = para.get("qas")
            if not isinstance(qas, list):
                raise self.fail(ploc, f"missing (paragraph has keys {_keys(para)})" if qas is None else
                                f"must be a list, found {_kind(qas)}", fld="qas")
            for k, qa in enumerate(qas):
                self._question(f"{ploc}.qas[{k}]", qa, para.get("context"), title)

    def _question(self, qloc: str, qa: Any, context: Any, title: Any) -> None:
        if not isinstance(qa, dict):
            raise self.fail(qloc, f"expected a question object; found {_kind(qa)}")
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
        """(location, row) per record; a location is the row's first line, as quoted fields may span several."""
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

    # ----------------------------------------------------------------- one record
    def add_flat(self, loc: str, rec: Any, *, json_strings: bool = False) -> None:
        """One flat record (JSON, JSON Lines, CSV and Parquet share this)."""
        if not isinstance(rec, dict):
            raise self.fail(loc, f"expected a record object with id, question, context, answers; found {_kind(rec)}")
        if "paragraphs" in rec and "qas" not in rec and "question" not in rec:
            raise self.fail(loc, "this looks like a nested SQuAD article (it has 'paragraphs') inside a file of flat "
                                 'records; use the official layout {"version": ..., "data": [articles]} or flatten it',
                            fld="paragraphs")
        present = "answers" in rec and not (rec["answers"] is None and self.split == "test")
        self.add(loc, rec, title=rec.get("title", ""), present=present, answers=rec.get("answers"),
                 json_strings=json_strings)

    def add(self, loc: str, raw: dict, *, title: Any, present: bool, answers: Any, impossible: bool = False,
            fld: str = "answers", json_strings: bool = False, csv_pair: bool = False) -> None:
        """Check one record and keep it (or its gold texts, when scoring)."""
        self.n_seen += 1
        rid = self._id(loc, raw)

        def err(msg: str, f: str) -> DataError:
            return self.fail(loc, msg, rid=rid, fld=f)

        if self.scoring:
            if not present:
                raise err(f"missing (record has keys {_keys(raw)}); scoring needs the gold answers", fld)
            golds = [] if impossible else _answers(answers, fld, err, json_strings, csv_pair, scoring=True)
            self.references[rid] = [a.text for a in golds]
            return
        title = "" if title is None else title
        if not isinstance(title, str):
            raise err(f"must be a string, got {type(title).__name__}", "title")
        question, context = (self._text(raw, name, err) for name in ("question", "context"))
        if not present and self.split != "test":
            raise err(f"missing (record has keys {_keys(raw)}); answers may be left out only for split='test'", fld)
        golds = [] if impossible or not present else _answers(answers, fld, err, json_strings, csv_pair, False)
        if not golds and self.split != "test" and not self.v2:
            why = "is_impossible is true" if impossible else "no answers given"
            raise err(f"record has no answer ({why}) but version_2_with_negative is off; pass "
                      "--version_2_with_negative for SQuAD v2-style data with unanswerable questions",
                      "is_impossible" if impossible else fld)
        placed = self._placed(context, golds, err)
        if placed is None:
            self.skipped["answer_not_at_start"] = self.skipped.get("answer_not_at_start", 0) + 1
            return
        self.records.append({"id": rid, "title": title, "context": context, "question": question,
                             "answers": {"text": [a.text for a in placed], "answer_start": [a.start for a in placed]}})

    def _id(self, loc: str, raw: dict) -> str:
        """The record's id: present, a non-empty string, not seen before in this file."""
        rid = raw.get("id", _MISSING)
        if rid is _MISSING or rid is None:
            raise self.fail(loc, f"missing (record has keys {_keys(raw)})", fld="id")
        if not isinstance(rid, str):
            raise self.fail(loc, f"must be a string, got {type(rid).__name__} {rid!r} (ids must be strings; quote them)",
                            fld="id")
        if not rid.strip():
            raise self.fail(loc, "is empty", fld="id")
        if rid in self.seen:
            raise self.fail(loc, f"duplicate id {rid!r}: first seen at {self.seen[rid]}, again at {loc}", rid=rid,
                            fld="id")
        self.seen[rid] = loc
        return rid

    @staticmethod
    def _text(raw: dict, name: str, err: FieldError) -> str:
        """question / context: a string with something in it."""
        val = raw.get(name)
        if val is None:
            raise err(f"missing (record has keys {_keys(raw)})", name)
        if not isinstance(val, str):
            raise err(f"must be a string, got {type(val).__name__}", name)
        if not val.strip():
            raise err("is empty or whitespace only", name)
        return val

    def _placed(self, context: str, golds: list[_Answer], err: FieldError) -> list[_Answer] | None:
        """Answers whose text is at their answer_start, fixed if asked; None: skip the record."""
        out, n_fixed = [], 0
        for a in golds:
            start = a.start
            if start < 0 or start >= len(context):
                raise err(f"{start} is out of range for a context of {len(context)} characters", a.start_field)
            found = context[start:start + len(a.text)]
            if found != a.text:
                if self.answer_check == "skip":
                    return None
                new = _nearest(context, a.text, start)
                if self.answer_check == "error" or new is None:
                    where = ("; the text does not occur anywhere in the context" if new is None else
                             f"; the text does occur at {new} (answer_check='fix' corrects such offsets, "
                             "'skip' drops such records)")
                    raise err(f"answer text {_short(a.text)} not found at answer_start {start} "
                              f"(context has {_short(found)} there){where}", a.text_field)
                start, n_fixed = new, n_fixed + 1
            out.append(a._replace(start=start))
        self.fixed += n_fixed
        return out


def _answers(answers: Any, fld: str, err: FieldError, json_strings: bool, csv_pair: bool,
             scoring: bool) -> list[_Answer]:
    """Every answer of one record, from HF columns, SQuAD objects or a JSON string of either.

    Scoring reads only the texts, as the official scripts do: ``answer_start`` may be absent
    and an empty text is kept (v2 scoring ignores golds that normalize to nothing).
    """
    if json_strings and isinstance(answers, str):  # a CSV/Parquet cell; empty means no answer
        if not answers.strip():
            return []
        try:
            answers = json.loads(answers)
        except json.JSONDecodeError as e:
            raise err(f"is not valid JSON ({e.msg} at column {e.colno}); expected "
                      '{"text": [...], "answer_start": [...]} or [{"text": ..., "answer_start": ...}]', fld) from None
    keys = ("text",) if scoring else ("text", "answer_start")
    if answers is None:
        return []
    if isinstance(answers, dict):  # HF columns {"text": [...], "answer_start": [...]}
        for key in keys:
            if key not in answers:
                raise err(f"missing (answers has keys {_keys(answers)})", f"{fld}.{key}")
        texts, starts = answers["text"], answers.get("answer_start")
        if isinstance(texts, str) and (_is_int(starts) or scoring):  # one answer written as scalars
            texts, starts = [texts], [starts]
        for key, val in zip(keys, (texts, starts)):
            if not isinstance(val, (list, tuple)):
                raise err(f"must be a list, got {type(val).__name__}", f"{fld}.{key}")
        if scoring:
            starts = [None] * len(texts)
        elif len(texts) != len(starts):
            raise err(f"has {len(texts)} texts but {len(starts)} answer_start values", f"{fld}.answer_start")
        raw = list(zip(texts, starts))
    elif isinstance(answers, (list, tuple)):  # SQuAD objects [{"text": ..., "answer_start": ...}]
        for i, a in enumerate(answers):
            if not isinstance(a, dict):
                raise err(f"must be an object with text and answer_start, got {type(a).__name__}", f"{fld}[{i}]")
            for key in keys:
                if key not in a:
                    raise err(f"missing (answer has keys {_keys(a)})", f"{fld}[{i}].{key}")
        raw = [(a["text"], a.get("answer_start")) for a in answers]
    else:
        raise err(f"must be a list of {{text, answer_start}} objects or "
                  f'{{"text": [...], "answer_start": [...]}}, got {type(answers).__name__}', fld)
    out = []
    for i, (text, start) in enumerate(raw):
        # a CSV answer_text/answer_start pair is named by its columns, not by a JSON path
        tf, sf = ("answer_text", "answer_start") if csv_pair else (f"{fld}[{i}].text", f"{fld}[{i}].answer_start")
        if not isinstance(text, str):
            raise err(f"must be a string, got {type(text).__name__}", tf)
        if not scoring and not text.strip():
            raise err("answer text is empty", tf)
        if not scoring and not _is_int(start):
            raise err(f"must be an integer character offset, got {type(start).__name__} {start!r}", sf)
        out.append(_Answer(text, None if scoring else int(start), tf, sf))
    return out


def _looks_nested(items: list) -> bool:
    """More items look like articles (title / paragraph*, no record field) than like flat records.

    Counting every item keeps one broken article (or record) from deciding the layout of the
    whole file; a tie reads as flat records, whose reader names an article found among them.
    """
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


def _nearest(context: str, text: str, start: int) -> int | None:
    """Offset of the occurrence of ``text`` closest to ``start`` (earlier wins ties)."""
    best, pos = None, context.find(text)
    while pos != -1:
        if best is None or abs(pos - start) < abs(best - start):
            best = pos
        pos = context.find(text, pos + 1)
    return best


def _is_int(v: Any) -> bool:
    """An integer, but not a bool (JSON true must not pass as offset 1)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _keys(d: Any) -> str:
    """The first keys of an object, for "missing (record has keys [...])"."""
    if not isinstance(d, dict):
        return "(not an object)"
    ks = list(d)
    return "[" + ", ".join(repr(str(k)) for k in ks[:12]) + (", ..." if len(ks) > 12 else "") + "]"


def _kind(v: Any) -> str:
    """What a value is, in words: "an object with keys [...]", "a list of 3 items", "null"."""
    if isinstance(v, dict):
        return f"an object with keys {_keys(v)}"
    if isinstance(v, list):
        return f"a list of {len(v)} items"
    return "null" if v is None else f"a {type(v).__name__} ({_short(v)})"


def _short(v: Any, n: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."
