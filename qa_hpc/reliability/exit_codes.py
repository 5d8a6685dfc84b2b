"""Exit codes, from the one table (exit_codes.env) that the job scripts source too.

A batch job's exit code is what the job script and the scheduler act on, so each kind
of failure has its own code; the meaning of each is written beside it in the table.
"""

from __future__ import annotations

from pathlib import Path

TABLE = Path(__file__).with_name("exit_codes.env")


def read_table(path: Path = TABLE) -> dict[str, int]:
    """NAME -> code from lines `NAME=code  # meaning`."""
    codes = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            name, value = text.split("=", 1)
            codes[name.strip()] = int(value)
    return codes


_CODES = read_table()
EXIT_OK = _CODES["EXIT_OK"]
EXIT_FAILED = _CODES["EXIT_FAILED"]
EXIT_USAGE = _CODES["EXIT_USAGE"]
EXIT_OOM = _CODES["EXIT_OOM"]
EXIT_IOERR = _CODES["EXIT_IOERR"]
EXIT_PREEMPTED = _CODES["EXIT_PREEMPTED"]
