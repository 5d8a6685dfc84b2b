"""Load extractive question-answering records from local files, strictly: the one SQuAD reader.

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

Training reads through :func:`load_qa_records`; the scorer (score_squad.py) reads the
same files through :func:`load_references`, which asks only for what scoring needs.
The pieces: squad_errors (the error), squad_answers and squad_records (what a record
must hold), squad_json and squad_tables (the formats); this module opens the file.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from qa_hpc.data.squad_errors import DataError
from qa_hpc.data.squad_json import read_json_file
from qa_hpc.data.squad_records import Loader, LoadReport, RecordLoader, ReferenceLoader
from qa_hpc.data.squad_tables import read_csv, read_parquet

__all__ = ["DataError", "LoadReport", "load_qa_records", "load_references", "SPLITS", "ANSWER_CHECKS"]

SPLITS = ("train", "validation", "test")
ANSWER_CHECKS = ("error", "fix", "skip")

_JSON_EXTS = {".json"}
_JSONL_EXTS = {".jsonl", ".ndjson"}
_CSV_EXTS = {".csv": ",", ".tsv": "\t"}
_PARQUET_EXTS = {".parquet", ".pq"}
_PARQUET_MAGIC = b"PAR1"


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
    ld = RecordLoader(spath, split, bool(version_2_with_negative), answer_check)
    fmt = _read(ld, Path(spath))
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


def load_references(path: str | os.PathLike) -> dict[str, list[str]]:
    """Question id -> gold answer texts of a QA file (any format above), in file order, or raise DataError.

    Only what the official evaluation scripts read is required: a unique string id and
    the answers' texts (``answer_start``, context and question are not looked at, so a
    file those scripts accept is accepted). Unanswerable questions (``is_impossible``
    true, or no answers) map to ``[]``; duplicate texts are kept (they do not change a max).
    """
    spath = os.fspath(path)
    ld = ReferenceLoader(spath)
    fmt = _read(ld, Path(spath))
    if not ld.references:
        raise ld.fail(None, f"contains no questions (format {fmt})")
    return ld.references


def _read(ld: Loader, p: Path) -> str:
    """Hand every record of the file at ``p`` to ``ld``; return the format it was read as."""
    _check_is_file(ld, p)
    suffixes = [s.lower() for s in p.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    ext = (suffixes[-2] if len(suffixes) > 1 else "") if gz else (suffixes[-1] if suffixes else "")
    data = b"" if ext in _PARQUET_EXTS else _bytes(ld, p, gz)  # pyarrow reads Parquet itself
    fmt = _format(ld, ext, data)
    if fmt == "parquet":
        if gz:
            raise ld.fail(None, "gzip-compressed Parquet is not supported; Parquet compresses internally")
        read_parquet(ld, p)
        return fmt
    if fmt == "csv":
        read_csv(ld, _decode(ld, data), _CSV_EXTS[ext])
        return fmt
    return read_json_file(ld, _decode(ld, data), jsonl_ext=ext in _JSONL_EXTS)


def _format(ld: Loader, ext: str, data: bytes) -> str:
    """"parquet", "csv" or "json" (JSON or JSON Lines) by extension, else by content."""
    if ext in _PARQUET_EXTS:
        return "parquet"
    if ext in _CSV_EXTS:
        return "csv"
    if ext in _JSON_EXTS or ext in _JSONL_EXTS:
        return "json"
    if data[:4] == _PARQUET_MAGIC:
        return "parquet"
    if data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
        return "json"
    raise ld.fail(None, f"cannot tell the format from the extension {ext or '(none)'!r} or the "
                        "content; use .json (SQuAD or flat records), .jsonl, .csv, .tsv or .parquet")


def _check_is_file(ld: Loader, p: Path) -> None:
    if not p.exists():
        raise ld.fail(None, f"{ld.what} not found (resolved to {p.resolve()}, cwd {os.getcwd()})")
    if p.is_dir():
        inside = sorted(x.name for x in p.iterdir() if x.is_file() and
                        x.suffix.lower() in _JSON_EXTS | _JSONL_EXTS | set(_CSV_EXTS) | _PARQUET_EXTS)
        hint = f"; data files in it: {', '.join(inside[:10])}" if inside else ""
        raise ld.fail(None, f"is a directory, expected a data file{hint}")


def _bytes(ld: Loader, p: Path, gz: bool) -> bytes:
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ld.fail(None, f"cannot read file: {e}") from None
    if gz:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ld.fail(None, f"not a valid gzip file: {e}") from None
    return data


def _decode(ld: Loader, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ld.fail(None, f"not valid UTF-8 at byte offset {e.start} (line {line}, byte {col} of the "
                            f"line; bytes {data[e.start:e.start + 4]!r}): {e.reason}. Re-save the file "
                            "as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    return text.removeprefix("\ufeff")
