"""Real runs of run_qa.py shared by the end-to-end tests, each trained once per session and read by many
tests: plain (one process), ddp (torchrun, 2 gloo ranks, through tests/fixtures/run_qa_probe.py) and failed
(bad data, exit 2), side by side. Each lives in a "project" folder as a cluster user has it (logs/<job
name>-<job id>.out, outputs/<job name>/), with the Slurm job name and id in the variables Slurm sets, so
run_summary.json records them as under Slurm.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from fixtures.procs import PYTHON, REPO, RUN_QA, at_once, offline_env, torchrun
from fixtures.runs import (
    PROBE,
    SECRET,
    TIMEOUT,
    Run,
    ddp_full_flags,
    ddp_side_dirs,
    flat,
    plain_flags,
    read,
    windows,
)


def _launch(job: tuple[str, str], project: Path, command: Callable[[Path], list[str]], **env: str) -> Run:
    """Run command(output dir) as Slurm job `job` of `project` would, its output in the job's log."""
    out = project / "outputs" / job[0]
    log = project / "logs" / f"{job[0]}-{job[1]}.out"
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.run(
            command(out),
            cwd=project,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=offline_env(SLURM_JOB_NAME=job[0], SLURM_JOB_ID=job[1], **env),
            timeout=TIMEOUT,
        )
    return Run(out, log, proc.returncode, time.monotonic() - started, job)


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "logs").mkdir()
    (root / "outputs").mkdir()
    return root


@pytest.fixture(scope="session")
def features_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("features_cache")


def plain_run(project: Path, tiny_bert: Path, demo_files: dict[str, Path], features_cache: Path) -> Run:
    return _launch(
        ("qa-tiny", "1001"),
        project,
        lambda out: [
            PYTHON,
            RUN_QA,
            *plain_flags(tiny_bert, demo_files, out),
            "--do_predict",
            "--test_file",
            str(demo_files["test"]),
            "--features_cache_dir",
            str(features_cache),
            "--profile",
            "--profile_wait",
            "1",
            "--profile_warmup",
            "1",
            "--profile_active",
            "2",
            "--profile_memory",
            "--profile_record_shapes",
            "--token",
            SECRET,
            "--log_level",
            "debug",
        ],
    )


def failed_run(project: Path, tiny_bert: Path, demo_files: dict[str, Path], tmp_path_factory) -> Run:
    data = read(demo_files["train"])
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 3  # off its text
    broken = tmp_path_factory.mktemp("broken") / "broken_train.json"
    broken.write_text(json.dumps(data), encoding="utf-8")
    return _launch(
        ("qa-tiny-bad", "1003"),
        project,
        lambda out: [
            PYTHON,
            RUN_QA,
            "--model_name_or_path",
            str(tiny_bert),
            "--output_dir",
            str(out),
            "--do_train",
            "--train_file",
            str(broken),
            "--max_seq_length",
            "128",
            "--doc_stride",
            "32",
        ],
    )


@pytest.fixture(scope="session")
def ddp_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """24 train questions of one window each; validation questions of one and of several windows whose
    features are odd in number (duplicates a distributed sampler pads in would show); 7 test questions."""
    from qa_hpc.tools.make_demo_data import generate_squad

    out = tmp_path_factory.mktemp("ddp_data")
    short = generate_squad(5, seed=13, context_words=30, title_prefix="ddp-short")  # one window each
    for n in range(9, 30):
        validation = generate_squad(n, seed=12, context_words=120, title_prefix="ddp-val")  # several windows
        validation["data"] += short["data"]
        features = len(windows(flat(validation))["input_ids"])
        if features % 2:
            break
    files = {split: out / f"{split}.json" for split in ("train", "validation", "test")}
    files["validation"].write_text(json.dumps(validation), encoding="utf-8")
    for split, n, seed in (("train", 24, 21), ("test", 7, 23)):
        files[split].write_text(
            json.dumps(generate_squad(n, seed=seed, context_words=60, title_prefix=f"r-{split}")),
            encoding="utf-8",
        )
    return files


def ddp_run(project: Path, tiny_bert: Path, ddp_data: dict[str, Path]) -> Run:
    """The 2-rank run; its log is torchrun's output followed by each rank's (torchrun --redirects)."""
    rank_dir, params = ddp_side_dirs(project)
    launch = ("--standalone", "--nproc_per_node", "2", "--redirects", "3", "--log-dir", str(rank_dir))
    run = _launch(
        ("qa-tiny-ddp", "1002"),
        project,
        lambda out: torchrun(PROBE, *ddp_full_flags(tiny_bert, ddp_data, out), launch=launch),
        PYTHONPATH=str(REPO),
        QA_PROBE_PARAMS_DIR=str(params),
    )
    logs = sorted(
        rank_dir.glob("*/attempt_0/*/std*.log"), key=lambda p: (p.parent.name, p.name != "stdout.log")
    )
    with open(run.log, "a", encoding="utf-8") as fh:  # rank 0's stdout and stderr, then rank 1's
        for path in logs:
            fh.write(path.read_text(encoding="utf-8", errors="replace"))
    return run


class SharedRuns:
    """The shared runs by name, each started once: those the session's tests use side by side, at the first
    request for one (each mostly starts up, one thread per process), any other when it is asked for."""

    def __init__(self, start: dict[str, Callable[[], Run]], session: pytest.Session) -> None:
        self._start = start
        used = [name for name in start if any(name in item.fixturenames for item in session.items)]
        self._runs = dict(zip(used, at_once(*(start[name] for name in used))))

    def __getitem__(self, name: str) -> Run:
        if name not in self._runs:
            self._runs[name] = self._start[name]()
        return self._runs[name]


@pytest.fixture(scope="session")
def shared_runs(
    request: pytest.FixtureRequest,
    project: Path,
    tiny_bert: Path,
    demo_files: dict[str, Path],
    features_cache: Path,
    ddp_data: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> SharedRuns:
    start = {
        "plain": partial(plain_run, project, tiny_bert, demo_files, features_cache),
        "ddp": partial(ddp_run, project, tiny_bert, ddp_data),
        "failed": partial(failed_run, project, tiny_bert, demo_files, tmp_path_factory),
    }
    return SharedRuns(start, request.session)


@pytest.fixture(scope="session")
def plain(shared_runs: SharedRuns) -> Run:
    """One process: train, evaluate, predict, profiled, with the hub token given (it must never show)."""
    return shared_runs["plain"]


@pytest.fixture(scope="session")
def ddp(shared_runs: SharedRuns) -> Run:
    return shared_runs["ddp"]


@pytest.fixture(scope="session")
def failed(shared_runs: SharedRuns) -> Run:
    """Bad training data: exit 2 before the model loads."""
    return shared_runs["failed"]
