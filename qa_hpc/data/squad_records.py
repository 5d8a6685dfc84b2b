"""What one question record must hold, checked as the format readers hand records over.

Two strictness levels share the readers:

* :class:`RecordLoader`, for training and evaluation: id, question, context and answers
  whose text is at its ``answer_start`` (or fixed/skipped as the user asked); every
  record becomes the flat HF record.
* :class:`ReferenceLoader`, for the scorer: only what the official evaluation scripts
  read -- a unique string id and the answers' texts -- so a file they accept is never
  refused, while a malformed id or answer is still named by file, record and field.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from qa_hpc.data.squad_answers import Answer, parse_answers
from qa_hpc.data.squad_errors import (
    MISSING,
    DataError,
    data_error,
    keys_of,
    kind_of,
    short,
)


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


class Loader:
    """Per-file state the readers share: where errors point, which ids were seen, how many records."""

    what = "file"  # how messages name the file ("dataset file" for the scorer)
    required_columns: tuple[str, ...] = ("id", "question", "context")  # of a CSV or Parquet file
    pair_columns: tuple[str, ...] = ("answer_text", "answer_start")  # answers as one text + offset per row

    def __init__(self, path: str, split: str) -> None:
        self.path = path
        self.split = split
        self.seen: dict[str, str] = {}  # id -> location of its first occurrence
        self.n_seen = 0  # records handed over, kept or not

    def fail(self, loc: str | None, msg: str, *, rid: Any = None, fld: str | None = None) -> DataError:
        return data_error(self.path, loc, msg, rid=rid, fld=fld)

    def check_id(self, loc: str, raw: dict) -> str:
        """The record's id: present, a non-empty string, not seen before in this file."""
        rid = raw.get("id", MISSING)
        if rid is MISSING or rid is None:
            raise self.fail(loc, f"missing (record has keys {keys_of(raw)})", fld="id")
        if not isinstance(rid, str):
            raise self.fail(loc, f"must be a string, got {type(rid).__name__} {rid!r} "
                                 "(ids must be strings; quote them)", fld="id")
        if not rid.strip():
            raise self.fail(loc, "is empty", fld="id")
        if rid in self.seen:
            raise self.fail(loc, f"duplicate id {rid!r}: first seen at {self.seen[rid]}, again at {loc}",
                            rid=rid, fld="id")
        self.seen[rid] = loc
        return rid

    def check_paragraph(self, loc: str, para: dict) -> None:
        """Paragraph-level fields of a nested file (none by default)."""

    def add(self, loc: str, raw: dict, *, title: Any = "", answers_present: bool, answers: Any = None,
            impossible: bool = False, answers_field: str = "answers", json_strings: bool = False,
            csv_pair: bool = False) -> None:
        """Check one record and keep what this loader collects.

        ``csv_pair``: answers came from CSV answer_text/answer_start columns, so
        errors name those columns rather than a JSON path.
        """
        raise NotImplementedError

    def add_flat(self, loc: str, rec: Any, *, json_strings: bool = False) -> None:
        """One flat record (JSON, JSON Lines, CSV and Parquet share this)."""
        if not isinstance(rec, dict):
            raise self.fail(loc, "expected a record object with id, question, context, answers; "
                                 f"found {kind_of(rec)}")
        if "paragraphs" in rec and "qas" not in rec and "question" not in rec:
            raise self.fail(loc, "this looks like a nested SQuAD article (it has 'paragraphs') inside a "
                                 "file of flat records; use the official layout "
                                 '{"version": ..., "data": [articles]} or flatten it', fld="paragraphs")
        present = "answers" in rec and not (rec["answers"] is None and self.split == "test")
        self.add(loc, rec, title=rec.get("title", ""), answers_present=present,
                 answers=rec.get("answers"), json_strings=json_strings)


class ReferenceLoader(Loader):
    """id -> gold answer texts, for scoring; unanswerable questions map to ``[]``."""

    what = "dataset file"
    required_columns = ("id",)
    pair_columns = ("answer_text",)

    def __init__(self, path: str) -> None:
        super().__init__(path, split="validation")  # gold answers must be there
        self.references: dict[str, list[str]] = {}

    def add(self, loc: str, raw: dict, *, title: Any = "", answers_present: bool, answers: Any = None,
            impossible: bool = False, answers_field: str = "answers", json_strings: bool = False,
            csv_pair: bool = False) -> None:
        self.n_seen += 1
        rid = self.check_id(loc, raw)
        if not answers_present:
            raise self.fail(loc, f"missing (record has keys {keys_of(raw)}); scoring needs the gold answers",
                            rid=rid, fld=answers_field)
        golds = [] if impossible else parse_answers(
            answers, fld=answers_field, err=lambda msg, fld: self.fail(loc, msg, rid=rid, fld=fld),
            json_strings=json_strings, csv_pair=csv_pair, need_start=False)
        self.references[rid] = [a.text for a in golds]


class RecordLoader(Loader):
    """Flat HF records, every field checked; answers not at their offset handled per ``answer_check``."""

    def __init__(self, path: str, split: str, v2: bool, answer_check: str) -> None:
        super().__init__(path, split)
        self.v2 = v2
        self.answer_check = answer_check
        self.records: list[dict] = []
        self.skipped: dict[str, int] = {}
        self.fixed = 0

    def check_paragraph(self, loc: str, para: dict) -> None:
        if "context" not in para or para["context"] is None:
            raise self.fail(loc, f"missing (paragraph has keys {keys_of(para)})", fld="context")

    def add(self, loc: str, raw: dict, *, title: Any = "", answers_present: bool, answers: Any = None,
            impossible: bool = False, answers_field: str = "answers", json_strings: bool = False,
            csv_pair: bool = False) -> None:
        self.n_seen += 1
        rid = self.check_id(loc, raw)
        if title is None:
            title = ""
        if not isinstance(title, str):
            raise self.fail(loc, f"must be a string, got {type(title).__name__}", rid=rid, fld="title")
        question, context = (self._text(loc, rid, raw, name) for name in ("question", "context"))
        golds = self._golds(loc, rid, raw, answers_present, answers, impossible, answers_field, json_strings,
                            csv_pair)
        placed = self._placed(loc, rid, context, golds)
        if placed is None:
            self.skipped["answer_not_at_start"] = self.skipped.get("answer_not_at_start", 0) + 1
            return
        self.records.append({
            "id": rid,
            "title": title,
            "context": context,
            "question": question,
            "answers": {"text": [a.text for a in placed], "answer_start": [a.start for a in placed]},
        })

    def _text(self, loc: str, rid: str, raw: dict, name: str) -> str:
        """question / context: a string with something in it."""
        if name not in raw or raw[name] is None:
            raise self.fail(loc, f"missing (record has keys {keys_of(raw)})", rid=rid, fld=name)
        val = raw[name]
        if not isinstance(val, str):
            raise self.fail(loc, f"must be a string, got {type(val).__name__}", rid=rid, fld=name)
        if not val.strip():
            raise self.fail(loc, "is empty or whitespace only", rid=rid, fld=name)
        return val

    def _golds(self, loc: str, rid: str, raw: dict, present: bool, answers: Any, impossible: bool, fld: str,
               json_strings: bool, csv_pair: bool) -> list[Answer]:
        """The record's answers; none only for a test split or SQuAD v2 data."""
        if not present:
            if self.split != "test":
                raise self.fail(loc, f"missing (record has keys {keys_of(raw)}); answers may be left out "
                                     "only for split='test'", rid=rid, fld=fld)
            return []
        golds = [] if impossible else parse_answers(
            answers, fld=fld, err=lambda msg, f: self.fail(loc, msg, rid=rid, fld=f),
            json_strings=json_strings, csv_pair=csv_pair)
        if not golds and self.split != "test" and not self.v2:
            why = "is_impossible is true" if impossible else "no answers given"
            raise self.fail(loc, f"record has no answer ({why}) but version_2_with_negative is off; "
                                 "pass --version_2_with_negative for SQuAD v2-style data with "
                                 "unanswerable questions", rid=rid, fld="is_impossible" if impossible else fld)
        return golds

    def _placed(self, loc: str, rid: str, context: str, golds: list[Answer]) -> list[Answer] | None:
        """Answers whose text is at their answer_start, fixed if asked; None: skip the record."""
        out, n_fixed = [], 0
        for a in golds:
            start = a.start
            if start < 0 or start >= len(context):
                raise self.fail(loc, f"{start} is out of range for a context of {len(context)} characters",
                                rid=rid, fld=a.start_field)
            found = context[start:start + len(a.text)]
            if found != a.text:
                if self.answer_check == "skip":
                    return None
                new = _nearest(context, a.text, start)
                if self.answer_check == "error" or new is None:
                    raise self.fail(loc, f"answer text {short(a.text)} not found at answer_start {start} "
                                         f"(context has {short(found)} there){_where_else(new)}",
                                    rid=rid, fld=a.text_field)
                start, n_fixed = new, n_fixed + 1
            out.append(Answer(a.text, start, a.text_field, a.start_field))
        self.fixed += n_fixed
        return out


def _where_else(new: int | None) -> str:
    if new is None:
        return "; the text does not occur anywhere in the context"
    return f"; the text does occur at {new} (answer_check='fix' corrects such offsets, 'skip' drops such records)"


def _nearest(context: str, text: str, start: int) -> int | None:
    """Offset of the occurrence of ``text`` closest to ``start`` (earlier wins ties)."""
    best = None
    pos = context.find(text)
    while pos != -1:
        if best is None or abs(pos - start) < abs(best - start):
            best = pos
        pos = context.find(text, pos + 1)
    return best
