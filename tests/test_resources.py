"""Disk full, unwritable --output_dir and out-of-memory end with a clear message and their own exit code.

The full disk is real: run_qa.py runs under a file-size limit (RLIMIT_FSIZE; Python
ignores SIGXFSZ, so writes past it fail with EFBIG exactly as ENOSPC would), so the
Trainer's checkpoint save fails inside safetensors / torch.save.
"""

from __future__ import annotations

import json

import errno
import os
import resource
from pathlib import Path

import pytest
import torch

from qa_hpc.reliability.atomic_io import OutputError
from fixtures.runqa import files_under, run_qa, tiny_flags
from qa_hpc.reliability.exit_codes import EXIT_IOERR, EXIT_OOM
from qa_hpc.reliability.errors import (
    BatchContext,
    OutOfMemory,
    check_writable_dir,
    guarded,
    write_failure,
)

CTX = BatchContext(train_batch_size=32, eval_batch_size=64, gradient_accumulation_steps=1, max_seq_length=384,
                   device="cuda:0")


def _file_size_limit(nbytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply


def test_disk_full_while_saving_a_checkpoint(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [*tiny_flags(tiny_bert, out), "--do_train", "--do_eval", "--train_file", str(demo_files["train"]),
            "--validation_file", str(demo_files["validation"]), "--max_train_samples", "4",
            "--max_eval_samples", "4", "--max_steps", "2", "--per_device_train_batch_size", "4"]
    # the tiny model's weights are ~8 MB: the checkpoint cannot be written under a 4 MiB limit
    proc = run_qa(args, preexec_fn=_file_size_limit(4 << 20))
    assert proc.returncode == EXIT_IOERR, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR: ")]
    assert errors and errors[0].startswith(f"ERROR: cannot write {out}/checkpoint-2: File too large"), proc.stderr
    assert "Traceback" not in proc.stderr
    # training had finished its steps; nothing claims success and no JSON is truncated: the run's record
    # says it failed, with the exit code and the reason
    assert not any(f.endswith("results.json") for f in files_under(out))
    summary = json.loads((out / "run_summary.json").read_text())
    assert (summary["status"], summary["exit_code"]) == ("failed", EXIT_IOERR)
    assert "File too large" in summary["error"] and "checkpoint-2" in summary["error"]


def test_unwritable_output_dir_fails_before_the_model_loads(
    tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = [*tiny_flags(tiny_bert, blocker / "out"), "--do_eval", "--validation_file", str(demo_files["validation"]),
            "--max_eval_samples", "2"]
    proc = run_qa(args)
    assert proc.returncode == EXIT_IOERR, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ERROR: cannot create --output_dir {blocker / 'out'}: Not a directory" in proc.stderr
    assert "Loading weights" not in proc.stdout + proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_read_only_output_dir(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="cannot write into --output_dir .*Permission denied"):
            check_writable_dir(str(ro))
    finally:
        ro.chmod(0o700)


def test_write_failure_names_the_reason_from_rust_and_torch_errors(tmp_path: Path) -> None:
    """safetensors reports 'os error 28'; torch.save only 'file write failed' (then a probe finds why)."""
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    err = write_failure(rust, str(tmp_path / "checkpoint-7"))
    assert isinstance(err, OutputError) and err.errno == errno.ENOSPC
    assert str(err).startswith(f"cannot write {tmp_path}/checkpoint-7: No space left on device")
    assert "MiB free" in str(err) and "--save_total_limit" in str(err)
    # an error with no errno on a writable disk is not a write failure: left to the traceback
    assert write_failure(RuntimeError("shape mismatch"), str(tmp_path / "checkpoint-7")) is None


def _allocate_too_much() -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")


def test_out_of_memory_in_training_names_batch_size_and_hint() -> None:
    with pytest.raises(OutOfMemory) as info:
        with guarded("train", "out", CTX):
            _allocate_too_much()
    msg = str(info.value)
    assert "out of memory on cuda:0 during train" in msg
    assert "--per_device_train_batch_size 32" in msg
    assert "--per_device_train_batch_size 16 --gradient_accumulation_steps 2" in msg  # same effective batch
    assert "Tried to allocate 2.00 GiB" in msg
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)


def test_out_of_memory_in_evaluation_points_at_the_eval_batch() -> None:
    with pytest.raises(OutOfMemory, match="during eval with --per_device_eval_batch_size 64.*try "
                                          "--per_device_eval_batch_size 32"):
        with guarded("eval", "out", CTX):
            _allocate_too_much()


def test_cli_turns_out_of_memory_into_exit_3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import run_qa

    def main() -> int:
        with guarded("train", "out", CTX):
            _allocate_too_much()
        return 0

    monkeypatch.setattr(run_qa, "main", main)
    assert run_qa.cli() == EXIT_OOM
    err = capsys.readouterr().err
    assert err.startswith("ERROR: out of memory on cuda:0 during train") and "Traceback" not in err
