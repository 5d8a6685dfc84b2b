"""Disk full, unwritable --output_dir and out-of-memory end with a clear message and their own exit code.

The full disk is real: run_qa.py runs under a file-size limit (RLIMIT_FSIZE; Python
ignores SIGXFSZ, so writes past it fail with EFBIG exactly as ENOSPC would), so the
Trainer's checkpoint save fails inside safetensors / torch.save. The out-of-memory is
real too: run_qa.py runs under an address-space limit (RLIMIT_AS, `ulimit -v`) just above
what the same run needs with a small batch, and is given a batch far larger than that margin.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures.runqa import REPO, RUN_QA, files_under, qa_env, run_qa, tiny_flags
from qa_hpc.errors import (
    EXIT_IOERR, EXIT_OOM, BatchContext, OutOfMemory, OutputError, check_writable_dir, guarded, write_failure,
)

CTX = BatchContext(train_batch_size=32, eval_batch_size=64, gradient_accumulation_steps=1, max_seq_length=384,
                   device="cuda:0")


def _file_size_limit(nbytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply


@pytest.mark.e2e
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


@pytest.mark.e2e
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


def _address_space_limit(nbytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))

    return apply


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="VmPeak is read from /proc (Linux)")
def test_out_of_memory_under_an_address_space_limit_exits_3_naming_the_batch(tiny_bert: Path,
                                                                            tmp_path: Path) -> None:
    """A batch that cannot fit: exit 3, one ERROR line with the batch size and what to lower, no traceback.

    80 generated questions make 160 features at --max_seq_length 512 (padded to it); a batch of 160 holds
    them all. With eager attention each layer keeps 160 x 2 heads x 512 x 512 fp32 scores for backward:
    160*2*512*512*4 B = 320 MiB per tensor, and scores, probabilities and dropout output per layer, two
    layers: about 1.9 GiB, nearly 4x the margin. A batch of 2 needs 1/80 of that (24 MiB), well inside it.
    """
    from qa_hpc.tools.make_demo_data import generate_squad

    train = tmp_path / "train.json"
    train.write_text(json.dumps(generate_squad(80, seed=1)))
    # fewer glibc arenas: less address space reserved per thread, less noise; the checkout on the path, as
    # `python run_qa.py` has it (the wrapper runs the script by path)
    env = qa_env(MALLOC_ARENA_MAX="2", PYTHONPATH=str(REPO))

    def run(batch: int, out: str, limit: int | None = None):
        args = [RUN_QA, "--model_name_or_path", str(tiny_bert), "--train_file", str(train), "--do_train",
                "--output_dir", str(tmp_path / out), "--max_seq_length", "512", "--doc_stride", "128",
                "--pad_to_max_length", "--attn_implementation", "eager", "--max_steps", "1",
                "--per_device_train_batch_size", str(batch), "--report_to", "none", "--save_strategy", "no",
                "--features_cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "true"]
        return subprocess.run([sys.executable, "-c", VMPEAK_WRAPPER, *args], capture_output=True, text=True,
                              timeout=300, env=env, cwd=str(tmp_path),
                              preexec_fn=_address_space_limit(limit) if limit else None)

    small = run(2, "small")
    assert small.returncode == 0, small.stdout[-2000:] + small.stderr[-3000:]
    assert "TOKENS split=train features=160 " in small.stdout + small.stderr
    peak = int(re.search(r"^VMPEAK_KB=(\d+)$", small.stderr, re.M).group(1)) * 1024
    big = run(160, "big", peak + MARGIN)
    errors = [ln for ln in big.stderr.splitlines() if ln.startswith("ERROR: ")]
    assert big.returncode == EXIT_OOM, f"exit {big.returncode}, small-batch peak {peak >> 20} MiB:\n" + big.stderr[-3000:]
    assert len(errors) == 1, big.stderr[-3000:]
    assert errors[0].startswith(
        "ERROR: out of memory on cpu during train with --per_device_train_batch_size 160 "
        "--gradient_accumulation_steps 1 --max_seq_length 512; try --per_device_train_batch_size 80 "
        "--gradient_accumulation_steps 2 (same effective batch of 160 per device)"), errors[0]
    assert "Traceback" not in big.stderr
    summary = json.loads((tmp_path / "big" / "run_summary.json").read_text())
    assert (summary["status"], summary["exit_code"]) == ("failed", EXIT_OOM)


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
