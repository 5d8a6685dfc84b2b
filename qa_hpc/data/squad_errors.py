"""The error every QA-data reader raises, and the small helpers its messages are built from.

A message names the file, the record (position and id) and the field, so the user can
open the file and fix it without re-running anything; the helpers keep the descriptions
of what was found short and uniform across formats.
"""

from __future__ import annotations

import numbers
from typing import Any

from qa_hpc.errors import UsageError

MISSING = object()  # a key that is absent, as opposed to present with the value None


class DataError(UsageError):
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


def data_error(path: str, loc: str | None, msg: str, *, rid: Any = None, fld: str | None = None) -> DataError:
    """``path: loc (id 'x'): field 'f': msg``, leaving out the parts that are not known."""
    where = [path]
    if loc:
        where.append(loc)
    if isinstance(rid, str) and rid:
        where.append(f"(id {rid!r})")
    head = ": ".join([where[0], " ".join(where[1:])]) if len(where) > 1 else where[0]
    body = f"field '{fld}': {msg}" if fld else msg
    return DataError(f"{head}: {body}", path=path, location=loc,
                     record_id=rid if isinstance(rid, str) else None, field=fld)


def is_int(v: Any) -> bool:
    """An integer, but not a bool (JSON true must not pass as offset 1)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def keys_of(d: Any) -> str:
    """The first keys of an object, for "missing (record has keys [...])"."""
    if not isinstance(d, dict):
        return "(not an object)"
    ks = list(d.keys())
    shown = ", ".join(repr(str(k)) for k in ks[:12])
    return "[" + shown + (", ..." if len(ks) > 12 else "") + "]"


def kind_of(v: Any) -> str:
    """What a value is, in words: "an object with keys [...]", "a list of 3 items", "null"."""
    if isinstance(v, dict):
        return f"an object with keys {keys_of(v)}"
    if isinstance(v, list):
        return f"a list of {len(v)} items"
    if v is None:
        return "null"
    return f"a {type(v).__name__} ({short(v)})"


def short(v: Any, n: int = 60) -> str:
    """repr(v), cut to n characters."""
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."
