"""Real tiny runs of run_qa.py shared by the observability tests, each run once per session.

A "project" folder in the session's temp dir holds what a cluster user would have:
logs/<job name>-<job id>.out (stdout+stderr of the run, as SLURM writes it) and
outputs/<job name>/. The SLURM job name and id are given through the environment
variables SLURM sets, so run_summary.json records them as it would under SLURM.

- single: one process, 9 steps, logging every 3, profiler keeping global steps 3-4
- ddp:    torchrun with 2 ranks (gloo), 5 steps, logging every 5, profiler keeping step 2
- failed: a train file with a wrong answer_start: the run stops with exit code 2
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO
from fixtures.procs import offline_env

TIMEOUT = 400
COMMON = [
    "--do_train", "--do_eval", "--max_seq_length", "128", "--doc_stride", "32",
    "--per_device_train_batch_size", "8", "--num_train_epochs", "1",
    "--max_train_samples", "8", "--max_eval_samples", "4", "--seed", "0",
]
JOBS = {
    # name: (job name, job id, processes, extra flags)
    "single": ("qa-tiny", "1001", 1, [
        "--logging_steps", "3", "--profile", "--profile_wait", "1", "--profile_warmup", "1",
        "--profile_active", "2", "--profile_memory", "--profile_record_shapes",
    ]),
    "ddp": ("qa-tiny-ddp", "1002", 2, [
        "--logging_steps", "5", "--profile", "--profile_wait", "0", "--profile_warmup", "1", "--profile_active", "1",
    ]),
    "failed": ("qa-tiny-bad", "1003", 1, ["--logging_steps", "3"]),
}

_CACHE: dict[str, "TinyRun"] = {}


@dataclass
class TinyRun:
    name: str
    job_name: str
    job_id: str
    nproc: int
    project: Path
    out_dir: Path
    log: Path
    returncode: int

    @property
    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def kv(self) -> dict[str, str]:
        """The KEY=value lines the run printed (whole lines only)."""
        pairs = {}
        for line in self.text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.isidentifier() and " " not in key:
                pairs[key] = value.strip()
        return pairs


def _env(job_name: str, job_id: str) -> dict[str, str]:
    return offline_env(SLURM_JOB_ID=job_id, SLURM_JOB_NAME=job_name, ACCELERATE_USE_CPU=None)


def _broken_train_file(good: Path, dest: Path) -> Path:
    """The demo train file with the first answer's answer_start moved off its text."""
    data = json.loads(good.read_text(encoding="utf-8"))
    answer = data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]
    answer["answer_start"] += 3
    dest.write_text(json.dumps(data), encoding="utf-8")
    return dest


def project_dir(tmp_path_factory) -> Path:
    if "_project" not in _CACHE:
        _CACHE["_project"] = tmp_path_factory.mktemp("observe_project")  # type: ignore[assignment]
    return _CACHE["_project"]  # type: ignore[return-value]


def tiny_run(name: str, tmp_path_factory, tiny_bert: Path, demo_files: dict[str, Path]) -> TinyRun:
    """Run job `name` of JOBS once per session (real processes) and return where its files are."""
    if name in _CACHE:
        return _CACHE[name]
    job_name, job_id, nproc, extra = JOBS[name]
    project = project_dir(tmp_path_factory)
    (project / "logs").mkdir(exist_ok=True)
    out_dir = project / "outputs" / job_name
    log = project / "logs" / f"{job_name}-{job_id}.out"
    train = demo_files["train"]
    if name == "failed":
        train = _broken_train_file(train, project / "broken_train.json")
    args = [str(REPO / "run_qa.py"), "--model_name_or_path", str(tiny_bert), "--train_file", str(train),
            "--validation_file", str(demo_files["validation"]), "--output_dir", str(out_dir), *COMMON, *extra]
    launcher = [sys.executable]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.run(launcher + args, cwd=project, env=_env(job_name, job_id), stdout=fh,
                              stderr=subprocess.STDOUT, timeout=TIMEOUT)
    run = TinyRun(name, job_name, job_id, nproc, project, out_dir, log, proc.returncode)
    _CACHE[name] = run
    return run


def ok_run(name: str, tmp_path_factory, tiny_bert: Path, demo_files: dict[str, Path]) -> TinyRun:
    """tiny_run that must have succeeded (fails the test with the log's tail otherwise)."""
    run = tiny_run(name, tmp_path_factory, tiny_bert, demo_files)
    assert run.returncode == 0, f"{name} run failed (exit {run.returncode}):\n{run.text[-4000:]}"
    return run
