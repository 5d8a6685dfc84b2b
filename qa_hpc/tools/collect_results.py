#!/usr/bin/env python
"""One row per run from the runs' records: where runs went, how fast, how good, how big.

    python -m qa_hpc.tools.collect_results                          # ./outputs/ (run from the checkout)
    python -m qa_hpc.tools.collect_results outputs/ --baseline bert_squad_ft3 --format csv > runs.csv
    python -m qa_hpc.tools.collect_results outputs/ --plot plots/  # loss_curves, throughput, wall_time .png

The one reader of run records (qa_hpc.tools.report builds on it): every figure comes from
<output_dir>/run_summary.json (qa_hpc.record.RunRecord), the loss curve from trainer_state.json. An output dir
without a readable record is a run still going, or killed before its end: status incomplete (what Slurm did
to a job, time limit or out of memory, is what `sacct -j ID -o State,ExitCode` says).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from qa_hpc.atomic_io import read_json_object
from qa_hpc.errors import EXIT_IOERR, OutputError, check_writable_dir
from qa_hpc.outputs import (
    ALL_RESULTS_FILE,
    CHECKPOINT_PREFIX,
    LAUNCH_MARK,
    MEMORY_FILE,
    SUMMARY_FILE,
    TRAINER_STATE_FILE,
    checkpoints_oldest_first,
)
from qa_hpc.record import Memory, RunRecord, Status, Stopped
from qa_hpc.tools.figures import NA, write_plots

# Files only a run's output dir holds: a dir with any of them is a run, with or without a record.
OUTPUT_MARKERS = (SUMMARY_FILE, ALL_RESULTS_FILE, TRAINER_STATE_FILE, MEMORY_FILE)
# never searched (a run dir's own runs/ and profiler/ are not: the search stops at the run dir)
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "hf_cache", "wandb"}
# The columns of the table (and of --format csv/json, speedup last, SOURCES left out) and their types, each
# filled by run_row(): integers stay integers where a run lacks one (1, not 1.0)
COLUMNS = {
    "run": "string",
    "job_name": "string",
    "job_id": "string",
    "status": "string",
    "reason": "string",
    "exit_code": "Int64",
    "nodes": "Int64",
    "procs_per_node": "Int64",
    "world_size": "Int64",
    "device": "string",
    "precision": "string",
    "wall_clock_seconds": "float64",
    "train_runtime": "float64",
    "resumed_from_step": "Int64",
    "train_samples_per_second": "float64",
    "train_tokens_per_second": "float64",
    "train_mfu": "float64",
    "eval_samples_per_second": "float64",
    "exact_match": "float64",
    "f1": "float64",
    "peak_memory_mb": "float64",
    "peak_memory_source": "string",
    "hostname": "string",
    "timestamp": "string",
    "output_dir": "string",
    "loss_curve": "object",
    "record": "object",
    "log_history": "object",
}
# What a row was read from, for the report to show more of: no figure of the table's, in no --format.
SOURCES = ["record", "log_history"]
# figure -> how its speedup compares
SPEEDUP_ON = {
    "train_runtime": "time",
    "wall_clock_seconds": "time",
    "train_samples_per_second": "rate",
    "train_tokens_per_second": "rate",
}
NO_RECORD = f"no readable {SUMMARY_FILE} (still running, or killed before it could write one)"


def find_output_dirs(paths: list[str]) -> tuple[list[Path], list[str]]:
    """The output dirs under `paths` (a run_summary.json given as a file: its dir), and the paths not
    found."""
    dirs: set[Path] = set()
    missing = [raw for raw in paths if not Path(raw).exists()]
    for path in (Path(raw).resolve() for raw in paths if raw not in missing):
        if path.is_file() and path.name == SUMMARY_FILE:
            dirs.add(path.parent)
        for here, subdirs, _ in os.walk(path):  # nothing for a file
            # checkpoints hold trainer_state.json too, but belong to the run above them: a run killed before
            # its end may have nothing else
            checkpoints = [d for d in subdirs if d.startswith(CHECKPOINT_PREFIX)]
            if checkpoints or any((Path(here) / marker).is_file() for marker in OUTPUT_MARKERS):
                dirs.add(Path(here))
                subdirs.clear()
                continue
            subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS)
    return sorted(dirs), missing


def read_log_history(out_dir: Path, record: RunRecord | None) -> list[dict[str, Any]]:
    """trainer_state.json's log_history (every launch's: the Trainer restores it when it resumes), or, for a
    run that stopped before writing it, the newest checkpoint's that is readable (a job killed while saving
    leaves one without); [] without any. Where the folder's record (`record`, None: none readable) does not
    say training ended, a
    trainer_state.json older than the folder's last training launch (LAUNCH_MARK) is an earlier run's: one
    that launch replaced (--overwrite_output_dir leaves it) or resumed, and then stopped before it wrote its
    own. (A run whose record says it trained to the end wrote its own: its file is taken whatever its time,
    which a copy of the folder may have changed.)"""
    newest_first = [*map(Path, reversed(checkpoints_oldest_first(out_dir)))]
    if (record is not None and record.trained_to_the_end) or not _older_than_last_launch(
        out_dir / TRAINER_STATE_FILE, out_dir / LAUNCH_MARK
    ):
        newest_first.insert(0, out_dir)
    for folder in newest_first:
        try:
            history = read_json_object(folder / TRAINER_STATE_FILE).get("log_history")
        except (OSError, ValueError):
            continue
        return history if isinstance(history, list) else []
    return []


def _older_than_last_launch(path: Path, mark: Path) -> bool:
    try:
        return path.stat().st_mtime < mark.stat().st_mtime
    except OSError:  # either missing: a run of an older version, or one that never trained
        return False


def first_recorded(*values: Any) -> Any:
    """The first of the values a record holds (records of older versions or other setups lack some)."""
    return next((value for value in values if value is not None), None)


def read_record(out_dir: Path) -> tuple[RunRecord | None, str | None]:
    """The run's record, or None and why not: none written yet, or one that cannot be read (records are
    written whole, so that is damage, not a run still going)."""
    try:
        return RunRecord.read(out_dir / SUMMARY_FILE), None
    except FileNotFoundError:
        return None, NO_RECORD
    except (OSError, ValueError) as err:
        return None, f"{SUMMARY_FILE} cannot be read: {err}"


def reason(record: RunRecord | None, unreadable: str | None) -> str | None:
    """Why a run did not end ok, in one line: its error, where it stopped, or why it has no record."""
    if record is None:
        return unreadable
    if record.status == Status.FAILED:
        return f"exit code {record.exit_code}: {record.error or 'no error recorded'}"
    if record.status == Status.PREEMPTED:
        stop = record.stopped or Stopped()
        return f"{stop.signal} at step {stop.global_step}; resumes from {stop.checkpoint}"
    return None


def run_row(out_dir: Path) -> dict[str, Any]:
    """One output dir's row of COLUMNS, from its record; status incomplete where it has no readable one."""
    record, unreadable = read_record(out_dir)
    shown = record or RunRecord.from_json({})  # no record: every figure missing
    env = shown.environment
    plan = shown.plan
    effective = shown.effective
    results = shown.results
    memory = shown.memory or Memory()
    world_size = first_recorded(effective.world_size, plan.world_size)
    per_node = plan.local_world_size
    nodes = None
    if world_size and per_node:
        nodes = -(-world_size // per_node)
    job = None
    if env.slurm_job_name and env.slurm_job_id:
        job = f"{env.slurm_job_name}-{env.slurm_job_id}"
    source = None
    if memory.measured_peak_mb is not None:
        source = "cuda" if memory.max_over_ranks.cuda_peak_allocated_mb else "rss"
    history = read_log_history(out_dir, record)
    return {
        "run": job or out_dir.name,
        "job_name": env.slurm_job_name,
        "job_id": env.slurm_job_id,
        "status": (shown.status or "unknown") if record else Status.INCOMPLETE,
        "reason": reason(record, unreadable),
        "exit_code": shown.exit_code,
        "nodes": nodes,
        "procs_per_node": per_node,
        "world_size": world_size,
        "device": first_recorded(effective.device_name, plan.device),
        "precision": first_recorded(effective.precision, plan.precision),
        "wall_clock_seconds": shown.wall_clock_seconds,
        "train_runtime": results.train_runtime,
        "resumed_from_step": results.train_resumed_from_step,
        "train_samples_per_second": results.train_samples_per_second,
        "train_tokens_per_second": results.train_tokens_per_second,
        "train_mfu": results.train_mfu,
        "eval_samples_per_second": results.eval_samples_per_second,
        # the evaluation's (SQuAD v1's name, else v2's); a run that only predicted on answered questions: the
        # prediction's
        "exact_match": first_recorded(
            results.eval_exact_match, results.eval_exact, results.predict_exact_match, results.predict_exact
        ),
        "f1": first_recorded(results.eval_f1, results.predict_f1),
        "peak_memory_mb": memory.measured_peak_mb,
        "peak_memory_source": source,
        "hostname": env.hostname,
        "timestamp": shown.timestamp,
        "output_dir": str(out_dir),
        "loss_curve": [[e["step"], e["loss"]] for e in history if "loss" in e and "step" in e],
        "record": record,
        "log_history": history,
    }


def read_runs(paths: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """The one reader of run records: a table with one row per output dir under `paths` (sorted by job id),
    and warnings."""
    dirs, missing = find_output_dirs(paths)
    table = pd.DataFrame([run_row(out_dir) for out_dir in dirs], columns=list(COLUMNS))
    numbers = [column for column, kind in COLUMNS.items() if kind in ("Int64", "float64")]
    # a figure a record holds as anything but a number reads as missing
    table[numbers] = table[numbers].apply(pd.to_numeric, errors="coerce")
    table = table.astype(COLUMNS)
    # numeric job ids in order, then the rest (local runs) by name
    ids = table["job_id"].fillna("")
    keys = pd.DataFrame({"n": pd.to_numeric(ids.str.extract(r"^(\d+)")[0]), "id": ids, "run": table["run"]})
    table = table.loc[keys.sort_values(["n", "id", "run"], kind="stable").index].reset_index(drop=True)
    by_job = (table["job_name"].notna() & table["job_id"].notna()).tolist()
    table["run"] = told_apart(table["run"].tolist(), table["output_dir"].tolist(), by_job)
    return table, [f"not found: {p}" for p in missing]


def told_apart(labels: list[str], dirs: list[str], by_job: list[bool]) -> list[str]:
    """The runs' labels, none shared: each that two runs share gets their folders' paths, from the end, one
    part more until it is theirs alone. A run labelled by its folder takes the parent's too (x/out, y/out);
    one labelled by its Slurm job, the folder's (runs of one job, a sweep: sweep-42/bs8, sweep-42/bs16)."""
    told = list(labels)
    for depth in range(1, max((len(Path(d).parts) for d in dirs), default=0) + 1):
        shared = {label for label, count in Counter(told).items() if count > 1}
        if not shared:
            break
        for i, label in enumerate(told):
            if label not in shared:
                continue
            parts = Path(dirs[i]).parts
            if by_job[i]:
                told[i] = f"{labels[i]}/{'/'.join(parts[-depth:])}"
            else:
                told[i] = "/".join(parts[-depth - 1 :])
    return told


def resumed_runs(table: pd.DataFrame) -> pd.Series:
    """The rows whose last launch resumed from a checkpoint: their times are that launch's alone."""
    return table["resumed_from_step"].fillna(0).gt(0)


def compared(table: pd.DataFrame, metric: str) -> pd.Series:
    """The rows a speedup on `metric` compares: those that ended ok with the figure, and for a time, only runs
    whose last launch trained every step (a resumed launch's times cover its own steps alone; its rates
    count the steps it trained; an evaluation-only launch's wall clock is no training's)."""
    rows = table["status"].eq(Status.OK) & table[metric].gt(0)
    if SPEEDUP_ON[metric] == "time":
        rows &= ~resumed_runs(table) & table["train_runtime"].gt(0)
    return rows


def pick_baseline(table: pd.DataFrame, baseline: str | None, metric: str) -> tuple[int | None, str | None]:
    """The index of the baseline row (named, or the first row compared on the figure), or an error
    message."""
    if not baseline:
        usable = table.index[compared(table, metric)]
        return (int(usable[0]) if len(usable) else None), None
    names = table[["run", "job_name", "job_id"]].astype("string")
    names["dir"] = table["output_dir"].map(lambda d: Path(d).name, na_action="ignore")
    matches = table.index[names.eq(baseline).any(axis=1)]
    if not len(matches):
        return None, f"--baseline {baseline!r} matches no run ({', '.join(table['run'])})"
    if len(matches) > 1:
        return None, f"--baseline {baseline!r} matches several runs ({', '.join(table.loc[matches, 'run'])})"
    return usable_baseline(table, int(matches[0]), f"--baseline {baseline!r}", metric)


def usable_baseline(table: pd.DataFrame, base: int, named: str, metric: str) -> tuple[int | None, str | None]:
    """base, or why the runs cannot be compared with it: it must have ended ok, with the figure, and for a
    time, have trained every step in its last launch (not resumed, not evaluation only)."""
    row = table.loc[base]
    if compared(table, metric).at[base]:
        return base, None
    if row["status"] == Status.OK and row[metric] > 0:  # a time, of a launch that trained not every step
        if not row["train_runtime"] > 0:
            return None, (
                f"{named} is {row['run']}, whose last launch trained nothing (no train_runtime): its "
                f"{metric} is no training's; name a run that trained every step with --baseline"
            )
        return None, (
            f"{named} is {row['run']}, whose last launch resumed from step {row['resumed_from_step']}: its "
            f"{metric} covers that launch alone; name a run that trained every step with --baseline"
        )
    without = "" if row[metric] > 0 else f" without a {metric}"
    return None, (
        f"{named} is {row['run']}, which ended {row['status']}{without}: the runs are compared with one that "
        f"ended ok with its {metric}; name one with --baseline"
    )


def add_speedup(table: pd.DataFrame, base: int | None, metric: str) -> pd.DataFrame:
    """A speedup column: baseline/run for times, run/baseline for rates; only the rows compared get one."""
    values = table[metric].where(compared(table, metric))
    reference = float("nan") if base is None else table.at[base, metric]
    return table.assign(speedup=reference / values if SPEEDUP_ON[metric] == "time" else values / reference)


def to_markdown(table: pd.DataFrame, base: int | None, metric: str) -> str:
    """A GitHub markdown table and what its speedup and memory columns mean."""
    t = table.astype({"nodes": "string", "procs_per_node": "string", "reason": "string", "status": "string"})

    def fixed(column: str, spec: Any) -> pd.Series:  # spec: a format string or a function
        return t[column].map(getattr(spec, "format", spec), na_action="ignore").astype("string")

    def big(value: float) -> str:  # times and throughputs: 0.01 to 100,000
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:,.0f}"

    reason = t["reason"].where(t["reason"].str.len() <= 100, t["reason"].str[:97] + "...")  # whole: csv/json
    resumed = resumed_runs(table)
    status = t["status"].where(
        t["status"].eq(Status.OK), t["status"].str.upper() + (": " + reason).fillna("")
    )
    status = status.where(~resumed, status + ", resumed from step " + t["resumed_from_step"].astype("string"))
    cells = (
        pd.DataFrame(
            {
                "run": t["run"],
                "job id": t["job_id"],
                "nodes×GPUs": t["nodes"] + "×" + t["procs_per_node"],
                "device": t["device"],
                "precision": t["precision"],
                "wall s": fixed("wall_clock_seconds", "{:.0f}"),
                **{
                    title: fixed(column, big)
                    for title, column in (
                        ("train s", "train_runtime"),
                        ("train samples/s", "train_samples_per_second"),
                        ("eval samples/s", "eval_samples_per_second"),
                    )
                },
                "EM": fixed("exact_match", "{:.2f}"),
                "F1": fixed("f1", "{:.2f}"),
                "peak memory": fixed("peak_memory_mb", "{:,.0f}")
                + " MB ("
                + t["peak_memory_source"].astype("string")
                + ")",
                "speedup": fixed("speedup", "{:.2f}×"),
                "status": status,
            }
        )
        .astype("string")
        .fillna(NA)
    )
    notes = []
    if base is not None:
        name = table.at[base, "run"]
        if SPEEDUP_ON[metric] == "time":
            notes.append(f"speedup: {metric} of {name} / each run's")
        else:
            notes.append(f"speedup: each run's {metric} / {name}'s")
        if SPEEDUP_ON[metric] == "time" and resumed.any():
            notes.append(
                f"a resumed run's {metric} is its last launch's alone: no speedup; "
                "--speedup_on train_samples_per_second compares it"
            )
    return "\n".join(
        [
            md_table(cells),
            "",
            *notes,
            "peak memory: cuda = CUDA peak allocated (max over ranks); rss = CPU peak RSS",
            "",
        ]
    )


def md_table(cells: pd.DataFrame) -> str:
    """A GitHub markdown table of text cells: unpadded (diff-friendly), no tabulate (pandas' to_markdown needs
    it)."""
    # a | would split the cell
    cells = cells.astype("string").fillna(NA).map(lambda text: text.replace("|", "/"))
    lines = ["| " + " | ".join(cells.columns) + " |", "|" + "|".join("---" for _ in cells.columns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)])


def to_json(table: pd.DataFrame, base: int | None, metric: str) -> str:
    """Every column but the SOURCES (their files are beside), loss curves included; missing figures are
    null."""
    table = table.drop(columns=SOURCES)
    plain = table.astype(object).where(table.notna(), None)  # NaN and pd.NA are not JSON
    return (
        json.dumps(
            {
                "baseline": table.at[base, "run"] if base is not None else None,
                "speedup_on": metric,
                "runs": plain.to_dict(orient="records"),
            },
            indent=2,
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qa_hpc.tools.collect_results",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="*", help="output dirs and dirs of output dirs (default: outputs/)")
    parser.add_argument(
        "--baseline",
        help="run label, job name or job id the speedup is relative to (default: the first successful run)",
    )
    parser.add_argument(
        "--speedup_on",
        default="train_runtime",
        choices=sorted(SPEEDUP_ON),
        help="figure the speedup compares (default: train_runtime): baseline/run for times, "
        "run/baseline for rates; only runs that ended ok get one",
    )
    parser.add_argument("--format", default="md", choices=["md", "csv", "json"])
    parser.add_argument(
        "--plot", metavar="DIR", help="write loss_curves.png, throughput.png, wall_time.png here"
    )
    args = parser.parse_args(argv)
    paths = args.paths or [p for p in ("outputs",) if os.path.exists(p)]
    if not paths:
        print("ERROR: no paths given and no outputs/ here", file=sys.stderr)
        return 2
    table, missing = read_runs(paths)
    if missing:  # a mistyped path: a table without that run would pass for the whole one
        print(f"ERROR: {'; '.join(missing)}", file=sys.stderr)
        return 2
    if table.empty:
        markers = ", ".join(OUTPUT_MARKERS)
        print(f"ERROR: no runs found in {' '.join(paths)} (looked for dirs with {markers})", file=sys.stderr)
        return 2
    base, error = pick_baseline(table, args.baseline, args.speedup_on)
    if error:
        print(f"ERROR: {error}", file=sys.stderr)
        return 2
    if args.plot:  # before the table is printed: nothing half-done
        try:
            check_writable_dir(args.plot, "--plot")
        except OutputError as err:
            print(f"ERROR: {err}", file=sys.stderr)
            return EXIT_IOERR
    table = add_speedup(table, base, args.speedup_on)
    if args.format == "md":
        sys.stdout.write(to_markdown(table, base, args.speedup_on))
    elif args.format == "csv":
        flat = table.drop(columns=["loss_curve", *SOURCES])
        sys.stdout.write(flat.to_csv(index=False, lineterminator="\n"))
    else:
        sys.stdout.write(to_json(table, base, args.speedup_on))
    if args.plot:
        for path in write_plots(table, args.plot):
            print(f"PLOT={path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
