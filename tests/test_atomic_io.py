"""Results are written through a temp file and a rename: a failed or killed write never truncates one.

The killed writer is real: a child process with a file-size limit (RLIMIT_FSIZE) is killed by the
kernel (SIGXFSZ) in the middle of writing its temp file, through write_json_atomic and through the
functions run_qa.py saves trainer_state.json and the results files with; a real run is checked to
replace those files rather than write into them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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
from qa_hpc.summary import save_results, save_trainer_state
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


def test_written_files_get_the_permissions_open_would_give(tmp_path: Path) -> None:
    """Group members of a project share results: an atomic write must not leave the temp file's 0600."""
    old = os.umask(0o027)
    try:
        write_json_atomic(tmp_path / "eval_results.json", {"eval_f1": 1.0})
    finally:
        os.umask(old)
    assert (tmp_path / "eval_results.json").stat().st_mode & 0o777 == 0o640
