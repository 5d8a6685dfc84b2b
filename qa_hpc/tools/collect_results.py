#!/usr/bin/env python
"""One row per run from the runs' records: where runs went, how fast, how good, how big.

    python -m qa_hpc.tools.collect_results                          # logs/ and outputs/ of the checkout
    python -m qa_hpc.tools.collect_results logs/ outputs/ --baseline bert_squad_ft3 --format csv > runs.csv
    python -m qa_hpc.tools.collect_results logs/ outputs/ --plot plots/  # loss_curves, throughput, wall_time .png

The one reader of run records (qa_hpc.tools.report builds on it): figures come from <output_dir>/run_summary.json
(with memory.json), the loss curve from trainer_state.json. A job log (`name-jobid.out`) pairs with its record by
job id; a log without one shows a run that failed (its last `ERROR:` line says why) or is incomplete.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from qa_hpc.record import SUMMARY_FILE

LOG_SUFFIXES = (".out", ".err", ".log")
# Files only a run's output dir holds: a dir with any of them is a run, with or without a record.
OUTPUT_MARKERS = (SUMMARY_FILE, "all_results.json", "trainer_state.json", "memory.json")
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "runs", "profiler", "hf_cache", "wandb"}
# run_qa.py's own words (cli) and the job scripts' (qa_die, with a "[qa-hpc HH:MM:SS] " prefix)
ERROR_LINE = re.compile(r"^(?:\[qa-hpc [0-9:]+\] )?ERROR: (.+?)\s*$", re.MULTILINE)
# A log's file name: the job scripts' own outside Slurm (`name-local-<time>`), sbatch's (`name-1234`,
# `slurm-1234`, arrays `1234_5`), or any other name (a job name without id).
LOG_NAME = r"^(?:(?P<local>.*)-local-[0-9-]+|(?P<named>.*?)[-_.](?P<job_id>\d+(?:_\d+)?))$"
# The columns of the table (and of --format csv/json, speedup last), figure -> how its speedup compares.
COLUMNS = (
    "run",
    "job_name",
    "job_id",
    "status",
    "reason",
    "exit_code",
    "nodes",
    "procs_per_node",
    "world_size",
    "device",
    "precision",
    "wall_clock_seconds",
    "train_runtime",
    "train_samples_per_second",
    "train_tokens_per_second",
    "train_mfu",
    "eval_samples_per_second",
    "exact_match",
    "f1",
    "peak_memory_mb",
    "peak_memory_source",
    "hostname",
    "timestamp",
    "output_dir",
    "logs",
    "loss_curve",
    "record",
)  # record: run_summary.json as read ({} when unreadable), what qa_hpc.tools.report shows
INTEGERS, FLOATS = (
    COLUMNS[5:9],
    COLUMNS[11:20],
)  # exit_code .. world_size; wall_clock_seconds .. peak_memory_mb
SPEEDUP_ON = {
    "train_runtime": "time",
    "wall_clock_seconds": "time",
    "train_samples_per_second": "rate",
    "train_tokens_per_second": "rate",
}
# column -> the record's fields it comes from (pd.json_normalize's dotted names), the first one set wins
FROM_RECORD = {
    "job_name": ["slurm_job_name"],
    "job_id": ["slurm_job_id"],
    "status": ["status"],
    "exit_code": ["exit_code"],
    "procs_per_node": ["plan.local_world_size"],
    "world_size": ["effective.world_size", "plan.world_size"],
    "device": ["effective.device_name", "plan.device"],
    "precision": ["effective.precision", "plan.precision"],
    "wall_clock_seconds": ["wall_clock_seconds"],
    **{key: [f"results.{key}"] for key in COLUMNS[12:17]},
    "exact_match": ["results.eval_exact_match", "results.eval_exact"],  # SQuAD v1's name, else v2's
    "f1": ["results.eval_f1"],
    "peak_memory_mb": ["memory.measured_peak_mb"],
    "hostname": ["hostname"],
    "timestamp": ["timestamp"],
    "cuda_peak": ["memory.max_over_ranks.cuda_peak_allocated_mb"],
    "error": ["error"],
    "signal": ["stopped.signal"],
    "step": ["stopped.global_step"],
    "checkpoint": ["stopped.checkpoint"],
}
NA = "n/a"
NO_RECORD = f"no {SUMMARY_FILE} of this job: still running, or killed (time limit, out of memory, scancel)"


def _find(paths: list[str]) -> tuple[dict[str, list[Path]], list[Path], list[str]]:
    """Job logs grouped by stem (`x.out` + `x.err` are one job), output dirs, and paths not found."""
    logs: dict[str, list[Path]] = {}
    dirs: set[Path] = set()
    missing = [raw for raw in paths if not Path(raw).exists()]
    for path in (Path(raw).resolve() for raw in paths if raw not in missing):
        if path.is_file() and path.name == SUMMARY_FILE:
            dirs.add(path.parent)
        elif path.is_file():
            logs.setdefault(str(path.with_suffix("")), []).append(path)
        for here, subdirs, files in os.walk(path):  # nothing for a file
            if any((Path(here) / marker).is_file() for marker in OUTPUT_MARKERS):
                dirs.add(Path(here))
                subdirs.clear()
                continue
            # checkpoints hold trainer_state.json too, but belong to the run above them
            subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.startswith("checkpoint-"))
            for file in (Path(here, name).resolve() for name in sorted(files) if name.endswith(LOG_SUFFIXES)):
                logs.setdefault(str(file.with_suffix("")), []).append(file)
    return logs, sorted(dirs), missing


def _read_json(path: Path) -> Any:
    """The parsed file, or None when it is missing or cut off mid-write (json: records may hold NaN)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if path.name == SUMMARY_FILE and isinstance(record, dict) and isinstance(record.get("memory"), dict):
        record["memory"] = {
            **(_read_json(path.with_name("memory.json")) or {}),
            **record["memory"],
        }  # + estimate
    return record


def _last_error(files: list[Path]) -> str | None:
    """The last `ERROR: ...` line of a job's log files (the reason a run without a record gives)."""
    errors: list[str] = []
    for file in files:
        try:
            errors += ERROR_LINE.findall(file.read_text(encoding="utf-8", errors="replace"))
        except OSError as err:
            errors.append(f"cannot read {file}: {err}")
    return errors[-1] if errors else None


def _loss_curve(out_dir: Path) -> list[list[float]]:
    """[step, loss] from trainer_state.json, or the newest checkpoint's for a run that stopped early."""
    state = _read_json(out_dir / "trainer_state.json")
    if state is None:
        steps = [
            int(p.name.split("-")[1]) for p in out_dir.glob("checkpoint-*") if p.name.split("-")[1].isdigit()
        ]
        state = _read_json(out_dir / f"checkpoint-{max(steps)}" / "trainer_state.json") if steps else None
    return [
        [e["step"], e["loss"]] for e in (state or {}).get("log_history", []) if "loss" in e and "step" in e
    ]


def _records(dirs: list[Path]) -> pd.DataFrame:
    """One row per output dir from its record; status incomplete where it has no readable record."""
    records = [_read_json(d / SUMMARY_FILE) for d in dirs]
    readable = pd.Series([isinstance(record, dict) for record in records], dtype=bool)
    # integers stay integers (convert_dtypes), so that a reason reads "step 40", not "step 40.0"
    flat = pd.json_normalize([r if readable[i] else {} for i, r in enumerate(records)]).convert_dtypes()
    flat = flat.reindex(columns=flat.columns.union([f for fields in FROM_RECORD.values() for f in fields]))
    r = pd.DataFrame(
        {column: flat[fields].bfill(axis=1).iloc[:, 0] for column, fields in FROM_RECORD.items()}
    )
    r = r.astype({"job_name": "string", "job_id": "string", "error": "string"})  # joined into text below
    text = r.astype("string").fillna("None")  # a missing field, as the record's own f-string would print it
    status = r["status"].fillna("unknown").where(readable, "incomplete")
    dir_names = pd.Series([d.name for d in dirs], dtype="string")
    reason = pd.Series(pd.NA, index=r.index, dtype="string").case_when(
        [
            (
                status.eq("failed"),
                "exit code " + text["exit_code"] + ": " + r["error"].fillna("no error recorded"),
            ),
            (
                status.eq("preempted"),
                text["signal"] + " at step " + text["step"] + "; resumes from " + text["checkpoint"],
            ),
            (~readable, f"no readable {SUMMARY_FILE} (still running, or killed before it could write one)"),
        ]
    )
    return r.assign(
        run=(r["job_name"] + "-" + r["job_id"]).fillna(dir_names),
        status=status,
        reason=reason,
        nodes=-(-r["world_size"] // r["procs_per_node"]),
        peak_memory_source=r["cuda_peak"]
        .fillna(0)
        .ne(0)
        .map({True: "cuda", False: "rss"})
        .where(r["peak_memory_mb"].notna()),
        output_dir=pd.Series([str(d) for d in dirs], dtype="string"),
        dir=dir_names,
        logs=[[] for _ in dirs],
        loss_curve=[_loss_curve(d) for d in dirs],
        record=[r if ok else {} for r, ok in zip(records, readable)],
    )[[*COLUMNS, "dir"]]


def _logs(found: dict[str, list[Path]]) -> pd.DataFrame:
    """One row per job log: job name and id from its file name, its files, its last ERROR line."""
    stems = sorted(found)
    names = pd.Series([Path(stem).name for stem in stems], dtype="string")
    parts = names.str.extract(LOG_NAME)
    # sbatch's default name `slurm-<id>` names no job; a name without an id is a job name
    job_name = parts["local"].fillna(
        parts["named"].replace("slurm", pd.NA).where(parts["job_id"].notna(), names)
    )
    logs = pd.DataFrame(
        {
            "run": names,
            "job_id": parts["job_id"],
            "job_name": job_name,
            "logs": [[str(f) for f in found[stem]] for stem in stems],
            "error": pd.Series([_last_error(found[stem]) for stem in stems], dtype="string"),
        }
    )
    # logs with a job id first; then the rest newest first (their names end in the start time), so that
    # the newest claims the output dir its job name's runs share
    return pd.concat([logs[logs["job_id"].notna()], logs[logs["job_id"].isna()][::-1]], ignore_index=True)


def read_runs(paths: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """The one reader of run records: a table with one row per run under `paths`, and warnings.

    Rows are sorted by job id. A job log and its record are one row, and the record wins.
    """
    found, dirs, missing = _find(paths)
    records, logs = _records(dirs), _logs(found)
    # a Slurm job's log pairs with the record of its job id (the first log of an id claims it)
    pairs = (
        logs.reset_index()
        .dropna(subset="job_id")
        .drop_duplicates("job_id")
        .merge(
            records.reset_index().dropna(subset="job_id").drop_duplicates("job_id", keep="last"),
            on="job_id",
            suffixes=("_log", ""),
        )
    )
    claims = dict(zip(pairs["index"], pairs["index_log"]))  # record row -> log row
    for at, name in logs.loc[
        logs["job_id"].isna(), "job_name"
    ].items():  # outside Slurm: outputs/[<mode>-]<name>
        free = records.index[
            records["job_id"].isna()
            & ~records.index.isin(list(claims))
            & (records["dir"].eq(name) | records["dir"].str.endswith(f"-{name}"))
        ]
        if len(free):
            claims[free[0]] = at
    runs = records.assign(log=pd.Series(claims, dtype="Int64")).merge(
        logs, how="left", left_on="log", right_index=True, suffixes=("", "_log")
    )
    told = runs["status"].eq("incomplete") & runs["error"].notna()  # no record: the log says why
    unnamed = runs["job_name"].isna() & runs["log"].notna()  # outside Slurm: the log's file names the job
    runs = runs.assign(
        logs=runs["logs_log"].combine_first(runs["logs"]),
        run=runs["run"].mask(unnamed, runs["job_name_log"]),
        job_name=runs["job_name"].mask(unnamed, runs["job_name_log"]),
        status=runs["status"].mask(told, "failed"),
        reason=runs["reason"].mask(told, runs["error"]),
    )
    # a log no record belongs to: failed (its last ERROR line says why), or incomplete; job scripts reuse
    # outputs/<job name>, so another job of the same name may have overwritten the record
    alone = logs.drop(index=list(claims.values()))
    other = alone.reset_index().merge(records.dropna(subset="job_id"), on="job_name", suffixes=("", "_rec"))
    other = (
        other[other["job_id"].ne(other["job_id_rec"]).fillna(True)]
        .drop_duplicates("index")
        .set_index("index")
    )
    note = ("; " + other["output_dir"] + " holds the record of job " + other["job_id_rec"]).reindex(
        alone.index
    )
    alone = alone.assign(
        status=alone["error"].notna().map({True: "failed", False: "incomplete"}),
        reason=alone["error"].fillna(NO_RECORD + note.fillna("")),
        loss_curve=[[] for _ in alone.index],
        record=[{} for _ in alone.index],
    )
    table = pd.concat([alone, runs], ignore_index=True).reindex(columns=list(COLUMNS))
    # numeric job ids in order, then the rest (local runs) by name
    ids = table["job_id"].fillna("")
    keys = pd.DataFrame({"n": pd.to_numeric(ids.str.extract(r"^(\d+)")[0]), "id": ids, "run": table["run"]})
    table = table.loc[keys.sort_values(["n", "id", "run"], kind="stable").index].reset_index(drop=True)
    # a figure a record holds as anything but a number reads as missing; nullable integers keep 1, not 1.0
    table[list(FLOATS)] = table[list(FLOATS)].apply(pd.to_numeric, errors="coerce").astype(float)
    return table.astype({key: "Int64" for key in INTEGERS}), [f"not found: {p}" for p in missing]


def pick_baseline(table: pd.DataFrame, baseline: str | None, metric: str) -> tuple[int | None, str | None]:
    """The index of the baseline row (named, or the first ok row with the figure), or an error message."""
    if not baseline:
        usable = table.index[table["status"].eq("ok") & table[metric].gt(0)]
        return (int(usable[0]) if len(usable) else None), None
    names = table[["run", "job_name", "job_id"]].astype("string")
    names["dir"] = table["output_dir"].map(lambda d: Path(d).name, na_action="ignore")
    matches = table.index[names.eq(baseline).any(axis=1)]
    if len(matches) != 1:
        found = ", ".join(table.loc[matches if len(matches) else table.index, "run"])
        return (
            None,
            f"--baseline {baseline!r} matches {'no run' if not len(matches) else 'several runs'} ({found})",
        )
    index, row = int(matches[0]), table.loc[matches[0]]
    return (
        (index, None)
        if row[metric] > 0
        else (None, f"--baseline {baseline!r} ({row['run']}, status {row['status']}) has no {metric}")
    )


def add_speedup(table: pd.DataFrame, base: int | None, metric: str) -> pd.DataFrame:
    """A speedup column: baseline/run for times, run/baseline for rates; only runs that ended ok get one."""
    values = table[metric].where(table["status"].eq("ok") & table[metric].gt(0))
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
                "status": t["status"].where(
                    t["status"].eq("ok"), t["status"].str.upper() + (": " + reason).fillna("")
                ),
            }
        )
        .astype("string")
        .fillna(NA)
    )
    name = table.at[base, "run"] if base is not None else None
    notes = (
        []
        if base is None
        else [
            f"speedup: {metric} of {name} / each run's"
            if SPEEDUP_ON[metric] == "time"
            else f"speedup: each run's {metric} / {name}'s"
        ]
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
    """A GitHub markdown table of text cells: unpadded (diff-friendly), no tabulate (pandas' to_markdown needs it)."""
    cells = (
        cells.astype("string").fillna(NA).map(lambda text: text.replace("|", "/"))
    )  # a | would split the cell
    lines = ["| " + " | ".join(cells.columns) + " |", "|" + "|".join("---" for _ in cells.columns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)])


def to_json(table: pd.DataFrame, base: int | None, metric: str) -> str:
    """Every column but the record (its file is beside), loss curves included; missing figures are null."""
    table = table.drop(columns="record")
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
    parser.add_argument(
        "paths",
        nargs="*",
        help="job logs, log dirs, output dirs and dirs of output dirs (default: logs/ outputs/)",
    )
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
    paths = args.paths or [p for p in ("logs", "outputs") if os.path.exists(p)]
    table, warnings = read_runs(paths) if paths else (pd.DataFrame(), [])
    for warning in warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    error = (
        "no paths given and no logs/ or outputs/ here"
        if not paths
        else f"no runs found in {' '.join(paths)} (looked for *.out/*.err/*.log and dirs with {SUMMARY_FILE})"
        if table.empty
        else None
    )
    base, error = (None, error) if error else pick_baseline(table, args.baseline, args.speedup_on)
    if error:
        print(f"ERROR: {error}", file=sys.stderr)
        return 2
    table = add_speedup(table, base, args.speedup_on)
    flat = table.drop(columns=["loss_curve", "record"]).assign(
        logs=table["logs"].map(";".join)
    )  # csv: logs a;b
    sys.stdout.write(
        to_markdown(table, base, args.speedup_on)
        if args.format == "md"
        else flat.to_csv(index=False, lineterminator="")
        if args.format == "csv"
        else to_json(table, base, args.speedup_on)
    )
    if args.plot:  # matplotlib only when a plot is drawn: the table needs none
        from qa_hpc.tools.figures import write_plots

        for path in write_plots(table, args.plot):
            print(f"PLOT={path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
