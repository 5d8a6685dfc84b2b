"""collect_results on a checkout's logs/ and outputs/ after Slurm jobs that failed, were preempted or were
killed, and runs outside Slurm: one row per run, the record winning over its log. The records come from the
real writer (qa_hpc.record.write_run_summary); the collector runs in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def collect(capsys, root: Path, *args: str) -> str:
    from qa_hpc.tools.collect_results import main

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def rows_of(capsys, root: Path, *args: str) -> dict[str, dict]:
    return {r["run"]: r for r in json.loads(collect(capsys, root, *args, "--format", "json"))["runs"]}


def write_record(out_dir: Path, monkeypatch, job: tuple[str, str] | None, **fields) -> dict:
    """A record as run_qa.py writes one, through the real writer, under (job name, job id) or outside Slurm."""
    from qa_hpc.record import write_run_summary

    for key, value in zip(("SLURM_JOB_NAME", "SLURM_JOB_ID"), job or (None, None)):
        if value:
            monkeypatch.setenv(key, value)
        else:
            monkeypatch.delenv(key, raising=False)
    out_dir.mkdir(parents=True)
    world, per_node = fields.pop("layout", (1, 1))
    return write_run_summary(
        str(out_dir / "run_summary.json"), params={"world_size": world, "precision": "bf16"},
        plan={"device": "cuda", "precision": "bf16", "world_size": world, "local_world_size": per_node},
        effective={"precision": "bf16", "world_size": world, "device": "cuda", "device_name": "NVIDIA H100"},
        **fields)


@pytest.fixture
def jobs(tmp_path, monkeypatch, capsys) -> dict:
    """A checkout's logs/ and outputs/ after Slurm jobs that failed, were preempted or killed, and local runs."""
    logs, outputs = tmp_path / "logs", tmp_path / "outputs"
    logs.mkdir()
    oom = write_record(outputs / "bert_squad_ddp", monkeypatch, ("bert_squad_ddp", "77"), status="failed",
                       exit_code=3, wall_clock_seconds=180.0, results={}, layout=(8, 4),
                       error="OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    (logs / "bert_squad_ddp-77.out").write_text(
        "[qa-hpc 10:00:00] JOB name=bert_squad_ddp id=77 nodes=gpu[01-02] restart_count=0\n"
        "ERROR: rank 3 (pid 99) failed: RuntimeError: a peer went away\n", encoding="utf-8")
    # an earlier job of the same name: the job scripts reuse outputs/<job name>, so its record is gone
    (logs / "bert_squad_ddp-76.out").write_text("[qa-hpc 09:00:00] JOB name=bert_squad_ddp id=76\n", encoding="utf-8")
    stopped = {"signal": "SIGUSR1", "global_step": 40, "checkpoint": "outputs/bert_squad_ft3/checkpoint-40"}
    write_record(outputs / "bert_squad_ft3", monkeypatch, ("bert_squad_ft3", "78"), status="preempted",
                 exit_code=75, wall_clock_seconds=3500.0, results={}, stopped=stopped)
    # killed by the cgroup OOM killer before it could write a record: no ERROR line either
    (logs / "bert_squad_ft3-79.out").write_text(
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=79.batch.\n", encoding="utf-8")
    # stopped by the job script itself (bad QA_PRECISION) after run_qa.py's own complaint
    (logs / "bert_squad_cpu-80.out").write_text(
        "ERROR: --per_device_train_batch_size must be >= 1\n"
        "[qa-hpc 10:00:02] ERROR: QA_PRECISION=fp8: use auto, bf16, fp16 or fp32\n", encoding="utf-8")
    # `bash job_cpu.sh` twice outside Slurm: the newer log belongs to the record in outputs/bert_squad_cpu
    local = write_record(outputs / "bert_squad_cpu", monkeypatch, None, status="ok", exit_code=0,
                         wall_clock_seconds=95.5, results={"train_runtime": 80.25, "eval_f1": 12.5})
    for stamp in ("20260101-090000", "20260102-090000"):
        (logs / f"bert_squad_cpu-local-{stamp}.out").write_text("[qa-hpc 09:00:00] JOB name=local\n", encoding="utf-8")
    # outside Slurm, the demo's dir of a killed run (no record), run again with a bad flag: the log says why
    (outputs / "offline_demo-bert_squad_gpu").mkdir()
    (outputs / "offline_demo-bert_squad_gpu" / "trainer_state.json").write_text('{"log_history": []}', encoding="utf-8")
    (logs / "bert_squad_gpu-local-20260103-090000.out").write_text("ERROR: --num_train_epochs must be > 0\n",
                                                                   encoding="utf-8")
    return {"root": tmp_path, "logs": logs.resolve(), "outputs": outputs.resolve(), "oom": oom, "stopped": stopped,
            "local": local, "rows": rows_of(capsys, tmp_path, "logs", "outputs")}


def test_a_slurm_log_and_its_record_are_one_row(jobs, capsys):
    """The record wins over its log; a log without a record says why (its last ERROR line, or none)."""
    rows, logs, oom = jobs["rows"], jobs["logs"], jobs["oom"]
    assert set(rows) == {"bert_squad_ddp-76", "bert_squad_ddp-77", "bert_squad_ft3-78", "bert_squad_ft3-79",
                         "bert_squad_cpu-80", "bert_squad_cpu", "bert_squad_cpu-local-20260101-090000",
                         "bert_squad_gpu"}
    row = rows["bert_squad_ddp-77"]
    assert row["status"] == "failed" and row["exit_code"] == oom["exit_code"] == 3
    assert row["reason"] == f"exit code 3: {oom['error']}"  # the record's error, not the log's
    assert (row["nodes"], row["procs_per_node"], row["world_size"]) == (2, 4, 8)
    assert row["device"] == "NVIDIA H100" and row["precision"] == "bf16" and row["wall_clock_seconds"] == 180.0
    assert row["logs"] == [str(logs / "bert_squad_ddp-77.out")]
    row = rows["bert_squad_ddp-76"]
    assert row["status"] == "incomplete" and f"{jobs['outputs']}/bert_squad_ddp holds the record of job 77" in row[
        "reason"]
    row = rows["bert_squad_ft3-78"]
    assert row["status"] == "preempted" and row["exit_code"] == 75 and row["speedup"] is None
    assert "step 40" in row["reason"] and jobs["stopped"]["checkpoint"] in row["reason"]
    assert rows["bert_squad_ft3-79"]["status"] == "incomplete" and rows["bert_squad_ft3-79"]["output_dir"] is None
    row = rows["bert_squad_cpu-80"]
    assert row["status"] == "failed" and row["exit_code"] is None and row["output_dir"] is None
    assert row["reason"] == "QA_PRECISION=fp8: use auto, bf16, fp16 or fp32"  # the last ERROR line
    md = collect(capsys, jobs["root"], "logs", "outputs")
    assert "| bert_squad_ddp-77 | 77 | 2×4 | NVIDIA H100 | bf16 | 180 |" in md
    assert "PREEMPTED: SIGUSR1 at step 40" in md


def test_runs_outside_slurm_pair_by_job_name(jobs):
    """A `<name>-local-<time>.out` log pairs with the record without a job id in outputs/<name>: the newest wins."""
    rows, logs = jobs["rows"], jobs["logs"]
    row = rows["bert_squad_cpu"]
    assert row["status"] == "ok" and row["job_id"] is None and row["speedup"] == 1.0  # the only ok run: baseline
    assert (row["train_runtime"], row["f1"]) == (80.25, 12.5)
    assert row["wall_clock_seconds"] == jobs["local"]["wall_clock_seconds"]
    assert row["logs"] == [str(logs / "bert_squad_cpu-local-20260102-090000.out")]
    assert rows["bert_squad_cpu-local-20260101-090000"]["status"] == "incomplete"
    row = rows["bert_squad_gpu"]
    assert row["status"] == "failed" and row["reason"] == "--num_train_epochs must be > 0"
    assert row["output_dir"] == str(jobs["outputs"] / "offline_demo-bert_squad_gpu")
