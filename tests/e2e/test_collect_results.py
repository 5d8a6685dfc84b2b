"""collect_results on the output dirs of real tiny runs (the shared plain, 2-rank and failed runs): each
figure in the table equals the file the run wrote (read here), a run without a readable record is a row and
not a crash, a job log is no row, and the plots hold the records' numbers. In-process (main(argv)), and once
as users type it.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures.procs import PYTHON, ok, run
from fixtures.runs import Run, read

from qa_hpc.tools.collect_results import NO_RECORD


@pytest.fixture(scope="module")
def tiny_project(project: Path, plain: Run, ddp: Run, failed: Run) -> tuple[Path, dict[str, Run]]:
    return project, {"single": plain.ok(), "ddp": ddp.ok(), "failed": failed}


def collect(capsys, root: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    """python -m qa_hpc.tools.collect_results ARGS in `root`, in-process, exiting with `code`: its stdout and
    stderr."""
    from qa_hpc.tools.collect_results import main

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        got = main(list(args))
    out, err = capsys.readouterr()
    assert got == code, err
    return subprocess.CompletedProcess(args, got, out, err)


def test_the_collector_runs_as_users_type_it(tiny_project):
    root, _ = tiny_project
    proc = run([PYTHON, "-m", "qa_hpc.tools.collect_results", "outputs"], cwd=root, timeout=120)
    ok(proc)
    assert proc.stdout.startswith("| run | job id |") and "qa-tiny-ddp-1002" in proc.stdout


def test_rows_carry_the_figures_the_runs_wrote(tiny_project, capsys):
    root, runs = tiny_project
    out = json.loads(
        collect(capsys, root, "logs", "outputs", "--format", "json", "--baseline", "qa-tiny-1001").stdout
    )
    rows = {r["run"]: r for r in out["runs"]}
    # the failed run stopped at its input checks (exit 2) before writing anything: no output dir, no row; the
    # job logs in logs/ are not read
    assert runs["failed"].returncode == 2 and not runs["failed"].out.exists()
    assert list(rows) == ["qa-tiny-1001", "qa-tiny-ddp-1002"]
    assert out["baseline"] == "qa-tiny-1001" and out["speedup_on"] == "train_runtime"
    for name, layout in (("single", (1, 1)), ("ddp", (1, 2))):
        run = runs[name]
        row = rows[f"{run.job[0]}-{run.job[1]}"]
        record = read(run.out / "run_summary.json")
        train = read(run.out / "train_results.json")
        evaluation = read(run.out / "eval_results.json")
        memory = read(run.out / "memory.json")
        assert row["status"] == "ok" and row["exit_code"] == 0 and row["reason"] is None
        assert row["job_id"] == run.job[1] and row["job_name"] == run.job[0]
        assert (row["nodes"], row["procs_per_node"]) == layout and row["world_size"] == layout[1]
        assert row["device"] == "cpu" and row["precision"] == "fp32"
        assert row["wall_clock_seconds"] == record["wall_clock_seconds"]
        assert abs(row["wall_clock_seconds"] - int(run.kv()["WALL_CLOCK_SECONDS"])) <= 0.51  # the log rounds
        # the record keeps the Trainer's figures unrounded, the results files round to 3 decimals
        assert row["train_runtime"] == pytest.approx(train["train_runtime"], abs=1e-3)
        assert row["train_samples_per_second"] == pytest.approx(train["train_samples_per_second"], rel=1e-3)
        assert row["train_tokens_per_second"] == record["results"]["train_tokens_per_second"] > 0
        assert row["eval_samples_per_second"] == pytest.approx(
            evaluation["eval_samples_per_second"], abs=1e-3
        )
        assert row["exact_match"] == pytest.approx(evaluation["eval_exact_match"], abs=1e-4)
        assert row["f1"] == pytest.approx(evaluation["eval_f1"], abs=1e-4)
        assert row["peak_memory_mb"] == pytest.approx(memory["max_over_ranks"]["cpu_peak_rss_mb"], abs=0.05)
        assert row["peak_memory_source"] == "rss"
        assert row["output_dir"] == str(run.out.resolve()) and row["hostname"] == record["hostname"]
        state = read(run.out / "trainer_state.json")
        assert row["loss_curve"] == [[e["step"], e["loss"]] for e in state["log_history"] if "loss" in e]
    base = read(runs["single"].out / "train_results.json")["train_runtime"]
    ddp = read(runs["ddp"].out / "train_results.json")["train_runtime"]
    assert rows["qa-tiny-1001"]["speedup"] == pytest.approx(1.0)
    assert rows["qa-tiny-ddp-1002"]["speedup"] == pytest.approx(base / ddp, rel=1e-3)


def test_markdown_and_csv(tiny_project, capsys):
    root, runs = tiny_project
    md = collect(capsys, root, "outputs").stdout
    lines = md.splitlines()
    assert lines[0].startswith("| run | job id | nodes×GPUs | device | precision | wall s | train s |")
    for column in ("train samples/s", "eval samples/s", "EM", "F1", "peak memory", "speedup", "status"):
        assert f"| {column} |" in lines[0]
    row = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]] for ln in lines[2:4]}
    assert row["qa-tiny-ddp-1002"][2] == "1×2" and row["qa-tiny-1001"][2] == "1×1"
    assert row["qa-tiny-1001"][12] == "1.00×"  # default baseline: the first successful run
    memory = read(runs["single"].out / "memory.json")["max_over_ranks"]["cpu_peak_rss_mb"]
    assert row["qa-tiny-1001"][11] == f"{memory:,.0f} MB (rss)" and row["qa-tiny-1001"][13] == "ok"
    records = list(csv.DictReader(io.StringIO(collect(capsys, root, "outputs", "--format", "csv").stdout)))
    assert [r["run"] for r in records] == ["qa-tiny-1001", "qa-tiny-ddp-1002"]
    assert float(records[1]["train_runtime"]) == pytest.approx(
        read(runs["ddp"].out / "train_results.json")["train_runtime"], abs=1e-3
    )
    assert records[1]["nodes"] == "1" and records[1]["procs_per_node"] == "2"  # integers, not 1.0
    assert records[1]["reason"] == "" and records[1]["exit_code"] == "0"


def test_plots_draw_the_records_numbers(tiny_project, tmp_path, capsys):
    """--plot's PNGs are tests/e2e/test_report.py's (the same figures); here their numbers are the
    records'."""
    from qa_hpc.tools.collect_results import read_runs
    from qa_hpc.tools.figures import bar_figure

    root, runs = tiny_project
    proc = collect(capsys, root, "outputs", "--plot", str(tmp_path))
    for png in ("loss_curves.png", "throughput.png", "wall_time.png"):
        assert f"PLOT={tmp_path / png}" in proc.stderr and (tmp_path / png).stat().st_size > 5000
    table = read_runs([str(root / "outputs")])[0]
    records = [read(runs[name].out / "run_summary.json") for name in ("single", "ddp")]
    (ax,) = bar_figure(table, "train_samples_per_second", "samples/s").axes
    heights = [bar.get_height() for bar in ax.patches]
    assert heights == pytest.approx([r["results"]["train_samples_per_second"] for r in records])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["qa-tiny-1001", "qa-tiny-ddp-1002"]


def test_a_plot_folder_that_cannot_be_made_stops_before_the_table(tiny_project, tmp_path, capsys):
    """--plot naming a file: one ERROR line, exit 74 (cannot write), and no table printed half-way."""
    root, _ = tiny_project
    taken = tmp_path / "plots"
    taken.write_text("a file")
    proc = collect(capsys, root, "outputs", "--plot", str(taken), code=74)
    assert (
        proc.stdout == ""
        and proc.stderr == f"ERROR: cannot create --plot {taken}: it is a file, not a folder\n"
    )


def test_defaults_missing_fields_and_bad_baseline(tiny_project, tmp_path, capsys):
    root, _ = tiny_project
    # a run still going (or killed) whose record is not written yet, its results file cut off mid-write
    broken = root / "outputs" / "cut-off"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "all_results.json").write_text('{"train_runtime": 1', encoding="utf-8")
    try:
        out = json.loads(collect(capsys, root, "--format", "json").stdout)  # default path: outputs/
        rows = {r["run"]: r for r in out["runs"]}
        assert list(rows) == ["qa-tiny-1001", "qa-tiny-ddp-1002", "cut-off"]
        assert rows["cut-off"]["status"] == "incomplete" and rows["cut-off"]["train_runtime"] is None
        assert rows["cut-off"]["reason"].startswith("no readable run_summary.json")
        assert rows["qa-tiny-1001"]["status"] == "ok"
        assert "matches no run" in collect(capsys, root, "--baseline", "no-such-run", code=2).stderr
        error = collect(capsys, root, "--baseline", "cut-off", code=2).stderr
        assert "--baseline 'cut-off' is cut-off, which ended incomplete without a train_runtime: " in error
        assert "no paths given and no outputs/ here" in collect(capsys, tmp_path, code=2).stderr
        assert "no runs found in logs" in collect(capsys, root, "logs", code=2).stderr  # logs are not runs
    finally:
        (broken / "all_results.json").unlink()
        broken.rmdir()


def test_killed_damaged_and_like_named_runs_are_rows_and_a_wrong_path_or_baseline_stops(
    tiny_project, tmp_path, capsys
):
    """A run killed before any record (only a checkpoint) is an incomplete row, a damaged record names its
    parse error, run folders under a folder named runs/ are found, two local runs of one folder name are told
    apart by their parent; a mistyped path and a baseline that did not end ok stop the tool (exit 2)."""
    _, runs = tiny_project
    parent = tmp_path / "runs"  # a user's folder of outputs may well be called so
    ok_run = shutil.copytree(runs["single"].out, parent / "x" / "out", ignore=shutil.ignore_patterns("runs"))
    damaged = shutil.copytree(ok_run, parent / "y" / "out")
    (damaged / "run_summary.json").write_text('{"status": "ok", "results"', encoding="utf-8")
    killed = parent / "killed" / "checkpoint-3"
    killed.mkdir(parents=True)
    (killed / "trainer_state.json").write_text('{"log_history": [{"loss": 2.5, "step": 1}]}')
    record = json.loads((ok_run / "run_summary.json").read_text())
    record.update(slurm_job_name=None, slurm_job_id=None)  # a local run: named by its folder
    (ok_run / "run_summary.json").write_text(json.dumps(record))
    rows = {
        r["run"]: r
        for r in json.loads(collect(capsys, tmp_path, str(parent), "--format", "json").stdout)["runs"]
    }
    assert sorted(rows) == ["killed", "x/out", "y/out"], rows.keys()
    assert rows["x/out"]["status"] == "ok"
    assert (rows["killed"]["status"], rows["killed"]["reason"]) == ("incomplete", NO_RECORD)
    assert rows["killed"]["loss_curve"] == [[1, 2.5]]  # its checkpoint's
    assert rows["y/out"]["reason"].startswith("run_summary.json cannot be read: Expecting ':' delimiter")
    error = collect(capsys, tmp_path, str(parent), str(tmp_path / "nosuch"), code=2)
    assert error.stdout == "" and error.stderr == f"ERROR: not found: {tmp_path / 'nosuch'}\n"
    failed = collect(capsys, tmp_path, str(parent), "--baseline", "killed", code=2).stderr
    assert "which ended incomplete without a train_runtime" in failed, failed
