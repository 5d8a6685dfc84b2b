"""SIGTERM / SIGUSR1 during training: checkpoint, exit 75, and the same command resumes exactly.

A real run_qa.py process is signalled once its log shows training steps; the rerun
must finish with the same global step, the same per-step losses and the same final
weights as an uninterrupted run (optimizer, scheduler, RNG and data order restored).
The same under torchrun (2 ranks, only one of them signalled) is in test_ddp_ranks.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from fixtures.procs import free_port
from fixtures.runqa import PYTHON, REPO, LoggedProcess, files_under, qa_env, run_qa, tiny_flags
from qa_hpc.errors import EXIT_PREEMPTED
from qa_hpc.preemption import StopRequest, last_complete_checkpoint

LOSS_LINE = r"\{'loss'"


def _train_flags(demo_files: dict[str, Path]) -> list[str]:
    return [
        "--do_train", "--do_eval", "--train_file", str(demo_files["train"]),
        "--validation_file", str(demo_files["validation"]), "--max_train_samples", "8",
        "--max_eval_samples", "6", "--per_device_train_batch_size", "8", "--num_train_epochs", "2",
        "--logging_steps", "1", "--seed", "3", "--save_steps", "1000",
    ]


def _state(out: Path) -> dict:
    return json.loads((out / "trainer_state.json").read_text())


def _losses(state: dict) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


@pytest.fixture(scope="module")
def uninterrupted(tiny_bert: Path, demo_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("preempt") / "uninterrupted"
    proc = run_qa([*tiny_flags(tiny_bert, out), *_train_flags(demo_files)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_sigterm_checkpoints_exits_75_and_resumes_exactly(
    tiny_bert: Path, demo_files: dict[str, Path], uninterrupted: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cmd = [PYTHON, str(REPO / "run_qa.py"), *tiny_flags(tiny_bert, out), *_train_flags(demo_files)]
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
    total = _state(uninterrupted)["global_step"]
    assert 2 <= step < total
    checkpoint = out / f"checkpoint-{step}"
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "model.safetensors"} <= set(
        os.listdir(checkpoint))
    # nothing but the checkpoint and the run's record, which says it was preempted: no results
    assert all(f.startswith(f"checkpoint-{step}/") or f == "run_summary.json" for f in files_under(out)), \
        files_under(out)
    record = json.loads((out / "run_summary.json").read_text())
    assert (record["status"], record["exit_code"]) == ("preempted", EXIT_PREEMPTED)
    assert record["stopped"] == {"signal": "SIGTERM", "global_step": step, "checkpoint": str(checkpoint)}

    again = run_qa(cmd[2:])  # the same command
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"RESUME_FROM={checkpoint}" in again.stdout + again.stderr
    # each trained step logs its loss (--logging_steps 1): the rerun trains the remaining steps only
    # (a rerun from scratch would also end with the uninterrupted run's losses and weights)
    assert log.count("{'loss'") == step, log[-3000:]
    assert again.stdout.count("{'loss'") == total - step, again.stdout[-3000:]

    resumed, reference = _state(out), _state(uninterrupted)
    assert resumed["global_step"] == reference["global_step"] == total
    # log_history continues: every step logged once, in order, with the uninterrupted run's losses
    assert sorted(_losses(resumed)) == list(range(1, total + 1))
    for s, loss in _losses(reference).items():
        assert _losses(resumed)[s] == pytest.approx(loss, rel=1e-6, abs=1e-7), f"loss differs at step {s}"
    a, b = load_file(out / "model.safetensors"), load_file(uninterrupted / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    eval_a = json.loads((out / "eval_results.json").read_text())
    eval_b = json.loads((uninterrupted / "eval_results.json").read_text())
    for key in ("eval_exact_match", "eval_f1", "eval_examples", "eval_samples"):
        assert eval_a[key] == pytest.approx(eval_b[key])


def test_stop_request_handler_only_sets_a_flag() -> None:
    request = StopRequest()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        request.install()
        assert not request.requested
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered before the next bytecode
        assert request.requested and request.name == "SIGUSR1"
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_resume_skips_an_incompletely_written_checkpoint(tmp_path: Path) -> None:
    """A job killed while saving leaves a checkpoint without a readable trainer_state.json."""
    for step, state in ((4, '{"global_step": 4}'), (6, '{"global_step": 6}'), (8, '{"global_st')):
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(b"x")
        (ckpt / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-9").mkdir()  # killed before anything was written
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-6")


@pytest.mark.parametrize("vote_every, stop_at, want_step", [(1, 4, 4), (3, 4, 6), (10, 4, 10)])
def test_ranks_vote_only_every_n_steps_and_stop_together(tmp_path: Path, vote_every: int, stop_at: int,
                                                          want_step: int) -> None:
    """On GPUs a vote syncs host and device, so the plan votes every 10 steps there: all ranks still stop together."""
    script = REPO / "tests" / "fixtures" / "vote_ranks.py"
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(script), str(vote_every), str(stop_at), "20"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=qa_env(PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stopped = sorted(re.findall(r"STOPPED rank=(\d) step=(\d+) votes=(\d+)", proc.stdout))
    assert stopped == [(str(r), str(want_step), str(want_step // vote_every)) for r in (0, 1)], proc.stdout
