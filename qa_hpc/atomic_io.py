"""Write result files so that a crash never leaves a truncated one behind: a temp file beside the target,
flushed and renamed over it. A writer killed mid-write cannot remove its temp file `.NAME.HOST-PID.*.tmp`;
the next write of that file removes those of dead writers. And read a JSON object back.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import socket
from typing import Any

from qa_hpc.errors import OutputError


def current_umask() -> int:
    """The process's umask, from /proc where Linux gives it; else by setting it and putting it back at once
    (a file another thread creates in between gets 0600)."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/self/status", encoding="ascii") as status:
            return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def readable_as_umask_allows(folder: str | os.PathLike) -> None:
    """The weights in `folder` (*.safetensors) given the permissions a new file gets under the umask:
    safetensors 0.8 writes them 0600 whatever the umask, so the group of a shared project folder could not
    load the trained model."""
    mask = current_umask()
    for path in glob.glob(os.path.join(glob.escape(os.fspath(folder)), "*.safetensors")):
        os.chmod(path, 0o666 & ~mask)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically, or raise OutputError with a clear reason."""
    # here, not at import: the scorer's command line imports this module
    import psutil

    path = os.fspath(path)
    tmp = None
    directory = os.path.dirname(os.path.abspath(path))
    # a temp file's name: this prefix, then PID.RANDOM.tmp
    prefix = f".{os.path.basename(path)}.{socket.gethostname()}-"
    try:
        os.makedirs(directory, exist_ok=True)
        for stale in glob.glob(os.path.join(glob.escape(directory), glob.escape(prefix) + "*.tmp")):
            pid = os.path.basename(stale)[len(prefix) :].split(".", 1)[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                # another process may have cleaned it up first
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stale)
        tmp = os.path.join(directory, f"{prefix}{os.getpid()}.{secrets.token_hex(4)}.tmp")
        # a new file, with the permissions the umask gives
        with open(tmp, "x", encoding="utf-8") as fh:
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


def write_json_atomic(path: str | os.PathLike, obj: Any, sort_keys: bool = False) -> None:
    """Serialize first (a non-serializable value fails before any file is touched), then write atomically."""
    write_text_atomic(path, json_text(obj, indent=4, sort_keys=sort_keys))


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object in `path`, as written; OSError when it cannot be read (FileNotFoundError: missing),
    ValueError when it is cut off mid-write or not an object (json reads the NaN that records may hold)."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    return data
