"""collect_results.py on the logs and output dirs of real tiny runs (one failed), and on records.

Each figure in the table is compared with the files the run wrote, read here: its record
(run_summary.json), train_results.json, eval_results.json, memory.json, trainer_state.json;
the speedup is recomputed here. The failed run (no record: it stopped while checking its
data) is a row from its log's last ERROR line; an empty log and a cut-off results file are
rows, not crashes. Records of failed, preempted and non-Slurm runs come from the real
writer, qa_hpc.record.write_run_summary. The plots are real PNGs of the expected size, and
their figures hold the records' numbers.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

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
    proc = subprocess.run([sys.executable, "-m", "qa_hpc.tools.collect_results", *args], check=False, cwd=root,
                          capture_output=True, text=True, timeout=120)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def rows_of(root, *args: str) -> dict[str, dict]:
    return {r["run"]: r for r in json.loads(collect(root, *args, "--format", "json").stdout)["runs"]}


def _json(path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_failed_run_really_failed(project):
    _, runs = project
    failed = runs["failed"]
    assert failed.returncode == 2 and "ERROR:" in failed.text and "WALL_CLOCK_SECONDS" not in failed.text
    assert not (failed.out_dir / "run_summary.json").exists()  # so its row can only come from its log


def test_rows_carry_the_figures_the_runs_wrote(project):
    root, runs = project
    out = json.loads(collect(root, "logs", "outputs", "--format", "json", "--baseline", "qa-tiny-1001").stdout)
    rows = {r["run"]: r for r in out["runs"]}
    assert list(rows) == ["qa-tiny-1001", "qa-tiny-ddp-1002", "qa-tiny-bad-1003"]
    assert out["baseline"] == "qa-tiny-1001" and out["speedup_on"] == "train_runtime"
    for name, layout in (("single", (1, 1)), ("ddp", (1, 2))):
        run = runs[name]
        row = rows[f"{run.job_name}-{run.job_id}"]
        record = _json(run.out_dir / "run_summary.json")
        train = _json(run.out_dir / "train_results.json")
        evaluation = _json(run.out_dir / "eval_results.json")
        memory = _json(run.out_dir / "memory.json")
        assert row["status"] == "ok" and row["exit_code"] == 0 and row["reason"] is None
        assert row["job_id"] == run.job_id and row["job_name"] == run.job_name
        assert (row["nodes"], row["procs_per_node"]) == layout and row["world_size"] == layout[1]
        assert row["device"] == "cpu" and row["precision"] == "fp32"
        assert row["wall_clock_seconds"] == record["wall_clock_seconds"]
        assert abs(row["wall_clock_seconds"] - int(run.kv()["WALL_CLOCK_SECONDS"])) <= 0.51  # the log rounds
        # the record keeps the Trainer's figures unrounded, the results files round to 3 decimals
        assert row["train_runtime"] == pytest.approx(train["train_runtime"], abs=1e-3)
        assert row["train_samples_per_second"] == pytest.approx(train["train_samples_per_second"], rel=1e-3)
        assert row["train_tokens_per_second"] == record["results"]["train_tokens_per_second"] > 0
        assert row["eval_samples_per_second"] == pytest.approx(evaluation["eval_samples_per_second"], abs=1e-3)
        assert row["exact_match"] == pytest.approx(evaluation["eval_exact_match"], abs=1e-4)
        assert row["f1"] == pytest.approx(evaluation["eval_f1"], abs=1e-4)
        assert row["peak_memory_mb"] == pytest.approx(memory["max_over_ranks"]["cpu_peak_rss_mb"], abs=0.05)
        assert row["peak_memory_source"] == "rss"
        assert row["output_dir"] == str(run.out_dir.resolve()) and row["logs"] == [str(run.log.resolve())]
        state = _json(run.out_dir / "trainer_state.json")
        assert row["loss_curve"] == [[e["step"], e["loss"]] for e in state["log_history"] if "loss" in e]
    base = _json(runs["single"].out_dir / "train_results.json")["train_runtime"]
    ddp = _json(runs["ddp"].out_dir / "train_results.json")["train_runtime"]
    assert rows["qa-tiny-1001"]["speedup"] == pytest.approx(1.0)
    assert rows["qa-tiny-ddp-1002"]["speedup"] == pytest.approx(base / ddp, rel=1e-3)
    bad = rows["qa-tiny-bad-1003"]
    last_error = [ln for ln in runs["failed"].text.splitlines() if ln.startswith("ERROR: ")][-1]
    assert bad["status"] == "failed" and bad["reason"] == last_error.removeprefix("ERROR: ").strip()
    assert "answer_start" in bad["reason"] and bad["logs"] == [str(runs["failed"].log.resolve())]
    for key in ("wall_clock_seconds", "train_runtime", "exact_match", "f1", "speedup", "exit_code", "output_dir"):
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
    memory = _json(runs["single"].out_dir / "memory.json")["max_over_ranks"]["cpu_peak_rss_mb"]
    assert row["qa-tiny-1001"][11] == f"{memory:,.0f} MB (rss)"
    assert row["qa-tiny-bad-1003"][13].startswith("FAILED: ") and row["qa-tiny-bad-1003"][5] == "n/a"
    assert row["qa-tiny-bad-1003"][3] == "n/a" and len(row["qa-tiny-bad-1003"][13]) <= len("FAILED: ") + 100
    records = list(csv.DictReader(io.StringIO(collect(root, "logs", "outputs", "--format", "csv").stdout)))
    assert [r["run"] for r in records] == ["qa-tiny-1001", "qa-tiny-ddp-1002", "qa-tiny-bad-1003"]
    assert float(records[1]["train_runtime"]) == pytest.approx(
        _json(runs["ddp"].out_dir / "train_results.json")["train_runtime"], abs=1e-3)
    assert records[1]["nodes"] == "1" and records[1]["procs_per_node"] == "2"  # integers, not 1.0
    assert records[2]["status"] == "failed" and records[2]["train_runtime"] == "" and records[2]["nodes"] == ""


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
        assert pixels.shape[:2] == (400, 700) and pixels.std() > 0.05  # 7 x 4 in at 100 dpi; not a blank image


def test_plots_draw_the_records_numbers(project):
    from qa_hpc.tools.collect_results import bar_figure, loss_figure, read_runs

    root, runs = project
    table = read_runs([str(root / "logs"), str(root / "outputs")])[0]
    records = [_json(runs[name].out_dir / "run_summary.json") for name in ("single", "ddp")]
    (ax,) = bar_figure(table, "train_samples_per_second", "samples/s").axes
    heights = [bar.get_height() for bar in ax.patches]
    assert heights == pytest.approx([r["results"]["train_samples_per_second"] for r in records] + [0.0])
    assert [bar.get_facecolor() == ax.patches[0].get_facecolor() for bar in ax.patches] == [True, True, False]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["qa-tiny-1001", "qa-tiny-ddp-1002", "qa-tiny-bad-1003"]
    (ax,) = bar_figure(table, "wall_clock_seconds", "s").axes
    assert [b.get_height() for b in ax.patches][:2] == pytest.approx([r["wall_clock_seconds"] for r in records])
    (ax,) = loss_figure(table).axes
    assert [line.get_label() for line in ax.get_lines()] == ["qa-tiny-1001", "qa-tiny-ddp-1002"]
    for line, name in zip(ax.get_lines(), ("single", "ddp")):
        history = _json(runs[name].out_dir / "trainer_state.json")["log_history"]
        assert list(line.get_ydata()) == [e["loss"] for e in history if "loss" in e]


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
        assert "no run_summary.json" in rows["qa-tiny-pending-1004"]["reason"]
        assert rows["cut-off"]["status"] == "incomplete" and rows["cut-off"]["train_runtime"] is None
        assert rows["qa-tiny-1001"]["status"] == "ok"
        proc = collect(root, "--baseline", "no-such-run", ok=False)
        assert proc.returncode == 2 and "matches no run" in proc.stderr
        proc = collect(root, "--baseline", "qa-tiny-bad-1003", ok=False)
        assert proc.returncode == 2 and "has no train_runtime" in proc.stderr
        proc = collect(tmp_path, ok=False)
        assert proc.returncode == 2 and "no paths given" in proc.stderr
    finally:
        (root / "logs" / "qa-tiny-pending-1004.out").unlink()
        (broken / "all_results.json").unlink()
        broken.rmdir()


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
def jobs(tmp_path, monkeypatch) -> dict:
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
            "local": local, "rows": rows_of(tmp_path, "logs", "outputs")}


def test_a_slurm_log_and_its_record_are_one_row(jobs):
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
    md = collect(jobs["root"], "logs", "outputs").stdout
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
