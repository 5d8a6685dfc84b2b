"""Write result files so that a crash never leaves a truncated one behind.

Every JSON result, prediction and summary goes through `write_json_atomic`: the
data is written to a temporary file in the same directory, flushed to disk, and
renamed over the target in one step (os.replace is atomic on POSIX). A writer
killed mid-write (SIGKILL, node failure) cannot remove its temp file; the temp
name carries host and pid, and the next write of the same file removes temp files
left by dead processes of this host.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import tempfile
from typing import Any


class OutputError(OSError):
    """A result file could not be written (names the path and the reason)."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno N]" prefix
        return self.strerror or super().__str__()


def _temp_prefix(path: str, host: str, pid: int) -> str:
    return f".{os.path.basename(path)}.{host}-{pid}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(path: str | os.PathLike) -> list[str]:
    """Remove temp files of `path` left by writers on this host that no longer run; return them."""
    path = os.fspath(path)
    host = socket.gethostname()
    directory = os.path.dirname(os.path.abspath(path))
    mine = f".{os.path.basename(path)}.{host}-"
    removed = []
    for tmp in glob.glob(os.path.join(glob.escape(directory), glob.escape(mine) + "*.tmp")):
        pid_part = os.path.basename(tmp)[len(mine):].split(".", 1)[0]
        if pid_part.isdigit() and not _pid_alive(int(pid_part)):
            try:
                os.unlink(tmp)
                removed.append(tmp)
            except FileNotFoundError:
                pass
    return removed


def _current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temp file + rename; raise OutputError with a clear reason."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        remove_stale_temps(path)
        prefix = _temp_prefix(path, socket.gethostname(), os.getpid())
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
        os.fchmod(fd, 0o666 & ~_current_umask())  # mkstemp makes 0600: give what open() would (group can read)
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


def json_text(obj: Any, indent: int | None = 2, sort_keys: bool = False) -> str:
    """The text every JSON file here holds: UTF-8 as is, NaN allowed, one trailing newline."""
    return json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False, allow_nan=True) + "\n"


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 4, sort_keys: bool = False) -> None:
    """Serialize first (so a non-serializable value fails before any file is touched), then write atomically."""
    write_text_atomic(path, json_text(obj, indent=indent, sort_keys=sort_keys))
