"""Rows of the results table: one per run, from its record (run_summary.json).

A run's record is the only source of its figures. Job logs are read for two things alone:
to show a run that never wrote a record (it failed before its inputs were checked, is still
running, or was killed), with the last `ERROR:` line as the reason; and to pair a job log
with its record, by the job id (or, for a log of a run outside Slurm, the job name) in the
log's file name. A pair is one row, and the record wins.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

RECORD = "run_summary.json"
LOG_SUFFIXES = (".out", ".err", ".log")
# Files only a run's output dir holds: a dir with any of them is a run, with or without a record.
OUTPUT_MARKERS = (RECORD, "all_results.json", "trainer_state.json", "memory.json")
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "runs", "profiler", "hf_cache", "wandb"}
# run_qa.py's own words (cli) and the job scripts' (qa_die, with a "[qa-hpc HH:MM:SS] " prefix)
ERROR_LINE = re.compile(r"^(?:\[qa-hpc [0-9:]+\] )?ERROR: (.+?)\s*$", re.MULTILINE)

Row = dict[str, Any]


def find(paths: list[str]) -> tuple[dict[str, list[Path]], list[Path], list[str]]:
    """Job logs grouped by stem (`x.out` + `x.err` are one job), output dirs, and paths not found."""
    logs: dict[str, list[Path]] = {}
    dirs: set[Path] = set()
    missing: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.name == RECORD and path.is_file():
            dirs.add(path.parent.resolve())
        elif path.is_file():
            logs.setdefault(str(path.resolve().with_suffix("")), []).append(path.resolve())
        elif _is_output_dir(path):
            dirs.add(path.resolve())
        elif path.is_dir():
            for here, subdirs, files in os.walk(path):
                # checkpoints hold trainer_state.json too, but belong to the run above them
                subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.startswith("checkpoint-"))
                if _is_output_dir(Path(here)):
                    dirs.add(Path(here).resolve())
                    subdirs[:] = []
                    continue
                for name in sorted(f for f in files if f.endswith(LOG_SUFFIXES)):
                    file = (Path(here) / name).resolve()
                    logs.setdefault(str(file.with_suffix("")), []).append(file)
        else:
            missing.append(raw)
    return logs, sorted(dirs), missing


def _is_output_dir(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in OUTPUT_MARKERS)


def read_json(path: Path) -> Any:
    """The parsed file, or None when it is missing or cut off mid-write."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def name_and_id(stem: str) -> tuple[str | None, str | None]:
    """The job name and id in a log's file name: `name-1234` / `slurm-1234` (sbatch), `name-local-<time>`."""
    local = re.fullmatch(r"(.*)-local-[0-9-]+", stem)  # the job scripts' own log outside Slurm
    if local:
        return local.group(1), None
    named = re.fullmatch(r"(.*?)[-_.](\d+(?:_\d+)?)", stem)
    if not named:
        return stem, None
    return (None if named.group(1) == "slurm" else named.group(1)), named.group(2)


def last_error(files: list[Path]) -> str | None:
    """The last `ERROR: ...` line of a job's log files (the reason a run without a record gives)."""
    errors: list[str] = []
    for file in files:
        try:
            errors += ERROR_LINE.findall(file.read_text(encoding="utf-8", errors="replace"))
        except OSError as err:
            errors.append(f"cannot read {file}: {err}")
    return errors[-1] if errors else None


def loss_curve(out_dir: Path) -> list[list[float]]:
    """[step, loss] from trainer_state.json, or the newest checkpoint's for a run that stopped early."""
    state = read_json(out_dir / "trainer_state.json")
    if state is None:
        steps = [int(p.name.split("-")[1]) for p in out_dir.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
        state = read_json(out_dir / f"checkpoint-{max(steps)}" / "trainer_state.json") if steps else None
    history = (state or {}).get("log_history", [])
    return [[entry["step"], entry["loss"]] for entry in history if "loss" in entry and "step" in entry]


# Every row has these keys, in this order (the columns of --format csv/json, before speedup).
FIELDS = (
    "run", "job_name", "job_id", "status", "reason", "exit_code", "nodes", "procs_per_node", "world_size",
    "device", "precision", "wall_clock_seconds", "train_runtime", "train_samples_per_second",
    "train_tokens_per_second", "train_mfu", "eval_samples_per_second", "exact_match", "f1", "peak_memory_mb",
    "peak_memory_source", "hostname", "timestamp", "output_dir", "logs", "loss_curve",
)


def _row(**values: Any) -> Row:
    row: Row = {**dict.fromkeys(FIELDS), "logs": [], "loss_curve": [], **values}
    row["run"] = f"{row['job_name']}-{row['job_id']}" if row["job_name"] and row["job_id"] else row["run"]
    return row


def record_row(out_dir: Path) -> Row:
    """The row of one output dir: its record's figures, or status incomplete when it has none."""
    record = read_json(out_dir / RECORD)
    if not isinstance(record, dict):
        return _row(run=out_dir.name, output_dir=str(out_dir), status="incomplete", loss_curve=loss_curve(out_dir),
                    reason=f"no readable {RECORD} (still running, or killed before it could write one)")
    plan, effective = record.get("plan") or {}, record.get("effective") or {}
    results, memory = record.get("results") or {}, record.get("memory") or {}
    world, per_node = effective.get("world_size") or plan.get("world_size"), plan.get("local_world_size")
    cuda_peak = (memory.get("max_over_ranks") or {}).get("cuda_peak_allocated_mb")
    job_id = record.get("slurm_job_id")
    return _row(
        run=out_dir.name, job_name=record.get("slurm_job_name"), job_id=str(job_id) if job_id else None,
        status=record.get("status") or "unknown", reason=_reason(record), exit_code=record.get("exit_code"),
        nodes=-(-world // per_node) if world and per_node else None, procs_per_node=per_node, world_size=world,
        device=effective.get("device_name") or plan.get("device"),
        precision=effective.get("precision") or plan.get("precision"),
        wall_clock_seconds=record.get("wall_clock_seconds"),
        **{key: results.get(key) for key in ("train_runtime", "train_samples_per_second", "train_tokens_per_second",
                                             "train_mfu", "eval_samples_per_second")},
        exact_match=_first(results.get("eval_exact_match"), results.get("eval_exact")),  # SQuAD v1 / v2 name
        f1=results.get("eval_f1"),
        peak_memory_mb=memory.get("measured_peak_mb"),
        peak_memory_source=None if memory.get("measured_peak_mb") is None else "cuda" if cuda_peak else "rss",
        hostname=record.get("hostname"), timestamp=record.get("timestamp"), output_dir=str(out_dir),
        loss_curve=loss_curve(out_dir),
    )


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _reason(record: Row) -> str | None:
    """Why a run did not end ok, in the record's own words."""
    if record.get("status") == "failed":
        return f"exit code {record.get('exit_code')}: {record.get('error') or 'no error recorded'}"
    stopped = record.get("stopped") or {}
    if record.get("status") == "preempted":
        return f"{stopped.get('signal')} at step {stopped.get('global_step')}; resumes from {stopped.get('checkpoint')}"
    return None


def log_row(stem: str, files: list[Path], rows: list[Row]) -> Row:
    """A job log no record belongs to: failed (its last ERROR line says why), or incomplete."""
    name, job_id = name_and_id(stem)
    error = last_error(files)
    if error:
        return _row(run=stem, job_name=name, job_id=job_id, status="failed", reason=error,
                    logs=[str(f) for f in files])
    reason = f"no {RECORD} of this job: still running, or killed (time limit, out of memory, scancel)"
    # job scripts reuse outputs/<job name>: another job of the same name may have overwritten the record
    other = next((r for r in rows if name and r["job_name"] == name and r["job_id"] != job_id), None)
    if other:
        reason += f"; {other['output_dir']} holds the record of job {other['job_id']}"
    return _row(run=stem, job_name=name, job_id=job_id, status="incomplete", reason=reason,
                logs=[str(f) for f in files])


def build_rows(paths: list[str]) -> tuple[list[Row], list[str]]:
    """One row per run found under `paths` (sorted by job id), and warnings about paths not found."""
    logs, dirs, missing = find(paths)
    by_dir = {d: record_row(d) for d in dirs}
    by_id = {row["job_id"]: d for d, row in by_dir.items() if row["job_id"]}
    rows: list[Row] = []
    # logs with a job id first; then logs without one newest first (their names end in the start
    # time), so the newest claims the output dir that its job name's runs share
    with_id = sorted(s for s in logs if name_and_id(Path(s).name)[1])
    without_id = sorted((s for s in logs if not name_and_id(Path(s).name)[1]), reverse=True)
    for stem in with_id + without_id:
        name, job_id = name_and_id(Path(stem).name)
        out_dir = by_id.get(job_id) if job_id else _dir_named(name, by_dir)
        if out_dir is None or by_dir[out_dir]["logs"]:
            rows.append(log_row(Path(stem).name, logs[stem], list(by_dir.values())))
            continue
        row = by_dir[out_dir]
        row["logs"] = [str(f) for f in logs[stem]]
        if not row["job_name"]:  # a run outside Slurm: its record has no job name, the log's file has
            row.update(job_name=name, run=name)
        error = last_error(logs[stem]) if row["status"] == "incomplete" else None  # no record: the log tells
        if error:
            row.update(status="failed", reason=error)
    rows += by_dir.values()
    rows.sort(key=_order)
    return rows, [f"not found: {p}" for p in missing]


def _dir_named(name: str | None, by_dir: dict[Path, Row]) -> Path | None:
    """The output dir of a run outside Slurm: the job scripts' outputs/<name> or outputs/<mode>-<name>."""
    return next((d for d, row in by_dir.items() if name and not row["job_id"] and not row["logs"]
                 and (d.name == name or d.name.endswith(f"-{name}"))), None)


def _order(row: Row) -> tuple[int, int, str, str]:
    job_id = row["job_id"] or ""
    number = re.match(r"\d+", job_id)
    return (0 if number else 1, int(number.group(0)) if number else 0, job_id, row["run"])
