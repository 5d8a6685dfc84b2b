"""Load extractive question-answering records from local files, strictly.

Users of an HPC cluster arrive with data in whatever shape their group uses:
the official nested SQuAD JSON (v1.1 / v2.0), Hugging Face style flat JSON or
JSON Lines, CSV exported from a spreadsheet, or Parquet. Converting by hand is
where records get lost, so this module reads all of them directly and turns
every one into the same flat record::

    {"id": str, "title": str, "context": str, "question": str,
     "answers": {"text": [str, ...], "answer_start": [int, ...]}}

Nothing is dropped silently. A problem in the input raises :class:`DataError`
naming the file, the record (id and position) and the field, before any
record is returned, so a 10-hour job does not die at step 9000 or quietly
train on half the data. The only records ever left out are those a user asked
to leave out (``answer_check="skip"``), and those are counted in the
:class:`LoadReport`.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import numbers
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

__all__ = ["DataError", "LoadReport", "load_qa_records", "SPLITS", "ANSWER_CHECKS"]

SPLITS = ("train", "validation", "test")
ANSWER_CHECKS = ("error", "fix", "skip")

_JSON_EXTS = {".json"}
_JSONL_EXTS = {".jsonl", ".ndjson"}
_CSV_EXTS = {".csv": ",", ".tsv": "\t"}
_PARQUET_EXTS = {".parquet", ".pq"}
_PARQUET_MAGIC = b"PAR1"


class DataError(ValueError):
    """Bad input data.

    ``str(e)`` names the file, the record (its id and/or position such as
    ``data[3].paragraphs[0].qas[2]``, ``data[5]``, ``line 7`` or
    ``CSV line 12``) and the field, so the user can open the file and fix it
    without re-running anything. The same pieces are kept as attributes for
    programs that want them.
    """

    def __init__(self, message: str, *, path: str | None = None, location: str | None = None,
                 record_id: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.location = location
        self.record_id = record_id
        self.field = field


@dataclass
class LoadReport:
    """What was loaded, so logs show at a glance that no data went missing."""

    path: str
    fmt: str  # "squad-nested" | "json" | "jsonl" | "csv" | "parquet"
    n_records: int  # records returned
    n_impossible: int  # returned records with no answer (SQuAD v2 style)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count (answer_check="skip")
    fixed: int = 0  # answers whose answer_start was corrected (answer_check="fix")

    def summary(self) -> str:
        """One greppable ``DATA_LOADED key=value ...`` line for job logs."""
        parts = [
            "DATA_LOADED",
            f"file={shlex.quote(self.path)}",
            f"format={self.fmt}",
            f"records={self.n_records}",
            f"impossible={self.n_impossible}",
            f"skipped={sum(self.skipped.values())}",
            f"fixed={self.fixed}",
        ]
        parts += [f"skipped_{reason}={n}" for reason, n in sorted(self.skipped.items())]
        return " ".join(parts)


# --------------------------------------------------------------------------- helpers


class _Loader:
    """Per-call state: options, seen ids, counters. Keeps the format readers small."""

    def __init__(self, path: str, split: str, v2: bool, answer_check: str) -> None:
        self.path = path
        self.name = path
        self.split = split
        self.v2 = v2
        self.answer_check = answer_check
        self.seen: dict[str, str] = {}  # id -> location of first occurrence
        self.records: list[dict] = []
        self.skipped: dict[str, int] = {}
        self.fixed = 0
        self.n_seen = 0

    # -- errors
    def fail(self, loc: str | None, msg: str, *, rid: Any = None, fld: str | None = None) -> DataError:
        where = [self.path]
        if loc:
            where.append(loc)
        if isinstance(rid, str) and rid:
            where.append(f"(id {rid!r})")
        head = ": ".join([where[0], " ".join(where[1:])]) if len(where) > 1 else where[0]
        body = f"field '{fld}': {msg}" if fld else msg
        return DataError(f"{head}: {body}", path=self.path, location=loc,
                         record_id=rid if isinstance(rid, str) else None, field=fld)

    # -- one record
    def add(self, loc: str, raw: dict, *, title: Any = "", answers_present: bool,
            answers: Any = None, impossible: bool = False, answers_field: str = "answers",
            json_strings: bool = False, csv_pair: bool = False) -> None:
        """Validate one record and append it (or count it as skipped).

        ``csv_pair``: answers came from CSV answer_text/answer_start columns, so
        errors name those columns rather than a JSON path.
        """
        def fname(aloc: str, key: str) -> str:
            if csv_pair:
                return "answer_text" if key == "text" else "answer_start"
            return f"{aloc}.{key}"

        self.n_seen += 1
        rid = raw.get("id", None) if "id" in raw else _MISSING
        if rid is _MISSING or rid is None:
            raise self.fail(loc, f"missing (record has keys {_keys(raw)})", fld="id")
        if not isinstance(rid, str):
            raise self.fail(loc, f"must be a string, got {type(rid).__name__} {rid!r} "
                                 "(ids must be strings; quote them)", fld="id")
        if not rid.strip():
            raise self.fail(loc, "is empty", fld="id")
        if rid in self.seen:
            raise self.fail(loc, f"duplicate id {rid!r}: first seen at {self.seen[rid]}, again at {loc}",
                            rid=rid, fld="id")
        self.seen[rid] = loc

        if title is None:
            title = ""
        if not isinstance(title, str):
            raise self.fail(loc, f"must be a string, got {type(title).__name__}", rid=rid, fld="title")

        texts: dict[str, str] = {}
        for name in ("question", "context"):
            if name not in raw or raw[name] is None:
                raise self.fail(loc, f"missing (record has keys {_keys(raw)})", rid=rid, fld=name)
            val = raw[name]
            if not isinstance(val, str):
                raise self.fail(loc, f"must be a string, got {type(val).__name__}", rid=rid, fld=name)
            if not val.strip():
                raise self.fail(loc, "is empty or whitespace only", rid=rid, fld=name)
            texts[name] = val
        context = texts["context"]

        if not answers_present:
            if self.split != "test":
                raise self.fail(loc, f"missing (record has keys {_keys(raw)}); answers may be left out "
                                     "only for split='test'", rid=rid, fld=answers_field)
            pairs: list[tuple[str, int, str]] = []
        elif impossible:
            pairs = []
        else:
            pairs = self._answers(loc, rid, answers, answers_field, json_strings, fname)

        if not pairs and self.split != "test" and not self.v2:
            why = "is_impossible is true" if impossible else "no answers given"
            raise self.fail(loc, f"record has no answer ({why}) but version_2_with_negative is off; "
                                 "pass --version_2_with_negative for SQuAD v2-style data with "
                                 "unanswerable questions", rid=rid,
                            fld="is_impossible" if impossible else answers_field)

        out_text: list[str] = []
        out_start: list[int] = []
        n_fixed = 0
        for text, start, aloc in pairs:
            if start < 0 or start >= len(context):
                raise self.fail(loc, f"{start} is out of range for a context of {len(context)} "
                                     "characters", rid=rid, fld=fname(aloc, "answer_start"))
            if context[start:start + len(text)] != text:
                found = context[start:start + len(text)]
                if self.answer_check == "skip":
                    self.skipped["answer_not_at_start"] = self.skipped.get("answer_not_at_start", 0) + 1
                    return
                new = _nearest(context, text, start)
                if self.answer_check == "error" or new is None:
                    if new is None:
                        hint = "; the text does not occur anywhere in the context"
                    else:
                        hint = (f"; the text does occur at {new} (answer_check='fix' corrects such "
                                "offsets, 'skip' drops such records)")
                    raise self.fail(loc, f"answer text {_short(text)} not found at answer_start {start} "
                                         f"(context has {_short(found)} there){hint}",
                                    rid=rid, fld=fname(aloc, "text"))
                start = new
                n_fixed += 1
            out_text.append(text)
            out_start.append(start)
        self.fixed += n_fixed
        self.records.append({
            "id": rid,
            "title": title,
            "context": context,
            "question": texts["question"],
            "answers": {"text": out_text, "answer_start": out_start},
        })

    def _answers(self, loc: str, rid: str, answers: Any, fld: str, json_strings: bool,
                 fname: Any) -> list[tuple[str, int, str]]:
        """Normalise HF-style dict or list-of-dicts answers to (text, start, field-path)."""
        if json_strings and isinstance(answers, str):
            if not answers.strip():
                return []
            try:
                answers = json.loads(answers)
            except json.JSONDecodeError as e:
                raise self.fail(loc, f"is not valid JSON ({e.msg} at column {e.colno}); expected "
                                     '{"text": [...], "answer_start": [...]} or '
                                     '[{"text": ..., "answer_start": ...}]', rid=rid, fld=fld) from None
        if answers is None:
            return []
        pairs: list[tuple[Any, Any, str]] = []
        if isinstance(answers, dict):
            for key in ("text", "answer_start"):
                if key not in answers:
                    raise self.fail(loc, f"missing (answers has keys {_keys(answers)})",
                                    rid=rid, fld=f"{fld}.{key}")
            texts, starts = answers["text"], answers["answer_start"]
            if isinstance(texts, str) and _is_int(starts):  # a single answer written as scalars
                texts, starts = [texts], [starts]
            for key, val in (("text", texts), ("answer_start", starts)):
                if not isinstance(val, (list, tuple)):
                    raise self.fail(loc, f"must be a list, got {type(val).__name__}",
                                    rid=rid, fld=f"{fld}.{key}")
            if len(texts) != len(starts):
                raise self.fail(loc, f"has {len(texts)} texts but {len(starts)} answer_start values",
                                rid=rid, fld=f"{fld}.answer_start")
            for i, (t, s) in enumerate(zip(texts, starts)):
                pairs.append((t, s, f"{fld}[{i}]"))
        elif isinstance(answers, (list, tuple)):
            for i, a in enumerate(answers):
                if not isinstance(a, dict):
                    raise self.fail(loc, f"must be an object with text and answer_start, got "
                                         f"{type(a).__name__}", rid=rid, fld=f"{fld}[{i}]")
                for key in ("text", "answer_start"):
                    if key not in a:
                        raise self.fail(loc, f"missing (answer has keys {_keys(a)})",
                                        rid=rid, fld=f"{fld}[{i}].{key}")
                pairs.append((a["text"], a["answer_start"], f"{fld}[{i}]"))
        else:
            raise self.fail(loc, f"must be a list of {{text, answer_start}} objects or "
                                 f'{{"text": [...], "answer_start": [...]}}, got {type(answers).__name__}',
                            rid=rid, fld=fld)
        out = []
        for t, s, aloc in pairs:
            if not isinstance(t, str):
                raise self.fail(loc, f"must be a string, got {type(t).__name__}", rid=rid, fld=fname(aloc, "text"))
            if not t.strip():
                raise self.fail(loc, "answer text is empty", rid=rid, fld=fname(aloc, "text"))
            if not _is_int(s):
                raise self.fail(loc, f"must be an integer character offset, got {type(s).__name__} {s!r}",
                                rid=rid, fld=fname(aloc, "answer_start"))
            out.append((t, int(s), aloc))
        return out

    # -- flat records (JSON, JSONL, CSV and Parquet share this)
    def add_flat(self, loc: str, rec: Any, *, json_strings: bool = False) -> None:
        if not isinstance(rec, dict):
            raise self.fail(loc, f"expected a record object with id, question, context, answers; "
                                 f"found {_kind(rec)}")
        if "paragraphs" in rec and "qas" not in rec and "question" not in rec:
            raise self.fail(loc, "this looks like a nested SQuAD article (it has 'paragraphs') inside a "
                                 "file of flat records; use the official layout "
                                 '{"version": ..., "data": [articles]} or flatten it', fld="paragraphs")
        present = "answers" in rec and not (rec["answers"] is None and self.split == "test")
        self.add(loc, rec, title=rec.get("title", ""), answers_present=present,
                 answers=rec.get("answers"), json_strings=json_strings)


_MISSING = object()


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _keys(d: Any) -> str:
    if not isinstance(d, dict):
        return "(not an object)"
    ks = list(d.keys())
    shown = ", ".join(repr(str(k)) for k in ks[:12])
    return "[" + shown + (", ..." if len(ks) > 12 else "") + "]"


def _kind(v: Any) -> str:
    if isinstance(v, dict):
        return f"an object with keys {_keys(v)}"
    if isinstance(v, list):
        return f"a list of {len(v)} items"
    if v is None:
        return "null"
    return f"a {type(v).__name__} ({_short(v)})"


def _short(v: Any, n: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def _nearest(context: str, text: str, start: int) -> int | None:
    """Offset of the occurrence of ``text`` closest to ``start`` (earlier wins ties)."""
    best = None
    pos = context.find(text)
    while pos != -1:
        if best is None or abs(pos - start) < abs(best - start):
            best = pos
        pos = context.find(text, pos + 1)
    return best


# --------------------------------------------------------------------------- readers


def _decode(ld: _Loader, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ld.fail(None, f"not valid UTF-8 at byte offset {e.start} (line {line}, byte {col} of the "
                            f"line; bytes {data[e.start:e.start + 4]!r}): {e.reason}. Re-save the file "
                            "as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    return text[1:] if text.startswith("\ufeff") else text


def _json_error(ld: _Loader, text: str, e: json.JSONDecodeError) -> DataError:
    truncated = e.pos >= len(text.rstrip()) or (
        e.msg.startswith("Unterminated string") and '"' not in text[e.pos + 1:])
    hint = " - the file ends early; it looks truncated (incomplete copy or download?)" if truncated else ""
    return ld.fail(None, f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}{hint}")


def _iter_jsonl(ld: _Loader, text: str) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            trunc = " (the line ends early; truncated?)" if e.pos >= len(line.rstrip()) else ""
            raise ld.fail(f"line {n}", f"not valid JSON: {e.msg} at column {e.colno}{trunc}") from None


def _read_jsonl(ld: _Loader, text: str) -> None:
    for n, obj in _iter_jsonl(ld, text):
        ld.add_flat(f"line {n}", obj)


_SHAPES = ('expected the official SQuAD layout {"version": ..., "data": [{"title", "paragraphs": '
           '[{"context", "qas": [...]}]}]}, a list of flat records [{"id", "question", "context", '
           '"answers"}], {"data": [flat records]}, or JSON Lines (one record per line)')


def _read_json_value(ld: _Loader, obj: Any) -> str:
    """Dispatch a parsed JSON document to the nested or flat reader; return the format name."""
    if isinstance(obj, dict):
        if "data" not in obj:
            what = ("a single record" if {"question", "context"} <= set(obj) else
                    f"an object with keys {_keys(obj)}")
            raise ld.fail(None, f"wrong top-level shape: found {what}; {_SHAPES}")
        items, prefix = obj["data"], "data"
        if not isinstance(items, list):
            raise ld.fail(None, f"wrong shape: found {_kind(items)}; {_SHAPES}", fld="data")
    elif isinstance(obj, list):
        items, prefix = obj, ""
    else:
        raise ld.fail(None, f"wrong top-level shape: found {_kind(obj)}; {_SHAPES}")
    nested = bool(items) and isinstance(items[0], dict) and "paragraphs" in items[0]
    if nested:
        _read_nested(ld, items, prefix)
        return "squad-nested"
    for i, rec in enumerate(items):
        ld.add_flat(f"{prefix}[{i}]", rec)
    return "json"


def _read_nested(ld: _Loader, articles: list, prefix: str) -> None:
    for i, art in enumerate(articles):
        aloc = f"{prefix}[{i}]"
        if not isinstance(art, dict):
            raise ld.fail(aloc, f"expected an article object with title and paragraphs; found {_kind(art)}")
        if "paragraphs" not in art:
            raise ld.fail(aloc, f"missing (article has keys {_keys(art)})", fld="paragraphs")
        title = art.get("title", "")
        if title is not None and not isinstance(title, str):
            raise ld.fail(aloc, f"must be a string, got {type(title).__name__}", fld="title")
        paras = art["paragraphs"]
        if not isinstance(paras, list):
            raise ld.fail(aloc, f"must be a list, found {_kind(paras)}", fld="paragraphs")
        for j, para in enumerate(paras):
            ploc = f"{aloc}.paragraphs[{j}]"
            if not isinstance(para, dict):
                raise ld.fail(ploc, f"expected a paragraph object with context and qas; found {_kind(para)}")
            if "context" not in para or para["context"] is None:
                raise ld.fail(ploc, f"missing (paragraph has keys {_keys(para)})", fld="context")
            qas = para.get("qas")
            if qas is None:
                raise ld.fail(ploc, f"missing (paragraph has keys {_keys(para)})", fld="qas")
            if not isinstance(qas, list):
                raise ld.fail(ploc, f"must be a list, found {_kind(qas)}", fld="qas")
            for k, qa in enumerate(qas):
                qloc = f"{ploc}.qas[{k}]"
                if not isinstance(qa, dict):
                    raise ld.fail(qloc, f"expected a question object; found {_kind(qa)}")
                imp = qa.get("is_impossible", False)
                if imp is None:
                    imp = False
                if not isinstance(imp, bool):
                    raise ld.fail(qloc, f"must be true or false, got {imp!r}", rid=qa.get("id"),
                                  fld="is_impossible")
                rec = dict(qa)
                rec["context"] = para["context"]
                present = ("answers" in qa and qa["answers"] is not None) or imp
                ld.add(qloc, rec, title=title, answers_present=present, answers=qa.get("answers"),
                       impossible=imp)


def _read_json_file(ld: _Loader, text: str, jsonl_ext: bool) -> str:
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
        if e.msg == "Extra data":
            first = next((ln for ln in text.splitlines() if ln.strip()), "")
            try:
                first_obj = json.loads(first)
            except json.JSONDecodeError:
                first_obj = None
            if isinstance(first_obj, dict):  # one JSON object per line in a .json file
                _read_jsonl(ld, text)
                return "jsonl"
        raise _json_error(ld, text, e) from None
    return _read_json_value(ld, obj)


def _read_csv(ld: _Loader, text: str, delimiter: str) -> None:
    old_limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)  # long contexts exceed the 128 KiB default
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
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
        for col in ("id", "question", "context"):
            if col not in cols:
                raise ld.fail("CSV line 1", f"missing required column '{col}' (columns found: {found})",
                              fld=col)
        if "answers" in cols:
            mode = "json"
        elif "answer_text" in cols or "answer_start" in cols:
            for col in ("answer_text", "answer_start"):
                if col not in cols:
                    raise ld.fail("CSV line 1", f"missing column '{col}': answer_text and answer_start go "
                                                f"together (columns found: {found})", fld=col)
            mode = "pair"
        elif ld.split == "test":
            mode = "none"
        else:
            raise ld.fail("CSV line 1", "missing answer column: need 'answers' (JSON) or 'answer_text' + "
                                        f"'answer_start' unless split='test' (columns found: {found})",
                          fld="answers")
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
            if None in row:
                raise ld.fail(loc, f"row has {len(cols) + len(row[None])} fields but the header has "
                                   f"{len(cols)}", rid=row.get("id"))
            missing = [c for c in cols if row.get(c) is None]
            if missing:
                raise ld.fail(loc, f"row has fewer fields than the header (no value for "
                                   f"{', '.join(missing)})", rid=row.get("id"), fld=missing[0])
            if mode == "pair":
                t, s = row["answer_text"], row["answer_start"].strip()
                if not t.strip() and not s:
                    answers: Any = []
                elif not s:
                    raise ld.fail(loc, "is empty but answer_text is set", rid=row["id"], fld="answer_start")
                elif not t.strip():
                    raise ld.fail(loc, "is empty but answer_start is set", rid=row["id"], fld="answer_text")
                else:
                    try:
                        start: Any = int(s)
                    except ValueError:
                        start = s
                    answers = [{"text": t, "answer_start": start}]
                rec = {k: row[k] for k in cols if k not in ("answer_text", "answer_start")}
                ld.add(loc, rec, title=row.get("title", ""), answers_present=True, answers=answers,
                       answers_field="answer_text", csv_pair=True)
            else:
                ld.add_flat(loc, row, json_strings=True)
    finally:
        csv.field_size_limit(old_limit)


def _read_parquet(ld: _Loader, path: Path) -> None:
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
    for col in ("id", "question", "context"):
        if col not in cols:
            raise ld.fail(None, f"missing required column '{col}' (columns found: {found})", fld=col)
    pair = "answers" not in cols and "answer_text" in cols and "answer_start" in cols
    if "answers" not in cols and not pair and ld.split != "test":
        raise ld.fail(None, "missing answer column: need 'answers' or 'answer_text' + 'answer_start' "
                            f"unless split='test' (columns found: {found})", fld="answers")
    for i, row in enumerate(table.to_pylist()):
        loc = f"row {i}"
        if pair:
            t, s = row.pop("answer_text"), row.pop("answer_start")
            none = (t is None or (isinstance(t, str) and not t.strip())) and s is None
            row["answers"] = [] if none else [{"text": t, "answer_start": s}]
        ld.add_flat(loc, row, json_strings=True)


def _sniff(data: bytes) -> str:
    if data[:4] == _PARQUET_MAGIC:
        return "parquet"
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if head in (b"{", b"["):
        return "json"
    return "unknown"


# --------------------------------------------------------------------------- entry point


def load_qa_records(path: str | os.PathLike, *, split: str = "train", version_2_with_negative: bool = False,
                    answer_check: str = "error") -> tuple[list[dict], LoadReport]:
    """Read every record of a QA file into flat records, or raise DataError.

    ``split`` decides what must be there: ``"test"`` files may lack answers;
    ``"train"``/``"validation"`` need an answer per record unless
    ``version_2_with_negative`` (SQuAD v2, unanswerable questions allowed).
    ``answer_check`` says what to do when an answer's text is not at its
    ``answer_start``: ``"error"`` (raise), ``"fix"`` (move the offset to the
    nearest occurrence of the text, counted in ``report.fixed``) or ``"skip"``
    (drop the record, counted in ``report.skipped``). All answers are
    validated and returned even for ``"train"``, where only the first is used.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if answer_check not in ANSWER_CHECKS:
        raise ValueError(f"answer_check must be one of {ANSWER_CHECKS}, got {answer_check!r}")
    spath = os.fspath(path)
    p = Path(spath)
    ld = _Loader(spath, split, bool(version_2_with_negative), answer_check)

    if not p.exists():
        raise ld.fail(None, f"file not found (resolved to {p.resolve()}, cwd {os.getcwd()})")
    if p.is_dir():
        inside = sorted(x.name for x in p.iterdir() if x.is_file() and
                        x.suffix.lower() in _JSON_EXTS | _JSONL_EXTS | set(_CSV_EXTS) | _PARQUET_EXTS)
        hint = f"; data files in it: {', '.join(inside[:10])}" if inside else ""
        raise ld.fail(None, f"is a directory, expected a data file{hint}")

    suffixes = [s.lower() for s in p.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    ext = (suffixes[-2] if len(suffixes) > 1 else "") if gz else (suffixes[-1] if suffixes else "")

    if ext in _PARQUET_EXTS and not gz:
        fmt = "parquet"
    else:
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ld.fail(None, f"cannot read file: {e}") from None
        if gz:
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError) as e:
                raise ld.fail(None, f"not a valid gzip file: {e}") from None
        if ext in _CSV_EXTS:
            fmt = "csv"
        elif ext in _JSON_EXTS or ext in _JSONL_EXTS:
            fmt = "json"
        else:
            fmt = _sniff(data)
            if fmt == "unknown":
                raise ld.fail(None, f"cannot tell the format from the extension {ext or '(none)'!r} or the "
                                    "content; use .json (SQuAD or flat records), .jsonl, .csv, .tsv or .parquet")
        if fmt != "parquet":
            text = _decode(ld, data)

    if fmt == "parquet":
        if gz:
            raise ld.fail(None, "gzip-compressed Parquet is not supported; Parquet compresses internally")
        _read_parquet(ld, p)
    elif fmt == "csv":
        _read_csv(ld, text, _CSV_EXTS[ext])
    else:
        fmt = _read_json_file(ld, text, jsonl_ext=ext in _JSONL_EXTS)

    if ld.n_seen == 0:
        raise ld.fail(None, f"contains no records (format {fmt})")
    if not ld.records:
        raise ld.fail(None, f"all {ld.n_seen} records were skipped ({ld.skipped}); nothing left to use")
    report = LoadReport(
        path=spath,
        fmt=fmt,
        n_records=len(ld.records),
        n_impossible=sum(1 for r in ld.records if not r["answers"]["text"]),
        skipped=dict(ld.skipped),
        fixed=ld.fixed,
    )
    return ld.records, report
