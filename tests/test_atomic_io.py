"""Results are written through a temp file and a rename: a failed or killed write never truncates one.

The killed writer is real: a child process with a file-size limit (RLIMIT_FSIZE) is killed by the
kernel (SIGXFSZ) in the middle of writing its temp file, through write_json_atomic and through the
functions run_qa.py saves trainer_state.json and the results files with; a real run is checked to
replace those files rather than write into them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.runqa import REPO, run_qa, tiny_flags
from qa_hpc.atomic_io import OutputError, remove_stale_temps, write_json_atomic

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


@pytest.mark.e2e
def test_write_failing_mid_way_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    """EFBIG half-way through the temp file (file-size limit, SIGXFSZ ignored): OutputError, old file intact."""
    target = tmp_path / "all_results.json"
    write_json_atomic(target, {"eval_f1": 88.1})
    code = f"""
import resource, signal, sys
from qa_hpc.atomic_io import OutputError, write_json_atomic
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


@pytest.mark.e2e
def test_killed_writer_leaves_the_old_file_and_the_next_write_removes_its_temp(tmp_path: Path) -> None:
    target = tmp_path / "eval_predictions.json"
    write_json_atomic(target, {"q1": "old answer"})
    code = f"""
import resource, signal, sys
from qa_hpc.atomic_io import write_json_atomic
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


# A writer that dies mid-write, through the functions run_qa.py writes its state and results with. The
# stand-in trainer has what they read: state, args.output_dir, is_world_process_zero, log_metrics.
KILLED_WRITER = """
import json, resource, signal, sys, types
from transformers import TrainerState
from qa_hpc.record import save_results, save_trainer_state
out, what, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
state = TrainerState(global_step=7, log_history=[{"loss": 1.0, "step": i, "note": "x" * 200} for i in range(8000)])
trainer = types.SimpleNamespace(state=state, args=types.SimpleNamespace(output_dir=out),
                                is_world_process_zero=lambda: True, log_metrics=lambda split, metrics: None)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # the kernel kills the writer at the limit, mid-write
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
if what == "state":
    save_trainer_state(trainer)
else:
    save_results(trainer, "eval", {f"eval_m{i}": 0.5 for i in range(int(what))})
"""


def _kill_writer(out: Path, what: str, limit: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(out), what, str(limit)], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == -signal.SIGXFSZ, proc.stderr[-3000:]  # killed by the kernel mid-write
    return proc


@pytest.mark.e2e
def test_trainer_state_of_a_writer_killed_mid_write_is_the_old_one(tmp_path: Path) -> None:
    """qa_hpc.record.save_trainer_state killed while writing a 2 MB state: the old file stays whole."""
    old = {"global_step": 3, "log_history": [{"loss": 2.0, "step": 3}]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(old))
    _kill_writer(tmp_path, "state", 1 << 20)
    assert json.loads((tmp_path / "trainer_state.json").read_text()) == old
    left = _temps(tmp_path)
    assert len(left) == 1 and left[0].startswith(".trainer_state.json.")
    assert (tmp_path / left[0]).stat().st_size == 1 << 20  # the kill came mid-write, in the temp file


@pytest.mark.e2e
def test_results_of_a_writer_killed_mid_write_are_old_or_new_never_cut(tmp_path: Path) -> None:
    """save_results writes {split}_results.json, then all_results.json (old metrics + new): killed in the
    second write, the first is complete and new, the second complete and old."""
    train = {f"train_m{i}": 0.25 for i in range(20000)}  # ~0.5 MB of JSON, from an earlier split
    (tmp_path / "all_results.json").write_text(json.dumps(train))
    (tmp_path / "eval_results.json").write_text(json.dumps({"eval_f1": 1.0}))
    _kill_writer(tmp_path, "15000", 700_000)  # eval alone: ~0.4 MB fits; all_results: ~0.9 MB does not
    assert json.loads((tmp_path / "eval_results.json").read_text()) == {f"eval_m{i}": 0.5 for i in range(15000)}
    assert json.loads((tmp_path / "all_results.json").read_text()) == train
    left = _temps(tmp_path)
    assert len(left) == 1 and left[0].startswith(".all_results.json.")


@pytest.mark.e2e
def test_a_run_replaces_its_state_and_results_files_and_never_writes_into_them(
    tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
) -> None:
    """run_qa.py writes trainer_state.json and the results files as new files renamed over the old ones.

    A hard link keeps each old file's inode: a write into the file (a crash mid-way truncates it) would
    change what the link shows; a temp file renamed over it leaves the link's content as it was.
    """
    out, keep = tmp_path / "out", tmp_path / "old_inodes"
    out.mkdir()
    keep.mkdir()
    names = ("trainer_state.json", "train_results.json", "eval_results.json", "all_results.json")
    for name in names:
        (out / name).write_text(json.dumps({"old": name}))
        os.link(out / name, keep / name)
    args = [*tiny_flags(tiny_bert, out), "--overwrite_output_dir", "--do_train", "--do_eval",
            "--train_file", str(demo_files["train"]), "--validation_file", str(demo_files["validation"]),
            "--max_train_samples", "8", "--max_eval_samples", "4", "--max_steps", "2",
            "--per_device_train_batch_size", "4", "--save_strategy", "no"]
    proc = run_qa(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in names:
        assert json.loads((keep / name).read_text()) == {"old": name}, f"{name} was written in place"
        assert (out / name).stat().st_ino != (keep / name).stat().st_ino, name
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    assert "eval_f1" in json.loads((out / "eval_results.json").read_text())
    assert {"train_runtime", "eval_f1"} <= set(json.loads((out / "all_results.json").read_text()))
    assert _temps(out) == []


def test_written_files_get_the_permissions_open_would_give(tmp_path: Path) -> None:
    """Group members of a project share results: an atomic write must not leave the temp file's 0600."""
    old = os.umask(0o027)
    try:
        write_json_atomic(tmp_path / "eval_results.json", {"eval_f1": 1.0})
    finally:
        os.umask(old)
    assert (tmp_path / "eval_results.json").stat().st_mode & 0o777 == 0o640
