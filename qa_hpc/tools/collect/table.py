"""The rows as a pandas table: speedup against a baseline, and markdown, CSV and JSON output."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from qa_hpc.tools.collect.runs import FIELDS, Row

# figure -> how it compares: a shorter time is faster, a higher rate is faster
SPEEDUP_ON = {
    "train_runtime": "time",
    "wall_clock_seconds": "time",
    "train_samples_per_second": "rate",
    "train_tokens_per_second": "rate",
}
INTEGERS = ("exit_code", "nodes", "procs_per_node", "world_size")
FLOATS = ("wall_clock_seconds", "train_runtime", "train_samples_per_second", "train_tokens_per_second", "train_mfu",
          "eval_samples_per_second", "exact_match", "f1", "peak_memory_mb")
NA = "n/a"


def frame(rows: list[Row]) -> pd.DataFrame:
    """The rows as a DataFrame; a figure a record holds as anything but a number reads as missing."""
    table = pd.DataFrame(rows, columns=list(FIELDS))
    table[list(FLOATS)] = table[list(FLOATS)].apply(pd.to_numeric, errors="coerce").astype(float)
    # nullable integers: a missing node count must not turn the others into 1.0, 2.0 in the CSV
    return table.astype({key: "Int64" for key in INTEGERS})


def pick_baseline(table: pd.DataFrame, baseline: str | None, metric: str) -> tuple[int | None, str | None]:
    """The index of the baseline row (named, or the first ok row with the figure), or an error message."""
    if not baseline:
        usable = table.index[table["status"].eq("ok") & table[metric].gt(0)]
        return (int(usable[0]) if len(usable) else None), None
    names = table[["run", "job_name", "job_id"]].astype("string")
    names["dir"] = table["output_dir"].map(lambda d: Path(d).name, na_action="ignore")
    matches = table.index[names.eq(baseline).any(axis=1)]
    if not len(matches):
        matches = table.index[table["run"].str.contains(baseline, regex=False)]
    if len(matches) != 1:
        found = ", ".join(table.loc[matches if len(matches) else table.index, "run"])
        return None, f"--baseline {baseline!r} matches {'no run' if not len(matches) else 'several runs'} ({found})"
    index = int(matches[0])
    if not table.at[index, metric] > 0:
        row = table.loc[index]
        return None, f"--baseline {baseline!r} ({row['run']}, status {row['status']}) has no {metric}"
    return index, None


def add_speedup(table: pd.DataFrame, base: int | None, metric: str) -> pd.DataFrame:
    """A speedup column: baseline/run for times, run/baseline for rates; only runs that ended ok get one."""
    table = table.copy()
    if base is None:
        table["speedup"] = float("nan")
        return table
    reference, values = table.at[base, metric], table[metric].where(table["status"].eq("ok") & table[metric].gt(0))
    table["speedup"] = reference / values if SPEEDUP_ON[metric] == "time" else values / reference
    return table


def _fixed(value: Any, spec: str) -> str:
    return NA if pd.isna(value) else format(value, spec)


def _text(value: Any) -> str:
    return NA if pd.isna(value) else str(value)  # pandas keeps a missing string as NaN, not None


def _figure(value: Any) -> str:
    """Throughputs and times span 0.01 to 100,000: two decimals while small, thousands separators when big."""
    return NA if pd.isna(value) else f"{value:.2f}" if abs(value) < 1000 else f"{value:,.0f}"


def _layout(row: pd.Series) -> str:
    return NA if pd.isna(row["nodes"]) or pd.isna(row["procs_per_node"]) else f"{row['nodes']}×{row['procs_per_node']}"


def _memory(row: pd.Series) -> str:
    return NA if pd.isna(row["peak_memory_mb"]) else f"{row['peak_memory_mb']:,.0f} MB ({row['peak_memory_source']})"


def _status(row: pd.Series) -> str:
    if row["status"] == "ok" or pd.isna(row["reason"]):
        return row["status"] if row["status"] == "ok" else row["status"].upper()
    reason = row["reason"] if len(row["reason"]) <= 100 else row["reason"][:97] + "..."  # whole: csv/json
    return f"{row['status'].upper()}: {reason}"


# title -> the cell of a row; figures from one column are formatted alike
MARKDOWN: dict[str, Callable[[pd.Series], str]] = {
    "run": lambda r: r["run"],
    "job id": lambda r: _text(r["job_id"]),
    "nodes×GPUs": _layout,
    "device": lambda r: _text(r["device"]),
    "precision": lambda r: _text(r["precision"]),
    "wall s": lambda r: _fixed(r["wall_clock_seconds"], ".0f"),
    "train s": lambda r: _figure(r["train_runtime"]),
    "train samples/s": lambda r: _figure(r["train_samples_per_second"]),
    "eval samples/s": lambda r: _figure(r["eval_samples_per_second"]),
    "EM": lambda r: _fixed(r["exact_match"], ".2f"),
    "F1": lambda r: _fixed(r["f1"], ".2f"),
    "peak memory": _memory,
    "speedup": lambda r: NA if pd.isna(r["speedup"]) else f"{r['speedup']:.2f}×",
    "status": _status,
}


def to_markdown(table: pd.DataFrame, base: int | None, metric: str) -> str:
    """A GitHub markdown table and what its speedup and memory columns mean."""
    cells = pd.DataFrame({title: table.apply(cell, axis=1) for title, cell in MARKDOWN.items()})
    cells = cells.map(lambda text: str(text).replace("|", "/"))  # a | in a reason would split the cell
    lines = ["| " + " | ".join(cells.columns) + " |", "|" + "|".join("---" for _ in cells.columns) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)]
    notes = []
    if base is not None:
        name = table.at[base, "run"]
        notes.append(f"speedup: {metric} of {name} / each run's" if SPEEDUP_ON[metric] == "time"
                     else f"speedup: each run's {metric} / {name}'s")
    notes.append("peak memory: cuda = CUDA peak allocated (max over ranks); rss = CPU peak RSS")
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def to_csv(table: pd.DataFrame) -> str:
    """Every column but the loss curve; a run's log files joined by ';'."""
    flat = table.drop(columns="loss_curve").assign(logs=table["logs"].map(";".join))
    return flat.to_csv(index=False, lineterminator="\n")


def to_json(table: pd.DataFrame, base: int | None, metric: str) -> str:
    """Every column, loss curves included; missing figures are null."""
    plain = table.astype(object).where(table.notna(), None)  # NaN and pd.NA are not JSON
    return json.dumps({
        "baseline": table.at[base, "run"] if base is not None else None,
        "speedup_on": metric,
        "runs": plain.to_dict(orient="records"),
    }, indent=2) + "\n"
