"""Write result files so that a crash never leaves a truncated one behind.

Every JSON result, prediction and summary goes through `write_json_atomic`: the
data is written to a temporary file in the same directory, flushed to disk, and
renamed over the target in one step (os.replace is atomic on POSIX).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


class OutputError(OSError):
    """A result file could not be written (names the path and the reason)."""


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temp file + rename; raise OutputError with a clear reason."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as err:
        raise OutputError(err.errno, f"cannot write {path}: {err.strerror or err}") from err
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 4, sort_keys: bool = False) -> None:
    """Serialize first (so a non-serializable value fails before any file is touched), then write atomically."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False, allow_nan=True) + "\n"
    write_text_atomic(path, text)
