"""Reliability of real processes: a stop signal checkpoints, exits 75 and the same command resumes exactly;
a writer killed mid-write never leaves a cut file; a full disk and out-of-memory end with their own exit code.

The killed writer is real: a child process with a file-size limit (RLIMIT_FSIZE) is killed by the kernel
(SIGXFSZ) in the middle of writing its temp file, through write_json_atomic and through the functions run_qa.py
saves trainer_state.json and the results files with. The full disk is real: run_qa.py runs under a file-size
limit (Python ignores SIGXFSZ, so writes past it fail with EFBIG exactly as ENOSPC would), so the Trainer's
checkpoint save fails inside safetensors / torch.save. The out-of-memory is real too: run_qa.py runs under an
address-space limit (RLIMIT_AS, `ulimit -v`) just above what the same run needs with a small batch.
(The same stop under torchrun, 2 ranks and one signalled: tests/e2e/test_ddp.py.)
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from fixtures.outputs import losses, temp_files
from fixtures.runqa import PYTHON, REPO, RUN_QA, LoggedProcess, files_under, qa_env, run_qa, tiny_flags
from fixtures.runs import Run, plain_training_flags, read
from qa_hpc.atomic_io import write_json_atomic
from qa_hpc.errors import EXIT_IOERR, EXIT_OOM, EXIT_PREEMPTED

LOSS_LINE = r"\{'loss'"


def test_sigterm_checkpoints_exits_75_and_resumes_exactly(
    plain: Run, tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
) -> None:
    """The plain run's training, signalled once it trains; the rerun must end with the plain run's global step,
    per-step losses and final weights (optimizer, scheduler, RNG and data order restored)."""
    uninterrupted = plain.ok().out
    out = tmp_path / "run"
    cmd = [PYTHON, RUN_QA, *plain_training_flags(tiny_bert, demo_files, out), "--report_to", "none"]
    run = LoggedProcess(cmd, tmp_path / "first.log")
    try:
        run.wait_for(LOSS_LINE, count=2)  # it is training
        os.kill(run.proc.pid, signal.SIGTERM)
        code = run.wait(timeout=300)
    finally:
        run.kill_all()
    log = run.text()
    assert code == EXIT_PREEMPTED, log[-3000:]
    stopped = re.search(r"PREEMPTED signal=SIGTERM global_step=(\d+) checkpoint=(\S+)", log)
    assert stopped, log[-3000:]
    step = int(stopped.group(1))
    total = read(uninterrupted / "trainer_state.json")["global_step"]
    assert 2 <= step < total
    checkpoint = out / f"checkpoint-{step}"
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "model.safetensors"} <= set(
        os.listdir(checkpoint))
    # nothing but the checkpoint and the run's record, which says it was preempted: no results
    assert all(f.startswith(f"checkpoint-{step}/") or f == "run_summary.json" for f in files_under(out)), \
        files_under(out)
    record = read(out / "run_summary.json")
    assert (record["status"], record["exit_code"]) == ("preempted", EXIT_PREEMPTED)
    assert record["stopped"] == {"signal": "SIGTERM", "global_step": step, "checkpoint": str(checkpoint)}

    again = run_qa(cmd[2:])  # the same command
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"RESUME_FROM={checkpoint}" in again.stdout + again.stderr
    # each trained step logs its loss (--logging_steps 1): the rerun trains the remaining steps only
    # (a rerun from scratch would also end with the uninterrupted run's losses and weights)
    assert log.count("{'loss'") == step, log[-3000:]
    assert again.stdout.count("{'loss'") == total - step, again.stdout[-3000:]

    resumed, reference = read(out / "trainer_state.json"), read(uninterrupted / "trainer_state.json")
    assert resumed["global_step"] == reference["global_step"] == total
    # log_history continues: every step logged once, in order, with the uninterrupted run's losses
    assert sorted(losses(resumed)) == list(range(1, total + 1))
    for s, loss in losses(reference).items():
        assert losses(resumed)[s] == pytest.approx(loss, rel=1e-6, abs=1e-7), f"loss differs at step {s}"
    a, b = load_file(out / "model.safetensors"), load_file(uninterrupted / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    eval_a, eval_b = read(out / "eval_results.json"), read(uninterrupted / "eval_results.json")
    for key in ("eval_exact_match", "eval_f1", "eval_examples", "eval_samples"):
        assert eval_a[key] == pytest.approx(eval_b[key])


# --- writers killed mid-write ---------------------------------------------------------------------------

BIG = {"answers": {f"q{i}": "x" * 200 for i in range(20000)}}  # ~4.5 MB of JSON


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
    assert temp_files(tmp_path) == []


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
    left = temp_files(tmp_path)
    assert len(left) == 1 and left[0].startswith(".eval_predictions.json.")
    assert (tmp_path / left[0]).stat().st_size == 1 << 20  # the partial temp file, not the target

    write_json_atomic(target, BIG)  # the next write (e.g. the resumed run) cleans up after the dead writer
    assert json.loads(target.read_text()) == BIG
    assert temp_files(tmp_path) == []


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


def test_trainer_state_of_a_writer_killed_mid_write_is_the_old_one(tmp_path: Path) -> None:
    """qa_hpc.record.save_trainer_state killed while writing a 2 MB state: the old file stays whole."""
    old = {"global_step": 3, "log_history": [{"loss": 2.0, "step": 3}]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(old))
    _kill_writer(tmp_path, "state", 1 << 20)
    assert json.loads((tmp_path / "trainer_state.json").read_text()) == old
    left = temp_files(tmp_path)
    assert len(left) == 1 and left[0].startswith(".trainer_state.json.")
    assert (tmp_path / left[0]).stat().st_size == 1 << 20  # the kill came mid-write, in the temp file


def test_results_of_a_writer_killed_mid_write_are_old_or_new_never_cut(tmp_path: Path) -> None:
    """save_results writes {split}_results.json, then all_results.json (old metrics + new): killed in the
    second write, the first is complete and new, the second complete and old."""
    train = {f"train_m{i}": 0.25 for i in range(20000)}  # ~0.5 MB of JSON, from an earlier split
    (tmp_path / "all_results.json").write_text(json.dumps(train))
    (tmp_path / "eval_results.json").write_text(json.dumps({"eval_f1": 1.0}))
    _kill_writer(tmp_path, "15000", 700_000)  # eval alone: ~0.4 MB fits; all_results: ~0.9 MB does not
    assert json.loads((tmp_path / "eval_results.json").read_text()) == {f"eval_m{i}": 0.5 for i in range(15000)}
    assert json.loads((tmp_path / "all_results.json").read_text()) == train
    left = temp_files(tmp_path)
    assert len(left) == 1 and left[0].startswith(".all_results.json.")


# --- resources: a full disk, too little memory -------------------------------------------------------------


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
