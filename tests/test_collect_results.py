"""collect_results.py on the logs and output dirs of real tiny runs (one failed) as a user has them.

Each figure in the table is compared with the file the run wrote (train_results.json,
eval_results.json, memory.json, the log's KEY=value lines); the speedup is recomputed
here; the failed run, an empty log and an unreadable results file are rows, not crashes;
the plots are real PNGs with something drawn on them.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from observe_runs import ok_run, project_dir, tiny_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_bert, demo_files):
    runs = {name: ok_run(name, tmp_path_factory, tiny_bert, demo_files) for name in ("single", "ddp")}
    runs["failed"] = tiny_run("failed", tmp_path_factory, tiny_bert, demo_files)
    root = project_dir(tmp_path_factory)
    return root, runs


def collect(root, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "qa_hpc.tools.collect_results", *args], cwd=root,
                          capture_output=True, text=True, timeout=120)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def _json(path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_failed_run_really_failed(project):
    _, runs = project
    failed = runs["failed"]
    assert failed.returncode == 2 and "ERROR:" in failed.text and "WALL_CLOCK_SECONDS" not in failed.text


def test_rows_carry_the_figures_the_runs_wrote(project):
    root, runs = project
    out = json.loads(collect(root, "logs", "outputs", "--format", "json", "--baseline", "qa-tiny-1001").stdout)
    rows = {r["run"]: r for r in out["runs"]}
    assert list(rows) == ["qa-tiny-1001", "qa-tiny-ddp-1002", "qa-tiny-bad-1003"]
    assert out["baseline"] == "qa-tiny-1001" and out["speedup_on"] == "train_runtime"
    for name, layout in (("single", (1, 1)), ("ddp", (1, 2))):
        run = runs[name]
        row = rows[f"{run.job_name}-{run.job_id}"]
        train = _json(run.out_dir / "train_results.json")
        evaluation = _json(run.out_dir / "eval_results.json")
        memory = _json(run.out_dir / "memory.json")
        assert row["status"] == "ok" and row["job_id"] == run.job_id and row["job_name"] == run.job_name
        assert (row["nodes"], row["procs_per_node"]) == layout and row["world_size"] == layout[1]
        assert row["device"] == "cpu" and row["precision"] == "fp32"
        assert row["wall_clock_seconds"] == float(run.kv()["WALL_CLOCK_SECONDS"])
        # the log prints 4 decimals (samples/s from the unrounded runtime), the results files the Trainer's 3
        assert row["train_runtime"] == pytest.approx(train["train_runtime"], abs=1e-3)
        assert row["train_samples_per_second"] == pytest.approx(train["train_samples_per_second"], rel=1e-3)
        assert row["eval_samples_per_second"] == pytest.approx(evaluation["eval_samples_per_second"], abs=1e-3)
        assert row["exact_match"] == pytest.approx(evaluation["eval_exact_match"], abs=1e-4)
        assert row["f1"] == pytest.approx(evaluation["eval_f1"], abs=1e-4)
        assert row["peak_memory_mb"] == pytest.approx(memory["max_over_ranks"]["cpu_peak_rss_mb"], abs=0.05)
        assert row["peak_memory_source"] == "rss"
        assert row["output_dir"] == str(run.out_dir.resolve())
        state = _json(run.out_dir / "trainer_state.json")
        assert row["loss_curve"] == [[e["step"], e["loss"]] for e in state["log_history"] if "loss" in e]
    base = _json(runs["single"].out_dir / "train_results.json")["train_runtime"]
    ddp = _json(runs["ddp"].out_dir / "train_results.json")["train_runtime"]
    assert rows["qa-tiny-1001"]["speedup"] == pytest.approx(1.0)
    assert rows["qa-tiny-ddp-1002"]["speedup"] == pytest.approx(base / ddp, rel=1e-3)
    bad = rows["qa-tiny-bad-1003"]
    assert bad["status"] == "failed" and "answer_start" in bad["reason"]
    for key in ("wall_clock_seconds", "train_runtime", "exact_match", "f1", "speedup"):
        assert bad[key] is None, key


def test_markdown_and_csv(project):
    root, runs = project
    md = collect(root, "logs", "outputs").stdout
    lines = md.splitlines()
    assert lines[0].startswith("| run | job id | nodes×GPUs | device | precision | wall s | train s |")
    for column in ("train samples/s", "eval samples/s", "EM", "F1", "peak memory", "speedup", "status"):
        assert f"| {column} |" in lines[0]
    row = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]] for ln in lines[2:5]}
    assert row["qa-tiny-ddp-1002"][2] == "1×2" and row["qa-tiny-1001"][2] == "1×1"
    assert row["qa-tiny-1001"][12] == "1.00×"  # default baseline: the first successful run
    assert row["qa-tiny-bad-1003"][13].startswith("FAILED: ") and row["qa-tiny-bad-1003"][5] == "n/a"
    records = list(csv.DictReader(io.StringIO(collect(root, "logs", "outputs", "--format", "csv").stdout)))
    assert [r["run"] for r in records] == ["qa-tiny-1001", "qa-tiny-ddp-1002", "qa-tiny-bad-1003"]
    assert float(records[1]["train_runtime"]) == pytest.approx(
        _json(runs["ddp"].out_dir / "train_results.json")["train_runtime"], abs=1e-3)
    assert records[2]["status"] == "failed" and records[2]["train_runtime"] == ""


def test_plots_are_real_pngs(project, tmp_path):
    import matplotlib.image

    root, _ = project
    proc = collect(root, "logs", "outputs", "--plot", str(tmp_path / "plots"))
    for name in ("loss_curves.png", "throughput.png", "wall_time.png"):
        path = tmp_path / "plots" / name
        assert f"PLOT={path}" in proc.stderr
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
        pixels = matplotlib.image.imread(str(path))
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400 and pixels.std() > 0.05  # not a blank image


def test_defaults_missing_fields_and_bad_baseline(project, tmp_path):
    root, _ = project
    # a job that has not written anything yet, and a results file cut off mid-write
    (root / "logs" / "qa-tiny-pending-1004.out").write_text("", encoding="utf-8")
    broken = root / "outputs" / "cut-off"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "all_results.json").write_text('{"train_runtime": 1', encoding="utf-8")
    try:
        out = json.loads(collect(root, "--format", "json").stdout)  # default paths: logs/ outputs/
        rows = {r["run"]: r for r in out["runs"]}
        assert rows["qa-tiny-pending-1004"]["status"] == "incomplete"
        assert rows["cut-off"]["status"] == "incomplete" and rows["cut-off"]["train_runtime"] is None
        assert rows["qa-tiny-1001"]["status"] == "ok"
        proc = collect(root, "--baseline", "no-such-run", ok=False)
        assert proc.returncode == 2 and "matches no run" in proc.stderr
        proc = collect(tmp_path, ok=False)
        assert proc.returncode == 2 and "no paths given" in proc.stderr
    finally:
        (root / "logs" / "qa-tiny-pending-1004.out").unlink()
        (broken / "all_results.json").unlink()
        broken.rmdir()


def test_slurm_job_script_log_with_exit_code(tmp_path):
    """A log in the shape the job scripts write: context line, run output cut off, exit code."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "bert_squad_ddp-77.out").write_text(
        "[qa-hpc 10:00:00] JOB name=bert_squad_ddp id=77 nodes=gpu[01-02] restart_count=0\n"
        "[qa-hpc 10:00:01] DDP nodes=2 nproc_per_node=4 world_size=8 backend=nccl\n"
        "10:00:05 [rank0] INFO run_qa: DISTRIBUTED world_size=8 rank=0 parallel_mode=distributed backend=nccl "
        "device=cuda:0\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "[qa-hpc 10:03:00] EXIT_CODE=3\n"
        "[qa-hpc 10:03:00] JOB_WALL_CLOCK_SECONDS=180 JOB_EXIT_CODE=3\n",
        encoding="utf-8",
    )
    out = json.loads(collect(tmp_path, "logs", "--format", "json").stdout)
    (row,) = out["runs"]
    assert row["run"] == "bert_squad_ddp-77" and row["nodes"] == 2 and row["world_size"] == 8
    assert row["procs_per_node"] == 4 and row["status"] == "failed" and row["exit_code"] == 3
    assert "CUDA out of memory" in row["reason"]
    # the cgroup OOM killer, as slurmstepd reports it, on a run that left no traceback
    (logs / "bert_squad_ft3-78.out").write_text(
        "[qa-hpc 10:00:00] JOB name=bert_squad_ft3 id=78 nodes=gpu03 restart_count=0\n"
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=78.batch. Some of your processes may have "
        "been killed by the cgroup out-of-memory handler.\n", encoding="utf-8")
    rows = {r["run"]: r for r in json.loads(collect(tmp_path, "logs", "--format", "json").stdout)["runs"]}
    assert rows["bert_squad_ft3-78"]["status"] == "failed" and "oom-kill" in rows["bert_squad_ft3-78"]["reason"]
