"""Real multi-process DDP on CPU (gloo): torchrun starts real ranks of run_qa.py.

What is proven, with numbers read back from the runs' own files:
- 2 ranks split the training data: half the optimizer steps of 1 process (trainer_state.json).
- a 2-rank evaluation of a checkpoint gives the same predictions and EM/F1 as 1 process, with an
  odd number of eval features (so duplicates padded in by the distributed sampler would show) and
  every validation question answered exactly once.
- two torchrun agents acting as two nodes (--nnodes=2, c10d on 127.0.0.1) complete a run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, minilm_dir
from fixtures.procs import free_port, offline_env

MAX_LEN, STRIDE, BATCH = 128, 32, 4
TIMEOUT = 300


def run_env() -> dict[str, str]:
    return offline_env(ACCELERATE_USE_CPU=None)


def qa_args(model: Path, files: dict[str, Path], out: Path, *, train: bool) -> list[str]:
    args = [
        str(REPO / "run_qa.py"), "--model_name_or_path", str(model),
        "--validation_file", str(files["validation"]), "--do_eval",
        "--output_dir", str(out), "--max_seq_length", str(MAX_LEN), "--doc_stride", str(STRIDE),
        "--per_device_train_batch_size", str(BATCH), "--per_device_eval_batch_size", "3",
        "--num_train_epochs", "1", "--report_to", "none", "--seed", "3", "--save_strategy", "no",
        "--logging_steps", "1",
    ]
    if train:
        args += ["--train_file", str(files["train"]), "--do_train"]
    return args


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def run(cmd: list[str], cwd: Path) -> str:
    """Run a command to the end; fail with its output when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=run_env(), capture_output=True, text=True, timeout=TIMEOUT)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)}\nexit {proc.returncode}\n{log[-4000:]}"
    return log


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def count_features(questions: list[str], contexts: list[str]) -> int:
    """Eval windows per the tokenizer itself (independent of utils_qa)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    enc = tok(questions, contexts, truncation="only_second", max_length=MAX_LEN, stride=STRIDE,
              return_overflowing_tokens=True)
    return len(enc["input_ids"])


def flat(dataset: dict) -> list[dict]:
    return [dict(qa, context=p["context"]) for a in dataset["data"] for p in a["paragraphs"] for qa in p["qas"]]


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
        enc = tok(rec["question"], rec["context"], truncation="only_second", max_length=MAX_LEN, stride=STRIDE,
                  return_overflowing_tokens=True)
        if len(enc["input_ids"]) != 1:
            continue
        inputs = {k: torch.tensor([enc[k][0]]) for k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            start = model(**inputs).start_logits[0].numpy()
        context = np.array([sid == 1 for sid in enc.sequence_ids(0)])
        own = start[context]
        for cand in nbest[rec["id"]]:
            assert np.min(np.abs(own - cand["start_logit"])) < 1e-3, (rec["id"], cand)
        checked += 1
    assert checked >= 3


@pytest.fixture(scope="module")
def ddp_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """24 train questions; validation questions (long and short contexts) with an odd number of features."""
    from qa_hpc.tools.make_demo_data import generate_squad

    out = tmp_path_factory.mktemp("ddp_data")
    train = generate_squad(24, seed=11, context_words=60, title_prefix="ddp-train")
    short = generate_squad(5, seed=13, context_words=30, title_prefix="ddp-short")  # one window each
    for n in range(9, 30):
        val = generate_squad(n, seed=12, context_words=120, title_prefix="ddp-val")  # several windows each
        val["data"] += short["data"]
        records = flat(val)
        n_feat = count_features([r["question"] for r in records], [r["context"] for r in records])
        if n_feat % 2 == 1:
            break
    else:  # pragma: no cover - the generator is deterministic
        pytest.fail("no validation size with an odd feature count")
    files = {"train": out / "train.json", "validation": out / "validation.json"}
    files["train"].write_text(json.dumps(train), encoding="utf-8")
    files["validation"].write_text(json.dumps(val), encoding="utf-8")
    (out / "n_features").write_text(str(n_feat))
    return files


def test_two_ranks_take_half_the_steps_and_evaluate_like_one(tiny_bert: Path, ddp_data: dict, tmp_path: Path):
    n_feat = int((ddp_data["validation"].parent / "n_features").read_text())
    val_ids = [r["id"] for r in flat(read(ddp_data["validation"]))]
    assert n_feat % 2 == 1

    # 1 process and 2 ranks train the same model on the same data
    one, two = tmp_path / "one", tmp_path / "two"
    run([sys.executable] + qa_args(tiny_bert, ddp_data, one, train=True), tmp_path)
    log2 = run(torchrun(2) + qa_args(tiny_bert, ddp_data, two, train=True), tmp_path)
    assert "DISTRIBUTED world_size=2" in log2 and "backend=gloo" in log2

    train_feats = read(one / "train_results.json")["train_samples"]
    assert read(two / "train_results.json")["train_samples"] == train_feats
    steps1 = read(one / "trainer_state.json")["global_step"]
    steps2 = read(two / "trainer_state.json")["global_step"]
    assert steps1 == math.ceil(train_feats / BATCH)
    assert steps2 == math.ceil(train_feats / (BATCH * 2)), (train_feats, steps1, steps2)
    assert steps1 >= 2 * steps2 - 1 and steps2 < steps1

    # the eval inside the 2-rank run: every question once, features counted once
    res2 = read(two / "eval_results.json")
    assert res2["eval_samples"] == n_feat
    preds2 = read(two / "eval_predictions.json")
    assert sorted(preds2) == sorted(val_ids) and len(preds2) == len(val_ids)

    # eval-only of the 2-rank checkpoint: 2 ranks vs 1 process
    eval1, eval2 = tmp_path / "eval1", tmp_path / "eval2"
    run([sys.executable] + qa_args(two, ddp_data, eval1, train=False), tmp_path)
    log_e2 = run(torchrun(2) + qa_args(two, ddp_data, eval2, train=False), tmp_path)
    assert "DISTRIBUTED world_size=2" in log_e2
    p1, p2 = read(eval1 / "eval_predictions.json"), read(eval2 / "eval_predictions.json")
    assert p1 == p2
    assert p2 == preds2  # and equal to the eval done right after training, in memory
    r1, r2 = read(eval1 / "eval_results.json"), read(eval2 / "eval_results.json")
    for key in ("eval_exact_match", "eval_f1", "eval_samples"):
        assert r1[key] == r2[key] == res2[key], key
    assert_logits_belong_to_their_features(two, flat(read(ddp_data["validation"])),
                                           read(eval2 / "eval_nbest_predictions.json"))
    # the metrics were computed once, on rank 0: only it prints them
    assert log_e2.count("eval_f1=") == 1


def test_two_nodes_rendezvous_over_c10d(tiny_bert: Path, ddp_data: dict, tmp_path: Path):
    """Two torchrun agents, one per 'node', meet at a c10d endpoint on 127.0.0.1."""
    port = free_port()
    out = tmp_path / "out"
    procs = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=qa-test",
               "--max_restarts=0"] + qa_args(tiny_bert, ddp_data, out, train=True)
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=run_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=TIMEOUT)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]
    both = "".join(logs)
    assert "DISTRIBUTED world_size=2" in both
    assert both.count("WALL_CLOCK_SECONDS=") == 1
    train_feats = read(out / "train_results.json")["train_samples"]
    assert read(out / "trainer_state.json")["global_step"] == math.ceil(train_feats / (BATCH * 2))
    assert "eval_f1" in read(out / "eval_results.json")
