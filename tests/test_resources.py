"""Disk full, unwritable --output_dir and out-of-memory end with a clear message and their own exit code.

The full disk is real: run_qa.py runs under a file-size limit (RLIMIT_FSIZE; Python
ignores SIGXFSZ, so writes past it fail with EFBIG exactly as ENOSPC would), so the
Trainer's checkpoint save fails inside safetensors / torch.save. The out-of-memory is
real too: run_qa.py runs under an address-space limit (RLIMIT_AS, `ulimit -v`) just above
what the same run needs with a small batch, and is given a batch far larger than that margin.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from qa_hpc.reliability.atomic_io import OutputError
from fixtures.runqa import run_qa
from qa_hpc.reliability.exit_codes import EXIT_OOM
from qa_hpc.reliability.errors import (
    BatchContext,
    OutOfMemory,
    check_writable_dir,
    guarded,
    write_failure,
)

CTX = BatchContext(train_batch_size=32, eval_batch_size=64, gradient_accumulation_steps=1, max_seq_length=384,
                   device="cuda:0")


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


# run_qa.py as `python run_qa.py ARGS`, printing the process's peak address space (VmPeak) on exit
VMPEAK_WRAPPER = """import atexit, runpy, sys
def peak():
    for line in open('/proc/self/status'):
        if line.startswith('VmPeak:'):
            print('VMPEAK_KB=' + line.split()[1], file=sys.stderr, flush=True)
atexit.register(peak)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""
MARGIN = 512 << 20  # address space allowed beyond the small-batch run's peak


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
