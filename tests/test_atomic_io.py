"""Results are written through a temp file and a rename: a failed or killed write never truncates one.

The killed writer is real: a child process with a file-size limit (RLIMIT_FSIZE)
is killed by the kernel (SIGXFSZ) in the middle of writing its temp file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from qa_hpc.reliability.atomic_io import OutputError, remove_stale_temps, write_json_atomic

BIG = {"answers": {f"q{i}": "x" * 200 for i in range(20000)}}  # ~4.5 MB of JSON


def _temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_non_serializable_value_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "eval_results.json"
    write_json_atomic(target, {"eval_f1": 88.1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"eval_f1": object()})
    assert json.loads(target.read_text()) == {"eval_f1": 88.1}
    assert _temps(tmp_path) == []


def test_write_failing_mid_way_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    """EFBIG half-way through the temp file (file-size limit, SIGXFSZ ignored): OutputError, old file intact."""
    target = tmp_path / "all_results.json"
    write_json_atomic(target, {"eval_f1": 88.1})
    code = f"""
import resource, signal, sys
from qa_hpc.reliability.atomic_io import OutputError, write_json_atomic
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    write_json_atomic({str(target)!r}, {{"answers": {{f"q{{i}}": "x" * 200 for i in range(20000)}}}})
except OutputError as err:
    print("OutputError:", err)
    sys.exit(74)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 74, proc.stdout + proc.stderr
    assert f"cannot write {target}: File too large" in proc.stdout
    assert json.loads(target.read_text()) == {"eval_f1": 88.1}
    assert _temps(tmp_path) == []


def test_killed_writer_leaves_the_old_file_and_the_next_write_removes_its_temp(tmp_path: Path) -> None:
    target = tmp_path / "eval_predictions.json"
    write_json_atomic(target, {"q1": "old answer"})
    code = f"""
import resource, signal, sys
from qa_hpc.reliability.atomic_io import write_json_atomic
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default; the kernel now kills at the limit
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
write_json_atomic({str(target)!r}, {{"answers": {{f"q{{i}}": "x" * 200 for i in range(20000)}}}})
"""
    proc = subprocess.run([sys.executable, "-c", code], timeout=120, cwd=REPO)
    assert proc.returncode == -signal.SIGXFSZ  # killed by the kernel mid-write
    assert json.loads(target.read_text()) == {"q1": "old answer"}  # never truncated
    left = _temps(tmp_path)
    assert len(left) == 1 and left[0].startswith(".eval_predictions.json.")
    assert (tmp_path / left[0]).stat().st_size == 1 << 20  # the partial temp file, not the target

    write_json_atomic(target, BIG)  # the next write (e.g. the resumed run) cleans up after the dead writer
    assert json.loads(target.read_text()) == BIG
    assert _temps(tmp_path) == []


def test_temps_of_live_writers_are_kept(tmp_path: Path) -> None:
    import socket

    target = tmp_path / "x.json"
    live = tmp_path / f".x.json.{socket.gethostname()}-{os.getpid()}.abc.tmp"
    live.write_text("partial")
    assert remove_stale_temps(target) == []
    assert live.exists()


def test_unwritable_directory_is_an_output_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    with pytest.raises(OutputError, match="cannot write .*not_a_dir/r.json"):
        write_json_atomic(blocker / "r.json", {"a": 1})


def test_final_trainer_state_is_written_atomically() -> None:
    """run_qa writes the final trainer_state.json itself (HF's save_state writes in place)."""
    import inspect

    import run_qa
    from qa_hpc import summary

    source = inspect.getsource(run_qa.train)
    assert "save_trainer_state(trainer)" in source and "trainer.save_state()" not in source
    assert "write_text_atomic" in inspect.getsource(summary.save_trainer_state)


def test_written_files_get_the_permissions_open_would_give(tmp_path: Path) -> None:
    """Group members of a project share results: an atomic write must not leave the temp file's 0600."""
    old = os.umask(0o027)
    try:
        write_json_atomic(tmp_path / "eval_results.json", {"eval_f1": 1.0})
    finally:
        os.umask(old)
    assert (tmp_path / "eval_results.json").stat().st_mode & 0o777 == 0o640
