"""Clear messages for the ways a cluster job goes wrong, and the exit code of each (from exit_codes.env,
the one table the job scripts source too: the code is what they and the scheduler act on). Out of memory
names the batch size and what to lower; a failed write names the file and the reason, found even when a
library hides the errno.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

_EXIT_CODES_ENV = Path(__file__).with_name("exit_codes.env").read_text(encoding="utf-8")
# its lines read `NAME=code  # meaning`
_CODES = {name: int(code) for name, code in re.findall(r"^(\w+)=(\d+)", _EXIT_CODES_ENV, re.MULTILINE)}
EXIT_OK = _CODES["EXIT_OK"]
EXIT_FAILED = _CODES["EXIT_FAILED"]
EXIT_USAGE = _CODES["EXIT_USAGE"]
EXIT_OOM = _CODES["EXIT_OOM"]
EXIT_IOERR = _CODES["EXIT_IOERR"]
EXIT_PREEMPTED = _CODES["EXIT_PREEMPTED"]

# errno values that mean "this file could not be written", not "this input is bad"
WRITE_ERRNOS = {
    errno.ENOSPC,
    errno.EFBIG,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EIO,
    errno.ENOTDIR,
}
_FULL = "; free space, raise the quota, lower --save_total_limit, or choose another --output_dir"
_HINTS = {
    errno.ENOSPC: _FULL,
    errno.EDQUOT: _FULL,
    errno.EFBIG: "; a file size limit applies (ulimit -f, or the filesystem's largest file)",
}


class UsageError(ValueError):
    """A problem the user fixes by changing flags, files or the machine asked for: exit 2, no traceback."""


class OutputError(OSError):
    """A result file could not be written (names the path and the reason): exit 74."""

    # the message alone, without OSError's "[Errno N]" prefix
    def __str__(self) -> str:
        return self.strerror or super().__str__()


class OutOfMemory(RuntimeError):
    """Training or evaluation ran out of (GPU or host) memory; the message says what to lower: exit 3."""


class BatchContext(NamedTuple):
    """The flags an out-of-memory message quotes back to the user."""

    train_batch_size: int
    eval_batch_size: int
    gradient_accumulation_steps: int
    max_seq_length: int
    device: str
    precision: str  # the run's: lower precision is suggested only when it is fp32


def exception_chain(err: BaseException | None) -> Iterator[BaseException]:
    """err, then what caused it (raise ... from, or raised while handling), each once."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def is_out_of_memory(err: BaseException) -> bool:
    """torch's OutOfMemoryError (any accelerator), MemoryError, and torch's CPU allocator failing, which
    raises a plain RuntimeError."""
    import torch

    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(err, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(err)
    )


def probe_write(directory: str, megabytes: int = 8) -> int | None:
    """The errno of writing megabytes into an unnamed temp file in directory, None if it works: torch.save
    reports a full disk as a bare RuntimeError, and this finds the real reason (8 MiB is far less than a
    checkpoint)."""
    try:
        with tempfile.TemporaryFile(dir=directory) as fh:
            fh.write(bytes(megabytes << 20))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        return err.errno
    return None


def _cannot_write(code: int, what: str, directory: str) -> OutputError:
    try:
        free = f" ({shutil.disk_usage(directory).free / 2**20:.0f} MiB free on that filesystem)"
    except OSError:
        free = ""
    return OutputError(code, f"cannot write {what}: {os.strerror(code)}{free}{_HINTS.get(code, '')}")


def _errno_of(err: BaseException) -> int | None:
    """An OSError's errno, or the N of "os error N", as Rust libraries (safetensors, tokenizers) report it."""
    match = re.search(r"os error (\d+)", str(err))
    return getattr(err, "errno", None) or (int(match.group(1)) if match else None)


def write_failure(err: BaseException, target: str) -> OutputError | None:
    """An OutputError naming target and the reason when err is a failed write, else None."""
    path = Path(os.path.abspath(target))
    # where the write would have gone
    directory = str(next(d for d in (path, *path.parents) if d.is_dir()))
    code = next((c for c in map(_errno_of, exception_chain(err)) if c is not None), None)
    # no errno anywhere (torch.save): a probe write finds out whether the disk is the cause
    if code is None:
        code = probe_write(directory)
    return _cannot_write(code, target, directory) if code in WRITE_ERRNOS else None


def out_of_memory(err: BaseException, phase: str, ctx: BatchContext) -> OutOfMemory:
    """What ran out, during which phase, with which batch size, and which flags to change."""
    lower = ", or --precision bf16 (fp16 on GPUs before Ampere)" if ctx.precision == "fp32" else ""
    if phase == "train":
        bs = ctx.train_batch_size
        acc = ctx.gradient_accumulation_steps
        half = max(1, bs // 2)
        flags = f"--per_device_train_batch_size {bs} --gradient_accumulation_steps {acc}"
        hint = (
            f"try --per_device_train_batch_size {half} --gradient_accumulation_steps {acc * bs // half} "
            f"(same effective batch of {bs * acc} per device), --gradient_checkpointing, or a smaller "
            f"--max_seq_length{lower}"
        )
    else:
        bs = ctx.eval_batch_size
        flags = f"--per_device_eval_batch_size {bs}"
        hint = (
            f"try --per_device_eval_batch_size {max(1, bs // 2)} (evaluation batches do not change the "
            f"results){lower}"
        )
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return OutOfMemory(
        f"out of memory on {ctx.device} during {phase} with {flags} --max_seq_length "
        f"{ctx.max_seq_length}; {hint}. ({type(err).__name__}: {first})"
    )


@contextmanager
def guarded(phase: str, target: str | Callable[[], str], ctx: BatchContext) -> Iterator[None]:
    """Turn out-of-memory and failed writes inside a phase into errors with clear messages. target: what the
    phase writes (a callable when only known at failure time, e.g. checkpoint-N)."""
    try:
        yield
    except OutputError:
        raise
    except Exception as err:  # noqa: BLE001 - classified below, re-raised unchanged when unknown
        if is_out_of_memory(err):
            raise out_of_memory(err, phase, ctx) from err
        if (failure := write_failure(err, target() if callable(target) else target)) is None:
            raise
        raise failure from err


def classify(err: BaseException) -> tuple[int, str | None]:
    """(exit code, the one ERROR line to print) for an error that ended a run; None: unexpected, show the
    traceback."""
    for kind, code in ((UsageError, EXIT_USAGE), (OutputError, EXIT_IOERR), (OutOfMemory, EXIT_OOM)):
        if isinstance(err, kind):
            return code, str(err)
    # outside a guarded phase (e.g. loading the model)
    if is_out_of_memory(err):
        return EXIT_OOM, (
            f"out of memory ({type(err).__name__}: {err}); lower --per_device_train_batch_size or "
            "--per_device_eval_batch_size"
        )
    return EXIT_FAILED, None


def check_writable_dir(path: str, flag: str = "--output_dir", megabytes: int = 1) -> None:
    """Create path (given as ``flag``) if needed and write a small file into it (`megabytes`; 0: an empty
    one, for a folder that only holds small files), or raise OutputError saying why not (before training: a
    wrong --output_dir fails in seconds, not after an hour of training)."""
    if os.path.exists(path) and not os.path.isdir(path):  # makedirs would say only "File exists"
        raise OutputError(errno.ENOTDIR, f"cannot create {flag} {path}: it is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise OutputError(err.errno, f"cannot create {flag} {path}: {err.strerror or err}") from err
    if (code := probe_write(path, megabytes)) is not None:
        raise _cannot_write(code, f"into {flag} {path}", path)
