"""Real multi-process DDP on CPU (gloo): what every rank holds and sees, not rank 0 alone.

The shared 2-rank run (tests/e2e/conftest.py) trains through tests/fixtures/run_qa_probe.py (run_qa.py plus a
callback that saves each rank's parameters after the last optimizer step), evaluates every 2 steps, keeps the
best checkpoint by F1 (so every rank needs eval_f1, which rank 0 alone computes), loads it, evaluates and
predicts. From it, with numbers read back from the runs' own files:

- the ranks split the training data (half the steps of one process) and evaluate every question once, with
  an odd number of eval features (duplicates padded in by the distributed sampler would show);
- gradients are synchronized: both ranks end with bitwise identical parameters, which differ from a run of
  the same training in which DDP never all-reduces gradients (two torchrun agents as two nodes meeting over
  c10d on 127.0.0.1: each rank then trains alone on its shard, and the two ranks end apart);
- the best checkpoint is loaded on every rank: one process evaluating and predicting with the saved model
  gives the same answers and scores as the 2 ranks did, and the logits belong to their own features;
- WALL_CLOCK_SECONDS is rank 0's last stdout line and lies between the timed phases and torchrun's life;
- the same command interrupted (SIGUSR1 to rank 1 only: both ranks stop after the same step, checkpoint,
  exit 75) and run again ends exactly like it.
And: a killed or frozen rank ends the job in bounded time, naming it; the stop vote every N steps.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.procs import free_port
from fixtures.runqa import PYTHON, REPO, LoggedProcess, qa_env, run_qa, tiny_flags
from fixtures.outputs import losses
from fixtures.runs import (
    DDP_BATCH, DDP_EVAL_STEPS, PROBE, TIMEOUT, Run, ddp_full_flags, ddp_side_dirs, ddp_train_flags, flat, rank_stdout,
    read, torchrun,
)
from fixtures.wall_clock import assert_wall_clock_is_bounded
from qa_hpc.errors import EXIT_PREEMPTED


def load(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), set(a) ^ set(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


def identical(a: dict, b: dict) -> bool:
    import torch

    assert set(a) == set(b), set(a) ^ set(b)
    return all(torch.equal(a[k], b[k]) for k in a)


def evals(state: dict) -> dict[int, float]:
    return {h["step"]: h["eval_f1"] for h in state["log_history"] if "eval_f1" in h}


def probe_env(**extra: str) -> dict[str, str]:
    """The probe imports run_qa from the checkout (torchrun puts only the probe's own folder on the path)."""
    return qa_env(PYTHONPATH=str(REPO), **extra)


def count_features(records: list[dict]) -> int:
    """Windows per the tokenizer itself (independent of utils_qa)."""
    from transformers import AutoTokenizer

    from conftest import minilm_dir

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    return len(tok([r["question"] for r in records], [r["context"] for r in records], truncation="only_second",
                   max_length=128, stride=32, return_overflowing_tokens=True)["input_ids"])


@pytest.fixture(scope="module")
def unsynced(tiny_bert: Path, ddp_data: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The shared run's training with DDP's gradient all-reduce off, by two torchrun agents as two nodes (c10d)."""
    tmp = tmp_path_factory.mktemp("unsynced")
    port, out, params = free_port(), tmp / "out", tmp / "params"
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=qa-test", "--max_restarts=0", PROBE,
           *ddp_train_flags(tiny_bert, ddp_data, out), "--do_eval", "--validation_file", str(ddp_data["validation"]),
           "--save_strategy", "no"]
    env = probe_env(QA_PROBE_PARAMS_DIR=str(params), QA_PROBE_NO_GRAD_SYNC="1")
    procs = [subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    try:
        logs = [proc.communicate(timeout=TIMEOUT)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return {"codes": [p.returncode for p in procs], "logs": logs, "out": out, "params": params}


def test_two_ranks_split_the_data_and_evaluate_every_question_once(ddp: Run, ddp_data: dict) -> None:
    out, log = ddp.ok().out, ddp.text
    assert "DISTRIBUTED world_size=2" in log and "backend=gloo" in log
    train_feats = read(out / "train_results.json")["train_samples"]
    assert train_feats == count_features(flat(read(ddp_data["train"])))
    assert read(out / "trainer_state.json")["global_step"] == 2 * math.ceil(train_feats / (DDP_BATCH * 2))  # 2 epochs
    n_feat = int(ddp_data["features"].read_text())
    assert n_feat % 2 == 1 and read(out / "eval_results.json")["eval_samples"] == n_feat
    val_ids = [r["id"] for r in flat(read(ddp_data["validation"]))]
    preds = read(out / "eval_predictions.json")
    assert sorted(preds) == sorted(val_ids) and len(preds) == len(val_ids)
    # the metrics were computed once, on rank 0: only it prints them
    assert rank_stdout(ddp, 0).count("eval_f1=") == 1 and "eval_f1=" not in rank_stdout(ddp, 1)


def test_gradients_are_synchronized_across_ranks(ddp: Run, unsynced: dict, tiny_bert: Path) -> None:
    params = ddp_side_dirs(ddp.ok().log.parents[1])[1]
    steps = read(ddp.out / "trainer_state.json")["global_step"]
    initial = load(tiny_bert / "model.safetensors")
    rank0, rank1 = load(params / "rank0.safetensors"), load(params / "rank1.safetensors")
    assert identical(rank0, rank1), f"the ranks ended {max_diff(rank0, rank1)} apart"
    changed = [k for k in initial if not identical({k: initial[k]}, {k: rank0[k]})]
    assert changed == list(initial), f"training left {sorted(set(initial) - set(changed))} unchanged"
    assert max_diff(rank0, initial) > 1e-3
    # what rank 0 holds after the last step is what it saved there
    assert identical(rank0, load(ddp.out / f"checkpoint-{steps}" / "model.safetensors"))

    alone0, alone1 = load(unsynced["params"] / "rank0.safetensors"), load(unsynced["params"] / "rank1.safetensors")
    assert max_diff(alone0, alone1) > 1e-3, "without the all-reduce the ranks' shards must lead them apart"
    assert max_diff(rank0, alone0) > 1e-3 and max_diff(rank0, alone1) > 1e-3


def test_two_nodes_rendezvous_over_c10d(unsynced: dict, ddp: Run) -> None:
    """Two torchrun agents, one per 'node', meet at a c10d endpoint on 127.0.0.1 and complete the run."""
    for code, log in zip(unsynced["codes"], unsynced["logs"]):
        assert code == 0, log[-4000:]
    both = "".join(unsynced["logs"])
    assert "DISTRIBUTED world_size=2" in both
    assert both.count("WALL_CLOCK_SECONDS=") == 1
    train_feats = read(unsynced["out"] / "train_results.json")["train_samples"]
    assert read(unsynced["out"] / "trainer_state.json")["global_step"] == 2 * math.ceil(train_feats / (DDP_BATCH * 2))
    assert "eval_f1" in read(unsynced["out"] / "eval_results.json")


def assert_logits_belong_to_their_features(model_dir: Path, records: list[dict], nbest: dict) -> None:
    """Every n-best start logit of a one-window example is a start logit of THAT example's window.

    Computed here by a plain forward pass of the saved model, outside the Trainer: if the eval loop
    handed logits to the wrong features (a shuffled sampler, a bad gather), the values would not match.
    """
    import numpy as np
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForQuestionAnswering.from_pretrained(str(model_dir)).eval()
    checked = 0
    for rec in records:
        enc = tok(rec["question"], rec["context"], truncation="only_second", max_length=128, stride=32,
                  return_overflowing_tokens=True)
        if len(enc["input_ids"]) != 1:
            continue
        inputs = {k: torch.tensor([enc[k][0]]) for k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            start = model(**inputs).start_logits[0].numpy()
        own = start[np.array([sid == 1 for sid in enc.sequence_ids(0)])]
        for cand in nbest[rec["id"]]:
            assert np.min(np.abs(own - cand["start_logit"])) < 1e-3, (rec["id"], cand)
        checked += 1
    assert checked >= 3


def test_best_checkpoint_is_loaded_on_every_rank_and_scores_like_one_process(
    ddp: Run, ddp_data: dict, tmp_path: Path
) -> None:
    out = ddp.ok().out
    state = read(out / "trainer_state.json")
    steps, f1 = state["global_step"], evals(state)
    assert sorted(f1) == list(range(DDP_EVAL_STEPS, steps + 1, DDP_EVAL_STEPS)), state["log_history"]
    best_step = min(s for s in f1 if f1[s] == max(f1.values()))  # the first of equals: greater_is_better is strict
    best = out / f"checkpoint-{best_step}"
    assert state["best_model_checkpoint"] == str(best) and state["best_metric"] == f1[best_step]
    # a best before the last step, or loading it would change nothing (these settings give one)
    assert best_step < steps, f"eval_f1 by step {f1}: change --seed or --learning_rate"
    weights = load(out / "model.safetensors")
    assert identical(weights, load(best / "model.safetensors"))
    assert not identical(weights, load(out / f"checkpoint-{steps}" / "model.safetensors"))
    # the final 2-rank evaluation, of the loaded model, scores what that checkpoint scored in training
    two_eval = read(out / "eval_results.json")
    assert two_eval["eval_f1"] == f1[best_step]

    # one process with the saved (best) model: the same answers and scores as the 2 ranks (rank 1's share
    # of the logits came from its own copy of the model, so it had loaded the same checkpoint)
    one = tmp_path / "one"
    proc = run_qa([*tiny_flags(out, one), "--do_eval", "--validation_file", str(ddp_data["validation"]),
                   "--do_predict", "--test_file", str(ddp_data["test"]), "--per_device_eval_batch_size", "3"],
                  timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read(one / "eval_predictions.json") == read(out / "eval_predictions.json")
    one_eval = read(one / "eval_results.json")
    for key in ("eval_exact_match", "eval_f1", "eval_samples"):
        assert one_eval[key] == two_eval[key], key
    two_preds = read(out / "predict_predictions.json")
    assert len(two_preds) == 7 and read(one / "predict_predictions.json") == two_preds
    two, single = read(out / "predict_results.json"), read(one / "predict_results.json")
    assert (two["predict_exact_match"], two["predict_f1"]) == (single["predict_exact_match"], single["predict_f1"])
    assert_logits_belong_to_their_features(out, flat(read(ddp_data["validation"])),
                                           read(out / "eval_nbest_predictions.json"))


def test_wall_clock_line_is_rank0s_last_and_bounded(ddp: Run) -> None:
    rank0 = rank_stdout(ddp.ok(), 0).rstrip("\n").splitlines()
    assert rank0[-1].startswith("WALL_CLOCK_SECONDS="), rank0[-3:]
    assert "WALL_CLOCK_SECONDS=" not in rank_stdout(ddp, 1)
    summary = read(ddp.out / "run_summary.json")
    assert summary["results"].get("predict_runtime", 0) > 0
    assert_wall_clock_is_bounded(int(rank0[-1].split("=", 1)[1]), summary, ddp.measured)


def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(
    ddp: Run, tiny_bert: Path, ddp_data: dict, tmp_path: Path
) -> None:
    reference_params = ddp_side_dirs(ddp.ok().log.parents[1])[1]
    steps = read(ddp.out / "trainer_state.json")["global_step"]
    out, params = tmp_path / "out", tmp_path / "params"
    cmd = torchrun() + ddp_full_flags(tiny_bert, ddp_data, out)
    env = probe_env(QA_PROBE_PARAMS_DIR=str(params))
    first = LoggedProcess(cmd, tmp_path / "first.log", env=env)
    try:
        first.wait_for(r"\{'loss'", count=1, timeout=TIMEOUT)  # training
        rank1 = int(re.search(r"RANK_PID rank=1 local_rank=1 pid=(\d+)", first.text()).group(1))
        os.kill(rank1, signal.SIGUSR1)  # rank 1 only: the ranks' vote stops both
        first.wait(timeout=TIMEOUT)
    finally:
        first.kill_all()
    log = first.text()
    stops = re.findall(r"\[rank(\d)\] WARNING [\w.]+: STOP_REQUESTED signal=\w+ global_step=(\d+)", log)
    assert sorted(r for r, _ in stops) == ["0", "1"], log[-4000:]
    assert len({s for _, s in stops}) == 1, f"ranks stopped at different steps: {stops}"
    step = int(stops[0][1])
    assert 1 <= step < steps
    assert re.search(rf"PREEMPTED signal=\w+ global_step={step} ", log), log[-4000:]  # rank 0: it was not signalled
    # torchrun's report: the first worker to finish exited EX_TEMPFAIL; torchrun then ends the other with
    # SIGTERM if it is still shutting down (the checkpoint and the record were written before any exit)
    codes = re.findall(r"exitcode\s*: (-?\d+)", log)
    assert str(EXIT_PREEMPTED) in codes and set(codes) <= {str(EXIT_PREEMPTED), "-15"}, log[-4000:]
    assert not params.exists(), "the first run must stop before its last step"
    checkpoint = out / f"checkpoint-{step}"
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt", "trainer_state.json"} <= set(os.listdir(checkpoint))
    record = read(out / "run_summary.json")
    assert (record["status"], record["exit_code"]) == ("preempted", EXIT_PREEMPTED)
    assert record["stopped"]["global_step"] == step

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=str(REPO), env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"RESUME_FROM={checkpoint} " in again.stdout + again.stderr
    # rank 0 logs each step it trains (--logging_steps 1): the first run steps 1..step, the rerun the rest only
    assert log.count("{'loss'") == step and again.stdout.count("{'loss'") == steps - step, again.stdout[-3000:]

    resumed, reference = read(out / "trainer_state.json"), read(ddp.out / "trainer_state.json")
    assert sorted(losses(resumed)) == list(range(1, steps + 1))  # every step trained once
    for s, loss in losses(reference).items():
        assert losses(resumed)[s] == pytest.approx(loss, rel=1e-6, abs=1e-7), f"loss differs at step {s}"
    assert evals(resumed) == pytest.approx(evals(reference))
    for rank in (0, 1):
        a, b = load(params / f"rank{rank}.safetensors"), load(reference_params / f"rank{rank}.safetensors")
        assert max_diff(a, b) < 1e-6, f"rank {rank}'s final parameters differ by {max_diff(a, b)}"
    assert Path(resumed["best_model_checkpoint"]).name == Path(reference["best_model_checkpoint"]).name
    assert max_diff(load(out / "model.safetensors"), load(ddp.out / "model.safetensors")) < 1e-6
    assert read(out / "predict_predictions.json") == read(ddp.out / "predict_predictions.json")
    assert read(out / "run_summary.json")["status"] == "ok"


# --- a rank that dies or freezes ---------------------------------------------------------------------------


def _start(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path, *extra: str) -> LoggedProcess:
    flags = [
        *tiny_flags(tiny_bert, tmp_path / "out"), "--do_train", "--train_file", str(demo_files["train"]),
        "--max_train_samples", "8", "--per_device_train_batch_size", "4", "--num_train_epochs", "200",
        "--logging_steps", "1", "--save_strategy", "no", *extra,
    ]
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(REPO / "run_qa.py"), *flags]
    return LoggedProcess(cmd, tmp_path / "torchrun.log")


def _pids(run: LoggedProcess) -> dict[int, int]:
    run.wait_for(r"RANK_PID rank=1 ", timeout=300)
    run.wait_for(r"RANK_PID rank=0 ", timeout=300)
    return {int(r): int(p) for r, p in re.findall(r"RANK_PID rank=(\d+) local_rank=\d+ pid=(\d+)", run.text())}


def _cleanup(run: LoggedProcess, pids: dict[int, int]) -> None:
    run.kill_all()
    for pid in pids.values():  # workers may live in their own sessions
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _signal_rank_one(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path, sig: int, timeout: float,
                     *flags: str) -> tuple[float, str, dict[int, int]]:
    """Start a 2-rank run, send rank 1 `sig` once both ranks train; it must fail: seconds after the signal, log."""
    run = _start(tiny_bert, demo_files, tmp_path, *flags)
    pids: dict[int, int] = {}
    try:
        pids = _pids(run)
        run.wait_for(r"\{'loss'", count=2)  # both ranks are in the training loop
        os.kill(pids[1], sig)
        t0 = time.monotonic()
        code = run.wait(timeout=timeout)
        elapsed = time.monotonic() - t0
    finally:
        _cleanup(run, pids)
    log = run.text()
    assert code != 0, log[-4000:]
    return elapsed, log, pids


def test_killed_rank_ends_the_job_and_is_named(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path) -> None:
    elapsed, log, pids = _signal_rank_one(tiny_bert, demo_files, tmp_path, signal.SIGKILL, 180)
    assert elapsed < 120, f"took {elapsed:.0f}s to notice a dead rank"
    # the launcher's failure report names the rank, its pid and the signal
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", log), log[-4000:]
    assert f"pid: {pids[1]}" in log and "SIGKILL" in log


def test_frozen_rank_hits_the_collective_timeout(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path) -> None:
    """A frozen rank (SIGSTOP: a hung node or file system) is caught by --ddp_timeout, which run_qa passes to
    the gloo process group as well as to NCCL: alive but silent, sockets open, only a timeout can tell."""
    elapsed, log, pids = _signal_rank_one(tiny_bert, demo_files, tmp_path, signal.SIGSTOP, 300,
                                          "--ddp_timeout", "10")
    # rank 0 gives up after --ddp_timeout (not the 1800 s default), says so, and the launcher stops the job
    assert elapsed < 150, f"took {elapsed:.0f}s"
    failed = re.search(r"ERROR: rank 0 \(pid (\d+)\) failed: (.*)", log)
    assert failed and int(failed.group(1)) == pids[0], log[-4000:]
    assert re.search(r"[Tt]imed out|[Tt]imeout", failed.group(2)), failed.group(0)
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)", log)


def test_ranks_vote_only_every_n_steps_and_stop_together() -> None:
    """On GPUs a vote syncs host and device, so the plan votes every 10 steps there: all ranks still stop together.
    Rank 1 alone is asked to stop at step 4; voting every 1, 3 and 10 steps, both ranks stop at 4, 6 and 10."""
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(REPO / "tests" / "fixtures" / "vote_ranks.py"), "20", "1:4", "3:4", "10:4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=qa_env(PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stopped = sorted(re.findall(r"STOPPED every=(\d+) rank=(\d) step=(\d+) votes=(\d+)", proc.stdout))
    want = [(str(every), str(r), str(step), str(step // every)) for every, step in ((1, 4), (10, 10), (3, 6))
            for r in (0, 1)]
    assert stopped == sorted(want), proc.stdout
