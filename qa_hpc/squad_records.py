"""What one question record must hold, checked as qa_hpc.squad_io hands each record over.

Training and evaluation need an id, a question, a context and answers at their ``answer_start``
(or fixed/skipped as ``answer_check`` says); the scorer (``scoring=True``) needs only what the
official scripts read, a unique string id and the answer texts, so a file they score is never refused.
"""

from __future__ import annotations

import numbers
import reprlib
import shlex
from collections.abc import Callable
from typing import Any

from qa_hpc.errors import UsageError


class DataError(UsageError):
    """Bad input: ``path: location (id 'x'): field 'f': what is wrong``."""


# text, answer_start (None when scoring), and the fields they were read from
Answer = tuple[str, Any, str, str]
# (message, field) -> the error, placed at the record
FieldError = Callable[[str, str], DataError]


class LoadedFile:
    """One file's records (or, ``scoring``, id -> gold texts), each checked as a reader hands it over, and
    what was loaded: the reader sets ``fmt`` and ``digest``, ``answer_check`` counts ``fixed`` answers and
    ``skipped`` records (reason -> count)."""

    def __init__(
        self,
        path: str,
        split: str,
        v2: bool = False,
        answer_check: str = "error",
        scoring: bool = False,
    ) -> None:
        self.path = path
        self.split = split
        self.v2 = v2
        self.answer_check = answer_check
        self.scoring = scoring
        # "squad-nested" | "json" | "jsonl"; "dataset": path names a dataset datasets.load_dataset read (a hub
        # name or a folder), whose rows are checked
        self.fmt = ""
        self.digest = ""  # of the bytes that were read and checked: what the features cache is keyed by
        self.seen: dict[str, str] = {}  # id -> location of its first occurrence
        self.records: list[dict] = []
        self.references: dict[str, list[str]] = {}
        self.skipped: dict[str, int] = {}
        self.fixed = 0
        # test records given without 'answers' (allowed): how many, and where the first one is
        self.without_answers = 0
        self.first_without_answers = ""

    @property
    def n_records(self) -> int:
        return len(self.records)

    @property
    def dataset(self) -> bool:
        return self.fmt == "dataset"

    @property
    def n_impossible(self) -> int:
        """Records with no answer (SQuAD v2 style), not counting test records given without answers."""
        return sum(1 for rec in self.records if not rec["answers"]["text"]) - self.without_answers

    def summary(self) -> str:
        """The greppable ``DATA_LOADED key=value ...`` line of job logs: no record went missing unseen."""
        parts = [
            "DATA_LOADED",
            f"{'dataset' if self.dataset else 'file'}={shlex.quote(self.path)}",
            f"format={self.fmt}",
            f"records={self.n_records}",
            f"impossible={self.n_impossible}",
            f"skipped={sum(self.skipped.values())}",
            f"fixed={self.fixed}",
        ]
        if self.without_answers:  # a test file without answers: predicted, not scored
            parts.append(f"unlabelled={self.without_answers}")
        return " ".join(parts + [f"skipped_{reason}={n}" for reason, n in sorted(self.skipped.items())])

    @property
    def scorable(self) -> bool:
        """Every record has its gold answers (a test file may have none)."""
        return self.without_answers == 0

    def check_scorable(self) -> None:
        """A test file is scored when every record has answers, and only predicted when none has: some
        without would be scored as wrong answers."""
        if 0 < self.without_answers < len(self.records):
            raise self.fail(
                None,
                f"{self.without_answers} of {len(self.records)} records have no 'answers' (the first: "
                f"{self.first_without_answers}); a test file is scored when every record has answers and "
                "only predicted when none has: give them to all records or to none",
            )

    def fail(self, loc: str | None, msg: str, *, rid: Any = None, fld: str | None = None) -> DataError:
        source = f"dataset {self.path} split {self.split}" if self.dataset else self.path
        record = " ".join(p for p in (loc, isinstance(rid, str) and rid and f"(id {rid!r})") if p)
        return DataError(": ".join(p for p in (source, record, fld and f"field '{fld}'", msg) if p))

    def add(self, loc: str, rec: Any, inherited: tuple[str, ...] = ()) -> None:
        """Check one flat record and keep it (or its gold texts, when scoring). `inherited`: its fields that
        a nested file gives it from its paragraph and article, which a message listing the record's own keys
        leaves out (the file's question object has none of them)."""
        if not isinstance(rec, dict):
            raise self.fail(
                loc, f"expected a record object with id, question, context, answers; found {kind_of(rec)}"
            )
        if "answers" in rec and rec["answers"] is None:
            # null answers are no answers, in every format: a dataset's row has null for a column it lacks
            rec = {key: value for key, value in rec.items() if key != "answers"}
        if "paragraphs" in rec and "qas" not in rec and "question" not in rec:
            raise self.fail(
                loc,
                "this looks like a nested SQuAD article (it has 'paragraphs') inside a file of flat "
                'records; use the official layout {"version": ..., "data": [articles]} or flatten it',
                fld="paragraphs",
            )
        own = {key: value for key, value in rec.items() if key not in inherited}
        rid = string_field(
            own, "id", lambda msg, f: self.fail(loc, msg, fld=f), "ids must be strings; quote them"
        )
        if rid in self.seen:
            raise self.fail(
                loc,
                f"duplicate id {rid!r}: first seen at {self.seen[rid]}, again at {loc}",
                rid=rid,
                fld="id",
            )
        self.seen[rid] = loc

        def err(msg: str, fld: str) -> DataError:
            return self.fail(loc, msg, rid=rid, fld=fld)

        impossible = rec.get("is_impossible")
        if impossible is not None and not isinstance(impossible, bool):
            raise err(f"must be true or false, got {impossible!r}", "is_impossible")
        answered = bool(impossible) or "answers" in rec
        # the scorer reads its dataset as split "validation": it needs the gold answers too
        if not answered and self.split != "test":
            if self.scoring:
                why = "scoring needs the gold answers"
            else:
                why = "answers may be left out only for split='test'"
            raise err(f"missing (record has keys {keys_of(own)}); {why}", "answers")
        if not answered:  # a test record: scored only if every one has answers (`check_scorable`)
            self.without_answers += 1
            self.first_without_answers = self.first_without_answers or f"{loc} (id {rid!r})"
        golds = _answers(rec.get("answers"), err, self.scoring)
        if self.scoring:  # the texts given, whatever is_impossible says: as the official scripts score
            self.references[rid] = [text for text, *_ in golds]
            return
        if impossible and golds:
            raise err(
                f"is_impossible is true but {len(golds)} answer(s) are given; an unanswerable question has "
                "answers [] (SQuAD 2.0 keeps its spans in plausible_answers)",
                "answers",
            )
        title = rec.get("title")
        if title is not None and not isinstance(title, str):
            raise err(f"must be a string, got {type(title).__name__}", "title")
        question = string_field(own, "question", err)
        context = string_field(rec, "context", err)
        # a lone surrogate ("\ud800" escaped alone) is valid JSON but no Unicode text: Arrow cannot store it
        texts = [("id", rid), ("title", title or ""), ("question", question), ("context", context)]
        for name, text in texts + [(text_field, text) for text, _, text_field, _ in golds]:
            _check_encodable(text, name, err)
        if not golds and answered and not self.v2:
            why = "is_impossible is true" if impossible else "no answers given"
            raise err(
                f"record has no answer ({why}) but version_2_with_negative is off; pass "
                "--version_2_with_negative for SQuAD v2-style data with unanswerable questions",
                "is_impossible" if impossible else "answers",
            )
        answers = self._placed(context, golds, err)
        if answers is None:
            self.skipped["answer_not_at_start"] = self.skipped.get("answer_not_at_start", 0) + 1
            return
        self.records.append(
            {"id": rid, "title": title or "", "context": context, "question": question, "answers": answers}
        )

    def _placed(self, context: str, golds: list[Answer], err: FieldError) -> dict[str, list] | None:
        """The answers as HF columns, each text at its answer_start, fixed if asked; None: skip the record."""
        answers: dict[str, list] = {"text": [], "answer_start": []}
        for text, start, text_field, start_field in golds:
            # an offset past either end of the context is one more answer not at its answer_start: stopped,
            # moved or dropped as --answer_check says, like any other
            in_range = 0 <= start < len(context)
            found = context[start : start + len(text)] if in_range else None
            if found != text:
                if self.answer_check == "skip":
                    return None
                occurrences = (i for i in range(len(context)) if context.startswith(text, i))
                # the nearest occurrence, the earlier one on ties
                new = min(occurrences, key=lambda i: (abs(i - start), i), default=None)
                if self.answer_check == "error" or new is None:
                    if new is None:
                        where = "; the text does not occur anywhere in the context"
                    else:
                        where = (
                            f"; the text does occur at {new} (answer_check='fix' corrects such offsets, "
                            "'skip' drops such records)"
                        )
                    if not in_range:
                        raise err(
                            f"{start} is out of range for a context of {len(context)} characters{where}",
                            start_field,
                        )
                    raise err(
                        f"answer text {reprlib.repr(text)} not found at answer_start {start} "
                        f"(context has {reprlib.repr(found)} there){where}",
                        text_field,
                    )
                start = new
                self.fixed += 1
            answers["text"].append(text)
            answers["answer_start"].append(start)
        return answers


def string_field(rec: dict, name: str, err: FieldError, hint: str = "") -> str:
    """id / question / context: a string with something in it."""
    val = rec.get(name)
    if val is None:
        raise err(f"missing (record has keys {keys_of(rec)})", name)
    if not isinstance(val, str):
        hint_text = f" ({hint})" if hint else ""
        raise err(f"must be a string, got {type(val).__name__} {reprlib.repr(val)}{hint_text}", name)
    if not val.strip():
        raise err("is empty or whitespace only", name)
    return val


def _check_encodable(text: str, name: str, err: FieldError) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise err(
            f"holds a lone surrogate {text[e.start]!r} at character {e.start}, which is no Unicode text "
            "(a \\ud800-\\udfff escape without its pair in the JSON?)",
            name,
        ) from None


def _answers(answers: Any, err: FieldError, scoring: bool) -> list[Answer]:
    """Every answer of one record: HF columns or SQuAD objects.

    Scoring reads only the texts, as the official scripts do: ``answer_start`` may be absent
    and an empty text is kept (v2 scoring ignores golds that normalize to nothing).
    """
    keys = ("text",) if scoring else ("text", "answer_start")
    if answers is None:
        return []
    if isinstance(answers, dict):  # HF columns {"text": [...], "answer_start": [...]}
        missing = [key for key in keys if key not in answers]
        if missing:
            raise err(f"missing (answers has keys {keys_of(answers)})", f"answers.{missing[0]}")
        texts = answers["text"]
        starts = answers.get("answer_start")
        if isinstance(texts, str) and (_is_int(starts) or scoring):  # one answer written as scalars
            texts = [texts]
            starts = [starts]
        for key, val in zip(keys, (texts, starts)):
            if not isinstance(val, (list, tuple)):
                raise err(f"must be a list, got {type(val).__name__}", f"answers.{key}")
        if not scoring and len(texts) != len(starts):
            raise err(f"has {len(texts)} texts but {len(starts)} answer_start values", "answers.answer_start")
        pairs = zip(texts, [None] * len(texts) if scoring else starts)
    elif isinstance(answers, (list, tuple)):  # SQuAD objects [{"text": ..., "answer_start": ...}]
        for i, a in enumerate(answers):
            if not isinstance(a, dict):
                raise err(
                    f"must be an object with text and answer_start, got {type(a).__name__}", f"answers[{i}]"
                )
            missing = [key for key in keys if key not in a]
            if missing:
                raise err(f"missing (answer has keys {keys_of(a)})", f"answers[{i}].{missing[0]}")
        pairs = ((a["text"], a.get("answer_start")) for a in answers)
    else:
        raise err(
            f"must be a list of {{text, answer_start}} objects or "
            f'{{"text": [...], "answer_start": [...]}}, got {type(answers).__name__}',
            "answers",
        )
    return [
        _answer(text, start, (f"answers[{i}].text", f"answers[{i}].answer_start"), err, scoring)
        for i, (text, start) in enumerate(pairs)
    ]


def _answer(text: Any, start: Any, fields: tuple[str, str], err: FieldError, scoring: bool) -> Answer:
    if not isinstance(text, str):
        raise err(f"must be a string, got {type(text).__name__}", fields[0])
    if not scoring and not text.strip():
        raise err("answer text is empty", fields[0])
    if not scoring and not _is_int(start):
        raise err(f"must be an integer character offset, got {type(start).__name__} {start!r}", fields[1])
    return text, None if scoring else int(start), *fields


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)  # JSON true is no offset 1


def keys_of(d: Any) -> str:
    ks = list(d) if isinstance(d, dict) else []
    return "[" + ", ".join(repr(str(k)) for k in ks[:12]) + (", ..." if len(ks) > 12 else "") + "]"


def kind_of(v: Any) -> str:
    """What a value is, in words: "an object with keys [...]", "a list of 3 items", "null"."""
    if isinstance(v, dict):
        return f"an object with keys {keys_of(v)}"
    if isinstance(v, list):
        return f"a list of {len(v)} items"
    return "null" if v is None else f"a {type(v).__name__} ({reprlib.repr(v)})"
