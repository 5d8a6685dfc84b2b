"""The one SQuAD reader: the official nested JSON (v1.1/v2.0), flat JSON or JSON Lines -> flat records.

Each file becomes flat records handed one by one to a LoadedFile (qa_hpc.squad_records), which raises
DataError naming file, record and field before any record is returned. Files are parsed here, not by
``load_dataset``: its JSON errors name no line or column, and a missing field reads as null. The file is
read once: the bytes checked are the bytes digested. A hub dataset's rows (``load_dataset``'s) are handed
over the same way, by ``check_dataset_rows``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qa_hpc.squad_records import DataError, LoadedFile, keys_of, kind_of, string_field

# what callers import
__all__ = ["ANSWER_CHECKS", "DataError", "check_dataset_rows", "load_qa_records", "load_references"]

SPLITS = ("train", "validation", "test")
ANSWER_CHECKS = ("error", "fix", "skip")
JSON_EXTENSIONS = (".json", ".jsonl", ".ndjson")
_FORMATS_READ = (
    'the official nested SQuAD JSON (v1.1, v2.0), flat JSON (a list of records or {"data": [records]}) '
    "and JSON Lines (.jsonl, .ndjson)"
)
_SHAPES = (
    'expected the official SQuAD layout {"version": ..., "data": [{"title", "paragraphs": '
    '[{"context", "qas": [...]}]}]}, an array of flat records [{"id", "question", "context", '
    '"answers"}], {"data": [flat records]}, or JSON Lines (one record per line)'
)
_RECORD_KEYS = frozenset({"id", "question", "context", "answers"})
# what only a question (or a paragraph) holds: an article may carry an "id" of its own (CMRC2018, DRCD)
_QUESTION_KEYS = frozenset({"question", "context", "answers", "qas"})


def load_qa_records(
    path: str | os.PathLike,
    *,
    split: str = "train",
    version_2_with_negative: bool = False,
    answer_check: str = "error",
) -> tuple[list[dict], LoadedFile]:
    """Every record of a QA file, flat, and what was loaded, or DataError. ``split="test"`` may lack answers;
    ``answer_check``: an answer not at its ``answer_start`` raises ("error"), moves to the nearest one ("fix")
    or is skipped."""
    _check_arguments(split, answer_check)
    c = LoadedFile(os.fspath(path), split, bool(version_2_with_negative), answer_check)
    _read(c)
    _check_loaded(c)
    return c.records, c


def check_dataset_rows(
    rows: Iterable[Any],
    columns: list[str],
    name: str,
    *,
    split: str = "train",
    version_2_with_negative: bool = False,
    answer_check: str = "error",
) -> LoadedFile:
    """The rows of a dataset's split read by ``datasets.load_dataset`` (a hub name or a folder), checked
    as a file's records are; ``row i`` is ``dataset[i]``."""
    _check_arguments(split, answer_check)
    c = LoadedFile(name, split, bool(version_2_with_negative), answer_check)
    c.fmt = "dataset"
    missing = [col for col in ("id", "question", "context") if col not in columns]
    if missing:
        # a folder of official nested files is read by load_dataset as one row per file
        nested = (
            " (the official nested SQuAD layout, one row per file: give such files as --train_file, "
            "--validation_file or --test_file)"
        )
        raise c.fail(
            None,
            f"has columns {columns}, not question records: no {', '.join(map(repr, missing))}"
            f"{nested if 'data' in columns else ''}",
        )
    for i, row in enumerate(rows):
        c.add(f"row {i}", row)
    _check_loaded(c)
    return c


def _check_arguments(split: str, answer_check: str) -> None:
    if split not in SPLITS or answer_check not in ANSWER_CHECKS:
        raise ValueError(
            f"split must be one of {SPLITS} (got {split!r}), answer_check one of {ANSWER_CHECKS} "
            f"(got {answer_check!r})"
        )


def _check_loaded(c: LoadedFile) -> None:
    """Something is left to use, and a test split is scored or predicted as a whole."""
    if not c.seen:
        raise c.fail(None, f"contains no records (format {c.fmt})")
    if not c.records:
        raise c.fail(None, f"all {len(c.seen)} records were skipped ({c.skipped}); nothing left to use")
    c.check_scorable()


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
        found = sorted(x.name for x in p.iterdir() if x.is_file() and x.suffix.lower() in JSON_EXTENSIONS)
        inside = f"; data files in it: {', '.join(found[:10])}" if found else ""
        raise c.fail(None, f"is a directory, expected a data file{inside}")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise c.fail(None, f"cannot read file: {e}") from None
    ext = p.suffix.lower()
    if (kind := _signature(raw)) is not None:  # under any name: a .json that is gzip, UTF-16, ...
        raise c.fail(None, kind)
    if not raw.strip():  # not "truncated", as a JSON parser would say
        raise c.fail(None, "is empty (0 bytes)" if not raw else "holds only whitespace")
    # JSON by its extension, or by its content under any other name (a SQuAD file saved as .txt); CSV,
    # Parquet, gzip and the rest get one error naming the formats read, not a JSON parse error
    if ext not in JSON_EXTENSIONS and raw.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] not in (b"{", b"["):
        raise c.fail(
            None,
            f"not a format this reader reads (extension {ext or '(none)'!r}, content not JSON); the formats "
            f"read are {_FORMATS_READ}: convert the file to one of them",
        )
    c.digest = hashlib.sha256(raw).hexdigest()
    c.fmt = _json(c, _decode(c, raw), jsonl_ext=ext in (".jsonl", ".ndjson"))


# first bytes that say what a file is, where that is nothing this reader reads: (bytes, what, what to do)
_SIGNATURES = (
    (b"\x1f\x8b", "gzip-compressed", "decompress it (gunzip)"),
    (b"PK\x03\x04", "a zip archive", "unpack it (unzip)"),
    (b"BZh", "bzip2-compressed", "decompress it (bunzip2)"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it (unxz)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it (unzstd)"),
    (b"PAR1", "Parquet", "convert it"),
    (b"\xff\xfe\x00\x00", "UTF-32 text", "re-save it as UTF-8 (iconv -f utf-32 -t utf-8)"),
    (b"\x00\x00\xfe\xff", "UTF-32 text", "re-save it as UTF-8 (iconv -f utf-32 -t utf-8)"),
    (b"\xff\xfe", "UTF-16 text", "re-save it as UTF-8 (iconv -f utf-16 -t utf-8)"),
    (b"\xfe\xff", "UTF-16 text", "re-save it as UTF-8 (iconv -f utf-16 -t utf-8)"),
)


def _signature(raw: bytes) -> str | None:
    """What a file is by its first bytes, where that is nothing this reader reads; None otherwise."""
    for start, what, fix in _SIGNATURES:
        if raw.startswith(start):
            return (
                f"is {what} (by its first bytes), which this reader does not read: {fix}; the formats read "
                f"are {_FORMATS_READ}"
            )
    return None


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
        # a .jsonl file of one record on one line is JSON Lines holding one record
        lines = jsonl_ext and isinstance(obj, dict) and "\n" not in text.strip()
    except json.JSONDecodeError as e:
        # a one-line object followed by more: JSON Lines
        one_line_object = text.lstrip()[:1] == "{" and "\n" not in text[: e.pos].strip()
        lines = jsonl_ext or (e.msg == "Extra data" and one_line_object)
        unterminated = e.msg.startswith("Unterminated string") and '"' not in text[e.pos + 1 :]
        hint = ""
        if e.pos >= len(text.rstrip()) or unterminated:
            hint = " - the file ends early; it looks truncated (incomplete copy or download?)"
        if not lines:
            raise c.fail(
                None, f"not valid JSON: {_what(e)} at line {e.lineno}, column {e.colno}{hint}"
            ) from None
    if not lines:
        return _json_value(c, obj)
    # records end at "\n" only: str.splitlines would also end one at U+2028, U+2029 or U+0085, which JSON
    # allows unescaped inside a string (json.dumps(ensure_ascii=False) writes them so)
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            c.add(f"line {n}", json.loads(line))
        except json.JSONDecodeError as e:
            trunc = " (the line ends early; truncated?)" if e.pos >= len(line.rstrip()) else ""
            raise c.fail(f"line {n}", f"not valid JSON: {_what(e)} at column {e.colno}{trunc}") from None
    return "jsonl"


def _what(e: json.JSONDecodeError) -> str:
    """json's message without its own trailing "at" ("Unterminated string starting at"): the caller says
    where."""
    return e.msg.removesuffix(" at")


def _json_value(c: LoadedFile, obj: Any) -> str:
    if isinstance(obj, dict) and "data" not in obj:
        what = f"an object with keys {keys_of(obj)}"
        if {"question", "context"} <= set(obj):
            what = "a single record"
        raise c.fail(None, f"wrong top-level shape: found {what}, without a 'data' field; {_SHAPES}")
    if isinstance(obj, dict) and not isinstance(obj["data"], list):
        raise c.fail(None, f"wrong shape: found {kind_of(obj['data'])}; {_SHAPES}", fld="data")
    if not isinstance(obj, (dict, list)):
        raise c.fail(None, f"wrong top-level shape: found {kind_of(obj)}; {_SHAPES}")
    items = obj["data"] if isinstance(obj, dict) else obj
    prefix = "data" if isinstance(obj, dict) else ""
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
    title = art.get("title")
    # an article's title and a paragraph's context are named where they are, not at their first question
    if not c.scoring and title is not None and not isinstance(title, str):
        raise c.fail(aloc, f"must be a string, got {type(title).__name__}", fld="title")
    paragraphs = art.get("paragraphs")
    if paragraphs is None:
        raise c.fail(aloc, f"missing (article has keys {keys_of(art)})", fld="paragraphs")
    if not isinstance(paragraphs, list):
        raise c.fail(aloc, f"must be a list, found {kind_of(paragraphs)}", fld="paragraphs")
    for j, para in enumerate(paragraphs):
        ploc = f"{aloc}.paragraphs[{j}]"
        if not isinstance(para, dict):
            raise c.fail(ploc, f"expected a paragraph object with context and qas; found {kind_of(para)}")
        missing = [key for key in (("qas",) if c.scoring else ("context", "qas")) if para.get(key) is None]
        if missing:
            raise c.fail(ploc, f"missing (paragraph has keys {keys_of(para)})", fld=missing[0])
        if not c.scoring:  # a string with something in it
            string_field(para, "context", lambda msg, f: c.fail(ploc, msg, fld=f))
        if not isinstance(para["qas"], list):
            raise c.fail(ploc, f"must be a list, found {kind_of(para['qas'])}", fld="qas")
        for k, qa in enumerate(para["qas"]):
            qloc = f"{ploc}.qas[{k}]"
            if not isinstance(qa, dict):
                raise c.fail(qloc, f"expected a question object; found {kind_of(qa)}")
            c.add(qloc, dict(qa, context=para.get("context"), title=title), inherited=("context", "title"))


def _looks_nested(items: list) -> bool:
    """More items look like articles than flat records: one broken item does not decide the layout. An item
    with "paragraphs" and none of a question's keys is an article, even with an "id" of its own."""
    articles = records = 0
    for item in items:
        if isinstance(item, dict) and "paragraphs" in item and not _QUESTION_KEYS & item.keys():
            articles += 1
        elif isinstance(item, dict) and _RECORD_KEYS & item.keys():
            records += 1
        elif isinstance(item, dict) and ("title" in item or any(key.startswith("paragraph") for key in item)):
            articles += 1
    return articles > records
