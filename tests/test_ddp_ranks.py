"""What every rank of a 2-rank torchrun run (CPU, gloo) holds and sees, not rank 0 alone.

One 2-rank run trains, evaluates every 2 steps, keeps the best checkpoint by F1 (so every rank needs
eval_f1, which rank 0 alone computes), loads it at the end, evaluates and predicts. From it:

- gradients are synchronized: both ranks end training with bitwise identical parameters, which
  training changed, and which differ from a run of the same command in which DDP never all-reduces
  gradients (each rank then trains alone on its shard, and the two ranks end apart);
- the best checkpoint is chosen and loaded on every rank: the saved model is that checkpoint's, and
  predict_predictions.json equals one process predicting with that checkpoint;
- WALL_CLOCK_SECONDS is rank 0's last stdout line (rank 1 prints none) and lies between the timed
  phases and the wall time measured around torchrun;
- the same command interrupted (SIGUSR1 to rank 1 only: both ranks stop after the same step,
  checkpoint, exit 75) and run again ends exactly like it: per-step losses, evaluations, each rank's
  final parameters, the chosen checkpoint and the predictions.

Each rank's parameters come from tests/fixtures/run_qa_probe.py (run_qa.py plus a callback that saves
them after the last optimizer step); run_qa.py itself saves rank 0's model only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.runqa import PYTHON, REPO, LoggedProcess, qa_env, run_qa, tiny_flags
from fixtures.wall_clock import assert_wall_clock_is_bounded
from qa_hpc.errors import EXIT_PREEMPTED

pytestmark = pytest.mark.e2e

PROBE = str(REPO / "tests" / "fixtures" / "run_qa_probe.py")
MAX_STEPS, EVAL_STEPS = 6, 2
TIMEOUT = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Short contexts (one or two windows each): 24 train, 9 validation and 7 test questions."""
    from qa_hpc.tools.make_demo_data import generate_squad

    out = tmp_path_factory.mktemp("ranks_data")
    files = {}
    for split, n, seed in (("train", 24, 21), ("validation", 9, 22), ("test", 7, 23)):
        files[split] = out / f"{split}.json"
        files[split].write_text(json.dumps(generate_squad(n, seed=seed, context_words=60, title_prefix=f"r-{split}")),
                                encoding="utf-8")
    return files


def train_flags(model: Path, data: dict[str, Path], out: Path) -> list[str]:
    return [
        *tiny_flags(model, out), "--do_train", "--train_file", str(data["train"]), "--per_device_train_batch_size",
        "4", "--max_steps", str(MAX_STEPS), "--logging_steps", "1", "--seed", "3", "--learning_rate", "1e-3",
        "--dataloader_num_workers", "0",
    ]


def full_flags(model: Path, data: dict[str, Path], out: Path) -> list[str]:
    """Training with evaluation every EVAL_STEPS, the best checkpoint by F1 loaded at the end, eval and predict."""
    return [
        *train_flags(model, data, out), "--do_eval", "--validation_file", str(data["validation"]), "--do_predict",
        "--test_file", str(data["test"]), "--per_device_eval_batch_size", "8", "--eval_strategy", "steps",
        "--eval_steps", str(EVAL_STEPS), "--save_strategy", "steps", "--save_steps", str(EVAL_STEPS),
        "--load_best_model_at_end", "--metric_for_best_model", "f1",
    ]


def probe_env(**extra: str) -> dict[str, str]:
    """The probe imports run_qa from the checkout (torchrun puts only the probe's own folder on the path)."""
    return qa_env(PYTHONPATH=str(REPO), **extra)


def torchrun(*extra: str) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *extra, PROBE]


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


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


def losses(state: dict) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


def evals(state: dict) -> dict[int, float]:
    return {h["step"]: h["eval_f1"] for h in state["log_history"] if "eval_f1" in h}


@pytest.fixture(scope="module")
def synced(tiny_bert: Path, data: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The full 2-rank run; each rank's stdout in its own file (torchrun --redirects)."""
    tmp = tmp_path_factory.mktemp("synced")
    out, params, logs = tmp / "out", tmp / "params", tmp / "logs"
    started = time.monotonic()
    proc = subprocess.run(torchrun("--redirects", "3", "--log-dir", str(logs)) + full_flags(tiny_bert, data, out),
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=str(tmp),
                          env=probe_env(QA_PROBE_PARAMS_DIR=str(params)))
    measured = time.monotonic() - started
    stdout = {}
    for rank in (0, 1):
        found = sorted(logs.glob(f"*/attempt_0/{rank}/stdout.log"))
        assert len(found) == 1, (rank, found, proc.stdout[-2000:] + proc.stderr[-2000:])
        stdout[rank] = found[0].read_text(encoding="utf-8", errors="replace")
    rank_logs = [f.read_text(encoding="utf-8", errors="replace") for f in sorted(logs.rglob("*.log"))]
    errors = [line for text in rank_logs for line in text.splitlines() if line.startswith("ERROR: ")]
    assert proc.returncode == 0, "\n".join(errors + [proc.stderr[-2000:]] + [text[-2000:] for text in rank_logs])
    return {"out": out, "params": params, "stdout": stdout, "measured": measured, "tmp": tmp}


@pytest.fixture(scope="module")
def unsynced(tiny_bert: Path, data: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same training with DDP's gradient all-reduce switched off: each rank trains alone on its shard."""
    tmp = tmp_path_factory.mktemp("unsynced")
    params = tmp / "params"
    proc = subprocess.run(torchrun() + train_flags(tiny_bert, data, tmp / "out") + ["--save_strategy", "no"],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=str(tmp),
                          env=probe_env(QA_PROBE_PARAMS_DIR=str(params), QA_PROBE_NO_GRAD_SYNC="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return params


def test_gradients_are_synchronized_across_ranks(synced: dict, unsynced: Path, tiny_bert: Path) -> None:
    initial = load(tiny_bert / "model.safetensors")
    rank0, rank1 = load(synced["params"] / "rank0.safetensors"), load(synced["params"] / "rank1.safetensors")
    assert identical(rank0, rank1), f"the ranks ended {max_diff(rank0, rank1)} apart"
    changed = [k for k in initial if not identical({k: initial[k]}, {k: rank0[k]})]
    assert changed == list(initial), f"training left {sorted(set(initial) - set(changed))} unchanged"
    assert max_diff(rank0, initial) > 1e-3
    # what rank 0 holds after the last step is what it saved there
    assert identical(rank0, load(synced["out"] / f"checkpoint-{MAX_STEPS}" / "model.safetensors"))

    alone0, alone1 = load(unsynced / "rank0.safetensors"), load(unsynced / "rank1.safetensors")
    assert max_diff(alone0, alone1) > 1e-3, "without the all-reduce the ranks' shards must lead them apart"
    assert max_diff(rank0, alone0) > 1e-3 and max_diff(rank0, alone1) > 1e-3


def test_best_checkpoint_is_loaded_on_every_rank_and_predicts_like_one_process(
    synced: dict, data: dict, tmp_path: Path
) -> None:
    out = synced["out"]
    state = read(out / "trainer_state.json")
    f1 = evals(state)
    assert sorted(f1) == list(range(EVAL_STEPS, MAX_STEPS + 1, EVAL_STEPS)), state["log_history"]
    best_step = min(s for s in f1 if f1[s] == max(f1.values()))  # the first of equals: greater_is_better is strict
    best = out / f"checkpoint-{best_step}"
    assert state["best_model_checkpoint"] == str(best) and state["best_metric"] == f1[best_step]
    # a best before the last step, or loading it would change nothing (these settings give one)
    assert best_step < MAX_STEPS, f"eval_f1 by step {f1}: change --seed or --learning_rate"
    weights = load(out / "model.safetensors")
    assert identical(weights, load(best / "model.safetensors"))
    assert not identical(weights, load(out / f"checkpoint-{MAX_STEPS}" / "model.safetensors"))
    # the final 2-rank evaluation, of the loaded model, scores what that checkpoint scored in training
    assert read(out / "eval_results.json")["eval_f1"] == f1[best_step]

    # one process predicting with the best checkpoint: the same answers as the 2 ranks (rank 1's share
    # of the logits came from its own copy of the model, so it had loaded the same checkpoint)
    one = tmp_path / "one"
    proc = run_qa([*tiny_flags(best, one), "--do_predict", "--test_file", str(data["test"]),
                   "--per_device_eval_batch_size", "8"], timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    two_preds = read(out / "predict_predictions.json")
    assert len(two_preds) == 7 and read(one / "predict_predictions.json") == two_preds
    two, single = read(out / "predict_results.json"), read(one / "predict_results.json")
    assert (two["predict_exact_match"], two["predict_f1"]) == (single["predict_exact_match"], single["predict_f1"])


def test_wall_clock_line_is_rank0s_last_and_bounded(synced: dict) -> None:
    rank0 = synced["stdout"][0].rstrip("\n").splitlines()
    assert rank0[-1].startswith("WALL_CLOCK_SECONDS="), rank0[-3:]
    assert "WALL_CLOCK_SECONDS=" not in synced["stdout"][1], synced["stdout"][1][-2000:]
    summary = read(synced["out"] / "run_summary.json")
    assert summary["results"].get("predict_runtime", 0) > 0
    assert_wall_clock_is_bounded(int(rank0[-1].split("=", 1)[1]), summary, synced["measured"])


def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(
    synced: dict, tiny_bert: Path, data: dict, tmp_path: Path
) -> None:
    out, params = tmp_path / "out", tmp_path / "params"
    cmd = torchrun() + full_flags(tiny_bert, data, out)
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
    assert 1 <= step < MAX_STEPS
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
    assert log.count("{'loss'") == step and again.stdout.count("{'loss'") == MAX_STEPS - step, again.stdout[-3000:]

    resumed, reference = read(out / "trainer_state.json"), read(synced["out"] / "trainer_state.json")
    assert sorted(losses(resumed)) == list(range(1, MAX_STEPS + 1))  # every step trained once
    for s, loss in losses(reference).items():
        assert losses(resumed)[s] == pytest.approx(loss, rel=1e-6, abs=1e-7), f"loss differs at step {s}"
    assert evals(resumed) == pytest.approx(evals(reference))
    for rank in (0, 1):
        a, b = load(params / f"rank{rank}.safetensors"), load(synced["params"] / f"rank{rank}.safetensors")
        assert max_diff(a, b) < 1e-6, f"rank {rank}'s final parameters differ by {max_diff(a, b)}"
    assert Path(resumed["best_model_checkpoint"]).name == Path(reference["best_model_checkpoint"]).name
    assert max_diff(load(out / "model.safetensors"), load(synced["out"] / "model.safetensors")) < 1e-6
    assert read(out / "predict_predictions.json") == read(synced["out"] / "predict_predictions.json")
    assert read(out / "run_summary.json")["status"] == "ok"
