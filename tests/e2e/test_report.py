"""The report of real runs (the shared plain run and 2-rank run), read back: every number equals the file it
came from (read here), the figures are PNGs whose curves hold every point of trainer_state.json's log history,
the comparison's speedup and efficiency are the hand-computed ones; a run without a loss or profile still gets
a report; bad input does not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fixtures.procs import PYTHON, ok, run
from fixtures.runs import Run, read

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tables(md: str) -> dict[tuple[str, str | None], dict[str, list[str]]]:
    """(run or "Comparison", section) -> {a row's first cell: its other cells}."""
    found: dict = {}
    run = section = None
    for line in md.splitlines():
        if line.startswith(("## ", "### ")):
            run, section = (line[3:], None) if line.startswith("## ") else (run, line[4:])
        elif line.startswith("| ") and not line.startswith("| --"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            found.setdefault((run, section), {})[cells[0]] = cells[1:]
    return found


def num(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.fixture(scope="module")
def report(plain: Run, ddp: Run, tmp_path_factory) -> tuple[str, Path]:
    """python -m qa_hpc.tools.report PLAIN DDP --out DIR, as users type it."""
    out = tmp_path_factory.mktemp("report")
    proc = run([PYTHON, "-m", "qa_hpc.tools.report", plain.ok().out, ddp.ok().out, "--out", out], timeout=300)
    ok(proc)
    assert f"REPORT={out / 'report.md'}" in proc.stderr, proc.stderr
    return (out / "report.md").read_text(encoding="utf-8"), out


@pytest.mark.parametrize("name", ["plain", "ddp"])
def test_every_number_is_the_records(report, name, request):
    md, _ = report
    run: Run = request.getfixturevalue(name)
    record, memory = read(run.out / "run_summary.json"), read(run.out / "memory.json")
    train, evaluation = read(run.out / "train_results.json"), read(run.out / "eval_results.json")
    losses = [e["loss"] for e in read(run.out / "trainer_state.json")["log_history"] if "loss" in e]
    got = tables(md)
    title = f"{run.job[0]}-{run.job[1]}"
    section = lambda s: {k: v[0] for k, v in got[(title, s)].items()}  # noqa: E731
    expect = {
        "Training": {
            "runtime s": record["results"]["train_runtime"],
            "mean loss": train["train_loss"],
            "samples/s": record["results"]["train_samples_per_second"],
            "final loss": losses[-1],
            "real tokens/s": record["results"]["train_tokens_per_second"],
            "achieved TFLOP/s": record["results"]["train_achieved_tflops"],
        },
        "Evaluation": {
            "exact match": evaluation["eval_exact_match"],
            "F1": evaluation["eval_f1"],
            "runtime s": evaluation["eval_runtime"],
            "questions": evaluation["eval_examples"],
            "postprocess s": evaluation["eval_postprocess_seconds"],
        },
        "Memory (MB)": {
            "CPU peak RSS": memory["max_over_ranks"]["cpu_peak_rss_mb"],
            "estimate": memory["estimate"]["total_mb"],
        },
    }
    for title_, figures in expect.items():
        for label, value in figures.items():
            assert num(section(title_)[label]) == pytest.approx(value, rel=5e-3, abs=5e-5), (title_, label)
    assert "MFU (achieved / peak)" not in section("Training")  # a CPU has no peak: the row is left out
    params, env = section("Parameters"), section("Environment")
    batch, world = (8, 1) if name == "plain" else (4, 2)  # per device x world size x accumulation 1
    assert (params["batch per device"], params["world size"], params["global batch"]) == (
        str(batch),
        str(world),
        "8",
    )
    assert env["host"] == record["hostname"] and env["torch"] == record["torch_version"]
    assert env["CPU model"] == record["cpu_model"] and env["CPU flags"] == ", ".join(record["cpu_flags"])
    assert (
        env["datasets"] == record["datasets_version"] and env["driver"] == env["GPU"] == "n/a"
    )  # null on a CPU
    assert env["processes"] == str(world)
    assert f"**ok**, exit code 0, wall clock {record['wall_clock_seconds']:,.2f} s" in md
    summary = (run.out / "profiler" / "profiler_summary.txt").read_text(encoding="utf-8").splitlines()
    first_op = summary[summary.index(next(ln for ln in summary if ln.startswith("---"))) + 3]
    assert first_op in md  # the table's top operation, as written


def test_the_comparison_is_computed_by_hand(report, plain, ddp):
    md, out = report
    rows = tables(md)[("Comparison", None)]
    header = rows.pop("run")
    base, two = (read(run.out / "train_results.json")["train_runtime"] for run in (plain, ddp))
    cells = {run: dict(zip(header, cells)) for run, cells in rows.items()}
    assert list(cells) == ["qa-tiny-1001", "qa-tiny-ddp-1002"]  # RUN_DIR order: the first is the baseline
    assert num(cells["qa-tiny-1001"]["speedup"]) == num(cells["qa-tiny-1001"]["efficiency"]) == 1.0
    assert num(cells["qa-tiny-ddp-1002"]["speedup"]) == pytest.approx(base / two, rel=5e-3)
    assert num(cells["qa-tiny-ddp-1002"]["efficiency"]) == pytest.approx(base / two / 2, rel=5e-3)
    assert cells["qa-tiny-ddp-1002"]["world size"] == "2" and cells["qa-tiny-ddp-1002"]["global batch"] == "8"
    # the two runs train on different data with different learning rates: the warning says so, and only that
    warning = next(line for line in md.splitlines() if line.startswith("**Warning"))
    assert "dataset (" in warning and "learning rate (" in warning and "global batch" not in warning
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 5 and "<table>" in html  # self-contained


def test_figures_are_pngs_holding_every_logged_point(report, plain, ddp):
    """The training curves are trainer_state.json's log history, every point (the Trainer restores it when a
    run resumes, so it spans launches), and the evaluations during training where there were any."""
    import matplotlib.image

    from qa_hpc.tools.collect_results import read_runs
    from qa_hpc.tools.figures import CURVES, curves_figure, loss_figure

    md, out = report
    for png in (
        "loss_curves.png",
        "throughput.png",
        "wall_time.png",
        "run1_training.png",
        "run2_training.png",
    ):
        assert f"({png})" in md and (out / png).read_bytes()[:8] == PNG_MAGIC
        assert matplotlib.image.imread(str(out / png)).std() > 0.05, png  # not blank
    for shared_run in (plain, ddp):
        history = read(shared_run.out / "trainer_state.json")["log_history"]
        axes = curves_figure(history, "run").axes
        for ax, (key, _) in zip(axes, CURVES):
            logged = [(e["step"], e[key]) for e in history if key in e]
            drawn = [list(zip(line.get_xdata(), line.get_ydata())) for line in ax.get_lines()]
            assert drawn == ([logged] if logged else []), key
    evaluations = [e for e in read(ddp.out / "trainer_state.json")["log_history"] if "eval_f1" in e]
    assert len(evaluations) >= 2  # --eval_strategy steps: the F1 curve has points
    table = read_runs([str(plain.out), str(ddp.out)])[0]
    for line, shared_run in zip(loss_figure(table).axes[0].get_lines(), (plain, ddp)):
        history = read(shared_run.out / "trainer_state.json")["log_history"]
        assert list(line.get_ydata()) == [e["loss"] for e in history if "loss" in e]


def test_curves_need_no_event_files_and_a_run_without_loss_or_profile_says_so(plain, tmp_path, capsys):
    from qa_hpc.tools.report import main

    # no event files, no profile, no checkpoints (whose trainer_state.json would stand in for the run's)
    leave_out = shutil.ignore_patterns("runs", "profiler", "checkpoint-*")
    run = shutil.copytree(plain.ok().out, tmp_path / "run", ignore=leave_out)
    # a copied run's profile is looked for in the copy (where a run moved off scratch keeps it), not at
    # the path its record was written with (the plain run's, which has one)
    record = read(run / "run_summary.json")
    del record["driver_version"]  # a record from before the field existed
    (run / "run_summary.json").write_text(json.dumps(record), encoding="utf-8")
    assert main([str(run), "--out", str(tmp_path / "report")]) == 0, capsys.readouterr().err
    md = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "![training curves of qa-tiny-1001](run1_training.png)" in md  # no TensorBoard events needed
    assert f"Profiled, but there is no `{run / 'profiler' / 'profiler_summary.txt'}`." in md
    assert "## Comparison" not in md and "| exact match |" in md and "| driver | n/a |" in md
    (run / "trainer_state.json").unlink()  # an evaluation-only run logs no loss
    assert main([str(run), "--out", str(tmp_path / "report")]) == 0, capsys.readouterr().err
    md = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert f"No training loss in `{run / 'trainer_state.json'}`: no training curves." in md


def test_a_failed_run_in_the_comparison_has_n_a_figures(plain, tmp_path, capsys):
    from qa_hpc.tools.report import main

    failed = shutil.copytree(
        plain.ok().out, tmp_path / "failed", ignore=shutil.ignore_patterns("runs", "profiler")
    )
    record = read(
        failed / "run_summary.json"
    )  # out of memory in its first step: no results, a plan but no EFFECTIVE
    record.update(
        status="failed",
        exit_code=3,
        error="OutOfMemory: ...",
        results={},
        effective=None,
        slurm_job_id="1009",
    )
    del record["plan"]["world_size"]
    (failed / "run_summary.json").write_text(json.dumps(record), encoding="utf-8")
    assert main([str(plain.out), str(failed), "--out", str(tmp_path / "report")]) == 0, (
        capsys.readouterr().err
    )
    rows = tables((tmp_path / "report" / "report.md").read_text(encoding="utf-8"))[("Comparison", None)]
    cells = dict(zip(rows.pop("run"), rows["qa-tiny-1009"]))
    assert [cells[key] for key in ("train s", "world size", "speedup", "efficiency", "EM")] == ["n/a"] * 5, (
        cells
    )


def test_bad_input_is_one_line_naming_dir_and_file(plain, tmp_path, capsys):
    """A run folder that is no run's or one given twice (exit 2), an --out that cannot be made (exit 74): one
    line each."""
    from qa_hpc.tools.report import main

    older, cut, empty = tmp_path / "older", tmp_path / "cut", tmp_path / "empty"
    for path in (older, cut, empty):
        path.mkdir()
    (older / "all_results.json").write_text('{"eval_f1": 1.0}', encoding="utf-8")
    (cut / "run_summary.json").write_text(json.dumps({"status": "ok", "results": {}}), encoding="utf-8")
    broken = shutil.copytree(plain.ok().out, tmp_path / "broken", ignore=shutil.ignore_patterns("runs"))
    (broken / "run_summary.json").write_text('{"status": "ok", "results"', encoding="utf-8")
    cases = {
        str(tmp_path / "nowhere"): "not found",
        str(older / "all_results.json"): "not a directory",
        str(empty): "no run_summary.json (not a run's output dir",
        str(older): "no run_summary.json, only all_results.json (an older layout",
        str(cut): "run_summary.json has no params, plan (an older layout)",
        str(broken): "run_summary.json cannot be read: Expecting ':' delimiter: line 1 column 27",
    }
    for path, message in cases.items():
        assert main([str(plain.out), path, "--out", str(tmp_path / "report")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"ERROR: {path}: {message}") and err.count("\n") == 1, err
    assert main([str(plain.out), f"{plain.out}/", "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"ERROR: {plain.out}: one run given more than once ({plain.out}, {plain.out}/); a run "
        "compared with itself says nothing\n"
    ), err
    assert not (tmp_path / "report").exists()  # nothing written
    taken = tmp_path / "report.md"
    taken.write_text("a file")
    assert main([str(plain.out), "--out", str(taken)]) == 74
    assert capsys.readouterr().err == f"ERROR: cannot create --out {taken}: it is a file, not a folder\n"


def test_the_baseline_ended_ok_and_is_found_by_its_folder(plain, tmp_path, capsys):
    """The default baseline is the first RUN_DIR: one that did not end ok stops the report (exit 2) rather
    than blank every speedup; --baseline DIR finds the run by its path, where two runs' folders share a name,
    and the two are told apart by their parents."""
    from qa_hpc.tools.report import main

    first, second = (
        shutil.copytree(plain.ok().out, tmp_path / side / "out", ignore=shutil.ignore_patterns("runs"))
        for side in ("x", "y")
    )
    for out in (first, second):  # local runs: labelled by their folders
        record = read(out / "run_summary.json")
        record.update(slurm_job_name=None, slurm_job_id=None)
        (out / "run_summary.json").write_text(json.dumps(record), encoding="utf-8")
    assert main([str(first), str(second), "--baseline", str(second), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    assert md.startswith("# Run report: x/out vs y/out") and "Baseline y/out." in md, md[:500]
    record = read(first / "run_summary.json")
    record.update(status="preempted", results={})
    (first / "run_summary.json").write_text(json.dumps(record), encoding="utf-8")
    capsys.readouterr()
    assert main([str(first), str(second), "--out", str(tmp_path / "r2")]) == 2
    assert capsys.readouterr().err == (
        f"ERROR: the baseline, the first RUN_DIR {first}, is x/out, which ended preempted without a "
        "train_runtime: the runs are compared with one that ended ok with its train_runtime; name one with "
        "--baseline\n"
    )
    assert not (tmp_path / "r2").exists()
