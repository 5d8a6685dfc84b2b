"""Real multi-process DDP on CPU (gloo): what every rank holds and sees, not rank 0 alone. The shared 2-rank
run (tests/fixtures/shared_runs.py) trains through tests/fixtures/run_qa_probe.py, which saves each rank's
parameters after the last step, so split data, synchronized gradients, the best checkpoint loaded everywhere
and an exact resume after a stop are read back from files; killed, frozen and voting ranks run under torchrun
of their own (the frozen one beside the module's other tests: it mostly waits).
"""

from __future__ import annotations

import math
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from fixtures.ahead import started_ahead
from fixtures.procs import (
    REPO,
    RUN_QA,
    LoggedProcess,
    free_port,
    offline_env,
    ok,
    rank_pids,
    run,
    run_qa,
    side_by_side,
    tiny_flags,
    torchrun,
)
from fixtures.runs import (
    DDP_BATCH,
    DDP_EVAL_STEPS,
    PROBE,
    TIMEOUT,
    Run,
    assert_closing_line_is_wall_clock_and_bounded,
    assert_resumed_exactly,
    ddp_full_flags,
    ddp_side_dirs,
    ddp_train_flags,
    flat,
    max_diff,
    rank_stdout,
    read,
    windows,
)
from safetensors.torch import load_file

from qa_hpc.errors import EXIT_PREEMPTED


def evals(state: dict) -> dict[int, float]:
    return {h["step"]: h["eval_f1"] for h in state["log_history"] if "eval_f1" in h}


def probe_env(params: Path, **extra: str) -> dict[str, str]:
    """The probe imports run_qa from the checkout (torchrun puts only the probe's own folder on the path)."""
    return offline_env(PYTHONPATH=str(REPO), QA_PROBE_PARAMS_DIR=str(params), **extra)


def test_two_ranks_split_the_data_evaluate_every_question_once_and_rank0_closes(
    ddp: Run, ddp_data: dict
) -> None:
    out = ddp.ok().out
    log = ddp.text
    assert "DISTRIBUTED world_size=2" in log and "backend=gloo" in log
    train_feats = read(out / "train_results.json")["train_samples"]
    assert train_feats == len(windows(flat(read(ddp_data["train"])))["input_ids"])
    # 2 epochs
    steps_per_epoch = math.ceil(train_feats / (DDP_BATCH * 2))
    assert read(out / "trainer_state.json")["global_step"] == 2 * steps_per_epoch
    n_feat = len(windows(flat(read(ddp_data["validation"])))["input_ids"])
    assert n_feat % 2 == 1 and read(out / "eval_results.json")["eval_samples"] == n_feat
    assert sorted(read(out / "eval_predictions.json")) == sorted(
        r["id"] for r in flat(read(ddp_data["validation"]))
    )
    # the metrics were computed once, on rank 0: only it prints them, and its closing line
    rank0, rank1 = rank_stdout(ddp, 0), rank_stdout(ddp, 1)
    assert rank0.count("eval_f1=") == 1 and "eval_f1=" not in rank1 and "WALL_CLOCK_SECONDS=" not in rank1
    assert_closing_line_is_wall_clock_and_bounded(rank0, read(out / "run_summary.json"), ddp.measured)


def test_gradients_are_synchronized_across_ranks(
    ddp: Run, ddp_data: dict, tiny_bert: Path, tmp_path: Path
) -> None:
    params = ddp_side_dirs(ddp.ok().log.parents[1])[1]
    steps = read(ddp.out / "trainer_state.json")["global_step"]
    initial = load_file(tiny_bert / "model.safetensors")
    rank0, rank1 = load_file(params / "rank0.safetensors"), load_file(params / "rank1.safetensors")
    assert max_diff(rank0, rank1) == 0, f"the ranks ended {max_diff(rank0, rank1)} apart"
    unchanged = [k for k in initial if torch.equal(initial[k], rank0[k])]
    assert unchanged == [] and max_diff(rank0, initial) > 1e-3, f"training left {unchanged} unchanged"
    # what rank 0 holds after the last step is what it saved there
    assert max_diff(rank0, load_file(ddp.out / f"checkpoint-{steps}" / "model.safetensors")) == 0

    # the same training without the all-reduce, by two torchrun agents as two nodes meeting at a c10d endpoint
    out = tmp_path / "out"
    alone = tmp_path / "params"
    cmd = torchrun(
        PROBE,
        *ddp_train_flags(tiny_bert, ddp_data, out),
        "--do_eval",
        "--validation_file",
        str(ddp_data["validation"]),
        "--save_strategy",
        "no",
        launch=(
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv_backend=c10d",
            "--max_restarts=0",
            f"--rdzv_endpoint=127.0.0.1:{free_port()}",
            "--rdzv_id=qa-test",
        ),
    )
    logs = "".join(
        ok(node) for node in side_by_side(*[(cmd, probe_env(alone, QA_PROBE_NO_GRAD_SYNC="1"))] * 2)
    )
    assert "DISTRIBUTED world_size=2" in logs and logs.count("WALL_CLOCK_SECONDS=") == 1
    assert read(out / "trainer_state.json")["global_step"] == steps and "eval_f1" in read(
        out / "eval_results.json"
    )
    alone0, alone1 = load_file(alone / "rank0.safetensors"), load_file(alone / "rank1.safetensors")
    assert max_diff(alone0, alone1) > 1e-3, "without the all-reduce the ranks' shards must lead them apart"
    assert max_diff(rank0, alone0) > 1e-3 and max_diff(rank0, alone1) > 1e-3


def test_best_checkpoint_is_loaded_on_every_rank_and_scores_like_one_process(
    ddp: Run, ddp_data: dict, tmp_path: Path
) -> None:
    out = ddp.ok().out
    state = read(out / "trainer_state.json")
    steps = state["global_step"]
    f1 = evals(state)
    assert sorted(f1) == list(range(DDP_EVAL_STEPS, steps + 1, DDP_EVAL_STEPS)), state["log_history"]
    # the first of equals: greater_is_better is strict
    best_step = min(s for s in f1 if f1[s] == max(f1.values()))
    best = out / f"checkpoint-{best_step}"
    assert state["best_model_checkpoint"] == str(best) and state["best_metric"] == f1[best_step]
    # a best before the last step, or loading it would change nothing (these settings give one)
    assert best_step < steps, f"eval_f1 by step {f1}: change --seed or --learning_rate"
    weights = load_file(out / "model.safetensors")
    assert max_diff(weights, load_file(best / "model.safetensors")) == 0
    assert max_diff(weights, load_file(out / f"checkpoint-{steps}" / "model.safetensors")) > 0
    # the final 2-rank evaluation, of the loaded model, scores what that checkpoint scored in training
    assert read(out / "eval_results.json")["eval_f1"] == f1[best_step]

    # one process with the saved (best) model: the same answers and scores as the 2 ranks, so rank 1, whose
    # share of the logits came from its own copy of the model, had loaded the same checkpoint, and the gather
    # handed each feature its own logits (in one process they are its own: tests/unit/test_features.py)
    one = tmp_path / "one"
    ok(
        run_qa(
            tiny_flags(
                out,
                one,
                "--do_eval",
                "--validation_file",
                str(ddp_data["validation"]),
                "--do_predict",
                "--test_file",
                str(ddp_data["test"]),
                "--per_device_eval_batch_size",
                "3",
            )
        )
    )
    assert len(read(out / "predict_predictions.json")) == 7
    for name in ("eval_predictions.json", "predict_predictions.json"):
        assert read(one / name) == read(out / name), name
    for split, keys in (("eval", ("exact_match", "f1", "samples")), ("predict", ("exact_match", "f1"))):
        two, single = read(out / f"{split}_results.json"), read(one / f"{split}_results.json")
        assert [two[f"{split}_{k}"] for k in keys] == [single[f"{split}_{k}"] for k in keys], split


def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(
    ddp: Run, tiny_bert: Path, ddp_data: dict, tmp_path: Path
) -> None:
    reference_params = ddp_side_dirs(ddp.ok().log.parents[1])[1]
    steps = read(ddp.out / "trainer_state.json")["global_step"]
    out = tmp_path / "out"
    params = tmp_path / "params"
    cmd = torchrun(PROBE, *ddp_full_flags(tiny_bert, ddp_data, out))
    env = probe_env(params)
    first = LoggedProcess(cmd, tmp_path / "first.log", env=env)
    try:
        first.wait_for(r"\{'loss'", count=1, timeout=TIMEOUT)  # training
        os.kill(rank_pids(first.text())[1], signal.SIGUSR1)  # rank 1 only: the ranks' vote stops both
        first.proc.wait(timeout=TIMEOUT)
    finally:
        first.kill_all()
    log = first.text()
    # rank 0, which the signal did not reach, names it too: it logs and records the stop
    stops = re.findall(r"\[rank(\d)\] WARNING [\w.]+: STOP_REQUESTED signal=SIGUSR1 global_step=(\d+)", log)
    assert sorted(r for r, _ in stops) == ["0", "1"], log[-4000:]
    assert len({s for _, s in stops}) == 1, f"ranks stopped at different steps: {stops}"
    step = int(stops[0][1])
    assert 1 <= step < steps
    assert re.search(rf"PREEMPTED signal=SIGUSR1 global_step={step} ", log), log[-4000:]
    # torchrun's report: the first worker to finish exited EX_TEMPFAIL; torchrun then ends the other with
    # SIGTERM if it is still shutting down (the checkpoint and the record were written before any exit)
    codes = re.findall(r"exitcode\s*: (-?\d+)", log)
    assert str(EXIT_PREEMPTED) in codes and set(codes) <= {str(EXIT_PREEMPTED), "-15"}, log[-4000:]
    assert not params.exists(), "the first run must stop before its last step"
    checkpoint = out / f"checkpoint-{step}"
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt", "trainer_state.json"} <= set(
        os.listdir(checkpoint)
    )
    record = read(out / "run_summary.json")
    stopped = (
        record["status"],
        record["exit_code"],
        record["stopped"]["global_step"],
        record["stopped"]["signal"],
    )
    assert stopped == ("preempted", EXIT_PREEMPTED, step, "SIGUSR1"), record

    assert_resumed_exactly(out, ddp.out, log, ok(run(cmd, env=env)), step)  # rank 0 logs the losses
    resumed, reference = read(out / "trainer_state.json"), read(ddp.out / "trainer_state.json")
    assert evals(resumed) == pytest.approx(evals(reference))
    for rank in (0, 1):
        resumed_weights = load_file(params / f"rank{rank}.safetensors")
        reference_weights = load_file(reference_params / f"rank{rank}.safetensors")
        diff = max_diff(resumed_weights, reference_weights)
        assert diff < 1e-6, f"rank {rank}'s final parameters differ by {diff}"
    assert Path(resumed["best_model_checkpoint"]).name == Path(reference["best_model_checkpoint"]).name
    assert read(out / "predict_predictions.json") == read(ddp.out / "predict_predictions.json")
    assert read(out / "run_summary.json")["status"] == "ok"


# A job whose rank 1 stops: the signal, run_qa.py's extra flags, the bound on the seconds from the signal to
# the job's exit, and what its log must name ({0}, {1}: rank 0's and rank 1's pid).
STOPS = {
    # the launcher's failure report names the dead rank, its pid and the signal
    "killed": (
        signal.SIGKILL,
        (),
        120,
        [r"rank\s*:\s*1 \(local_rank: 1\)", r"pid: {1}\b", "SIGKILL"],
    ),
    # frozen (SIGSTOP: a hung node or file system): alive but silent, sockets open, only a timeout can tell;
    # --ddp_timeout reaches gloo too, so rank 0 gives up after 20 s (not 1800), says so, and the launcher
    # stops. 20, not less: the job starts beside the module's other tests, and the same timeout bounds its
    # ranks' first meeting
    "frozen": (
        signal.SIGSTOP,
        ("--ddp_timeout", "20"),
        150,
        [r"ERROR: rank 0 \(pid {0}\) failed: .*[Tt]ime(d )?out", r"rank\s*:\s*0 \(local_rank: 0\)"],
    ),
}


def stop_rank_1(
    case: str, tiny_bert: Path, demo_files: dict[str, Path], tmp: Path
) -> tuple[int, float, str, dict]:
    """A 2-rank training job whose rank 1 gets STOPS[case]'s signal once both ranks train: the job's exit
    code, the seconds from the signal to its exit, its log, and the ranks' pids."""
    sig, flags, within, _ = STOPS[case]
    cmd = torchrun(
        RUN_QA,
        *tiny_flags(
            tiny_bert,
            tmp / "out",
            "--do_train",
            "--train_file",
            str(demo_files["train"]),
            "--max_train_samples",
            "8",
            "--num_train_epochs",
            "200",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--save_strategy",
            "no",
            *flags,
        ),
    )
    job = LoggedProcess(cmd, tmp / "torchrun.log")
    pids: dict[int, int] = {}
    try:
        job.wait_for(r"\{'loss'", count=2)  # both ranks are in the training loop
        pids = rank_pids(job.text())
        os.kill(pids[1], sig)
        started = time.monotonic()
        code = job.proc.wait(timeout=within + 60)
        elapsed = time.monotonic() - started
    finally:
        job.kill_all(*pids.values())  # workers may live in their own sessions
    return code, elapsed, job.text(), pids


@pytest.fixture(scope="module", autouse=True)
def frozen_job(
    request, tiny_bert: Path, demo_files: dict[str, Path], tmp_path_factory
) -> Iterator[Future | None]:
    """The frozen-rank job, started with the module: once rank 1 is stopped it only waits (rank 0's 20 s
    --ddp_timeout, then torchrun's 30 s for a worker to exit before it kills it), so the module's other tests
    run meanwhile and its own test collects the outcome."""
    tmp = tmp_path_factory.mktemp("frozen")
    test = "test_a_killed_or_frozen_rank_ends_the_job_in_bounded_time_named[frozen]"
    with started_ahead(request, [test], stop_rank_1, "frozen", tiny_bert, demo_files, tmp) as job:
        yield job


@pytest.mark.parametrize("case", ["killed", "frozen"])
def test_a_killed_or_frozen_rank_ends_the_job_in_bounded_time_named(
    case: str, frozen_job: Future | None, tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
):
    _, _, within, named = STOPS[case]
    if case == "frozen":
        code, elapsed, log, pids = frozen_job.result()
    else:
        code, elapsed, log, pids = stop_rank_1(case, tiny_bert, demo_files, tmp_path)
    assert code != 0 and elapsed < within, f"exit {code} after {elapsed:.0f} s:\n{log[-4000:]}"
    for pattern in named:
        assert re.search(pattern.format(pids[0], pids[1]), log), (pattern, log[-4000:])


def test_ranks_vote_only_every_n_steps_and_stop_together() -> None:
    """On GPUs a vote syncs host and device, so the plan votes every 10 steps there: all ranks still stop
    together. Rank 1 alone is asked to stop at step 4; voting every 1, 3 and 10 steps, both ranks stop at 4, 6
    and 10."""
    cmd = torchrun(REPO / "tests" / "fixtures" / "vote_ranks.py", "20", "1:4", "3:4", "10:4")
    log = ok(run(cmd, timeout=120, env=offline_env(PYTHONPATH=str(REPO))))
    stopped = sorted(re.findall(r"STOPPED every=(\d+) rank=(\d) step=(\d+) votes=(\d+)", log))
    want = [
        (str(every), str(r), str(step), str(step // every))
        for every, step in ((1, 4), (10, 10), (3, 6))
        for r in (0, 1)
    ]
    assert stopped == sorted(want), log
