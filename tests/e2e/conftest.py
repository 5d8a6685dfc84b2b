"""Real runs of run_qa.py shared by the end-to-end tests: each trains once per session, many tests read it.

A "project" folder holds what a cluster user would have: logs/<job name>-<job id>.out (the run's output, as
Slurm writes it) and outputs/<job name>/; the Slurm job name and id come through the variables Slurm sets, so
run_summary.json records them as under Slurm.

- plain:  one process, train (2 epochs, 18 steps, a loss logged each step) + eval + predict, the profiler
          keeping global steps 3-4, TensorBoard on, a hub token given, debug logging
- ddp:    torchrun with 2 ranks (gloo) through tests/fixtures/run_qa_probe.py (each rank's parameters saved):
          eval every 2 steps, the best checkpoint by F1 loaded at the end, eval and predict, the profiler
          keeping step 2; each rank's output in its own file
- failed: a train file with a wrong answer_start: the run stops with exit code 2
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.procs import offline_env
from fixtures.runqa import PYTHON, REPO, RUN_QA
from fixtures.runs import (
    SECRET, TIMEOUT, Run, ddp_full_flags, ddp_side_dirs, flat, plain_training_flags, read, torchrun,
)


def _launch(cmd: list[str], project: Path, log: Path, env: dict[str, str]) -> tuple[int, float]:
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.run(cmd, cwd=project, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=TIMEOUT)
    return proc.returncode, time.monotonic() - started


def _job_env(job: tuple[str, str], **extra: str | None) -> dict[str, str]:
    return offline_env(SLURM_JOB_NAME=job[0], SLURM_JOB_ID=job[1], ACCELERATE_USE_CPU=None,
                       TRANSFORMERS_VERBOSITY="info", **extra)


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "logs").mkdir()
    (root / "outputs").mkdir()
    return root


@pytest.fixture(scope="session")
def features_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("features_cache")


@pytest.fixture(scope="session")
def plain(project: Path, tiny_bert: Path, demo_files: dict[str, Path], features_cache: Path) -> Run:
    job = ("qa-tiny", "1001")
    out, log = project / "outputs" / job[0], project / "logs" / f"{job[0]}-{job[1]}.out"
    cmd = [PYTHON, RUN_QA, *plain_training_flags(tiny_bert, demo_files, out), "--do_predict",
           "--test_file", str(demo_files["test"]), "--features_cache_dir", str(features_cache),
           "--profile", "--profile_wait", "1", "--profile_warmup", "1", "--profile_active", "2", "--profile_memory",
           "--profile_record_shapes", "--token", SECRET, "--log_level", "debug"]
    code, measured = _launch(cmd, project, log, _job_env(job))
    return Run(out, log, code, measured, job)


@pytest.fixture(scope="session")
def failed(project: Path, tiny_bert: Path, demo_files: dict[str, Path], tmp_path_factory) -> Run:
    job = ("qa-tiny-bad", "1003")
    data = read(demo_files["train"])
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 3  # off its text
    broken = tmp_path_factory.mktemp("broken") / "broken_train.json"
    broken.write_text(json.dumps(data), encoding="utf-8")
    out, log = project / "outputs" / job[0], project / "logs" / f"{job[0]}-{job[1]}.out"
    cmd = [PYTHON, RUN_QA, "--model_name_or_path", str(tiny_bert), "--output_dir", str(out), "--do_train",
           "--train_file", str(broken), "--max_seq_length", "128", "--doc_stride", "32"]
    code, measured = _launch(cmd, project, log, _job_env(job))
    return Run(out, log, code, measured, job)


@pytest.fixture(scope="session")
def ddp_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """24 train questions of one window each; validation questions of one and of several windows whose
    features are odd in number (duplicates a distributed sampler pads in would show); 7 test questions."""
    from transformers import AutoTokenizer

    from conftest import minilm_dir
    from qa_hpc.tools.make_demo_data import generate_squad

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    out = tmp_path_factory.mktemp("ddp_data")
    short = generate_squad(5, seed=13, context_words=30, title_prefix="ddp-short")  # one window each
    for n in range(9, 30):
        validation = generate_squad(n, seed=12, context_words=120, title_prefix="ddp-val")  # several windows
        validation["data"] += short["data"]
        records = flat(validation)
        features = len(tokenizer([r["question"] for r in records], [r["context"] for r in records],
                                 truncation="only_second", max_length=128, stride=32,
                                 return_overflowing_tokens=True)["input_ids"])
        if features % 2:
            break
    files = {"validation": out / "validation.json", "features": out / "validation_features"}
    files["validation"].write_text(json.dumps(validation), encoding="utf-8")
    files["features"].write_text(str(features))
    for split, n, seed in (("train", 24, 21), ("test", 7, 23)):
        files[split] = out / f"{split}.json"
        files[split].write_text(json.dumps(generate_squad(n, seed=seed, context_words=60, title_prefix=f"r-{split}")),
                                encoding="utf-8")
    return files


@pytest.fixture(scope="session")
def ddp(project: Path, tiny_bert: Path, ddp_data: dict[str, Path]) -> Run:
    """The 2-rank run; its log is torchrun's output followed by each rank's (torchrun --redirects)."""
    job = ("qa-tiny-ddp", "1002")
    out, log = project / "outputs" / job[0], project / "logs" / f"{job[0]}-{job[1]}.out"
    rank_dir, params = ddp_side_dirs(project)
    cmd = [*torchrun("--redirects", "3", "--log-dir", str(rank_dir)), *ddp_full_flags(tiny_bert, ddp_data, out)]
    env = _job_env(job, PYTHONPATH=str(REPO), QA_PROBE_PARAMS_DIR=str(params))
    code, measured = _launch(cmd, project, log, env)
    with open(log, "a", encoding="utf-8") as fh:
        for rank in (0, 1):
            for stream in ("stdout", "stderr"):
                for path in sorted(rank_dir.glob(f"*/attempt_0/{rank}/{stream}.log")):
                    fh.write(path.read_text(encoding="utf-8", errors="replace"))
    return Run(out, log, code, measured, job)
