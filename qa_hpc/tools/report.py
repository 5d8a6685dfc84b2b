#!/usr/bin/env python
"""The document users hand in, from one run or several: report.md with its PNG figures beside it, and
report.html.

    python -m qa_hpc.tools.report outputs/bert_squad_ft3 --out reports/ft3
    python -m qa_hpc.tools.report outputs/bert_squad_ft3 outputs/bert_squad_ddp --out reports/scaling

Numbers are copied from the records as qa_hpc.tools.collect_results reads them (run_summary.json); the
training curves from the run's trainer_state.json (the Trainer's log history, every launch of a resumed run);
the top operations from its profiler table. Several runs get a comparison against the baseline (the first, or
--baseline). What a run lacks, the report says.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from qa_hpc.atomic_io import read_json_object, write_text_atomic
from qa_hpc.errors import EXIT_IOERR, OutputError, check_writable_dir
from qa_hpc.outputs import PROFILER_SUMMARY, SUMMARY_FILE, TRAINER_STATE_FILE
from qa_hpc.record import Memory, RunRecord
from qa_hpc.tools.collect_results import (
    OUTPUT_MARKERS,
    add_speedup,
    md_table,
    pick_baseline,
    read_runs,
    resumed_runs,
    usable_baseline,
)
from qa_hpc.tools.figures import NA, curves_figure, write_plots

NEEDED = ("status", "params", "plan", "results")  # a record without them is from an older layout
TOP_OPS = 10
# A comparison compares devices; runs that differ in one of these Parameters compare more than that.
SAME = (
    "model",
    "dataset",
    "training samples",
    "epochs",
    "max steps",
    "global batch",
    "learning rate",
    "max_seq_length",
    "doc_stride",  # with max_seq_length, the windows (features) each question makes: the work of an epoch
    "precision",
)
# sections whose rows a run may lack without saying so (v1 has no HasAns, a CPU no MFU)
OPTIONAL = {"Training", "Evaluation"}


def sections(run: pd.Series) -> dict[str, list[tuple[str, Any]]]:
    """A run's tables: title -> (label, the record's value) rows; a value the record lacks is None."""
    record: RunRecord = run["record"]
    env = record.environment
    params = record.params
    plan = record.plan
    effective = record.effective
    results = record.results
    memory = record.memory or Memory()
    peaks = memory.max_over_ranks
    return {
        "Environment": [
            ("host", env.hostname),
            ("GPU", env.gpu_name),
            ("GPUs on the node", env.gpu_count),
            ("CPU model", env.cpu_model),
            ("CPU flags", env.cpu_flags),
            ("CPUs", env.cpu_count),
            ("CUDA", env.cuda_version),
            ("driver", env.driver_version),
            ("python", env.python),
            ("torch", env.torch_version),
            ("transformers", env.transformers_version),
            ("datasets", env.datasets_version),
            ("Slurm job", env.slurm_job_id),
            ("Slurm nodes", env.slurm_nodelist),
            ("node count", env.slurm_job_num_nodes),
            ("processes", plan.world_size),
            ("processes per node", plan.local_world_size),
            ("threads per process", effective.threads),
        ],
        "Parameters": [
            ("model", params.model),
            ("dataset", params.dataset),
            ("epochs", params.epochs),
            ("max steps", params.max_steps),
            ("training samples", params.max_train_samples),
            ("batch per device", params.per_device_train_batch_size),
            ("world size", params.world_size),
            ("gradient accumulation", params.gradient_accumulation_steps),
            ("global batch", params.global_batch),
            ("learning rate", params.learning_rate),
            ("max_seq_length", params.max_seq_length),
            ("doc_stride", params.doc_stride),
            ("seed", params.seed),
            ("precision", effective.precision),
            ("TF32", effective.tf32),
            ("attention", effective.attn_implementation),
            ("optimizer", effective.optim),
        ],
        "Training": [
            ("runtime s", results.train_runtime),
            ("samples/s", results.train_samples_per_second),
            ("real tokens/s", results.train_tokens_per_second),
            ("steps/s", results.train_steps_per_second),
            ("model TFLOP", results.train_model_tflop),
            ("achieved TFLOP/s", results.train_achieved_tflops),
            ("peak TFLOP/s", results.train_peak_tflops),
            ("MFU (achieved / peak)", results.train_mfu),
            ("final loss", run["loss_curve"][-1][1] if run["loss_curve"] else None),
            ("mean loss", results.train_loss),
        ],
        "Evaluation": [
            ("exact match", results.eval_exact_match),
            ("exact", results.eval_exact),
            ("F1", results.eval_f1),
            ("HasAns exact", results.eval_HasAns_exact),
            ("HasAns F1", results.eval_HasAns_f1),
            ("NoAns exact", results.eval_NoAns_exact),
            ("NoAns F1", results.eval_NoAns_f1),
            ("runtime s", results.eval_runtime),
            ("postprocess s", results.eval_postprocess_seconds),
            ("questions", results.eval_examples),
            ("features", results.eval_samples),
        ],
        "Memory (MB)": [
            ("measured peak", memory.measured_peak_mb),
            ("measured as", memory.measured_source),
            ("CUDA peak allocated", peaks.cuda_peak_allocated_mb),
            ("CUDA peak reserved", peaks.cuda_peak_reserved_mb),
            ("CPU peak RSS", peaks.cpu_peak_rss_mb),
            ("estimate", memory.estimate_mb),
            ("estimate / measured", memory.estimate_over_measured),
            ("note", memory.note),
        ],
    }


def number(value: Any) -> str:
    """As recorded, rounded for reading: 4 significant digits below 1, 2 decimals above, ints whole."""
    # pd.NA: a missing Int64
    if value is None or value is pd.NA or (isinstance(value, float) and pd.isna(value)):
        return NA
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return (", ".join(map(str, value)) if isinstance(value, list) else str(value)).replace("|", "/")
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}" if abs(value) < 1 else f"{value:,.2f}"


def beside_output(run: pd.Series, path: str) -> Path:
    """A path the record keeps as the run was given it: relative ones are relative to the dir the run started
    in, which holds the output dir (the checkout for the job scripts' outputs/<job>) or is this one (the job
    scripts)."""
    out = Path(run["output_dir"])
    return next(
        (base / path for base in (out, *out.parents, Path.cwd()) if (base / path).exists()), out / path
    )


def shown(path: str | Path) -> str:
    """A path as users name it: relative to where the report runs when it is below it."""
    return str(Path(path).relative_to(Path.cwd())) if Path(path).is_relative_to(Path.cwd()) else str(path)


def profile_lines(run: pd.Series) -> list[str]:
    """The profiler table's header and top operations, as written, or what is missing."""
    record = run["record"]
    if not record.plan.profile_dir:
        return ["Not profiled (run with `--profile`)."]
    where, recorded_out = Path(record.plan.profile_dir), record.params.output_dir
    if recorded_out and where.is_relative_to(recorded_out):
        # inside the run's folder (the default): found in the folder given, which may be a copy or a move
        # (results copied off scratch), not at the path the record was written with
        table = Path(run["output_dir"]) / where.relative_to(recorded_out) / PROFILER_SUMMARY
    else:
        table = beside_output(run, str(where)) / PROFILER_SUMMARY
    if not table.is_file():
        return [f"Profiled, but there is no `{shown(table)}`."]
    lines = table.read_text(encoding="utf-8", errors="replace").splitlines()
    rule = next((i for i, line in enumerate(lines) if line.startswith("---")), len(lines))
    # torch.profiler's table opens with a rule, the column names and a second rule: kept, then the rows
    header = rule + 3
    ops = [line for line in lines[header:] if line.strip() and not line.startswith("-")][:TOP_OPS]
    return [f"Top {len(ops)} operations of `{shown(table)}`:", "", "```text", *lines[:header], *ops, "```"]


def section(title: str, rows: list[tuple[str, Any]]) -> list[str]:
    if title in OPTIONAL:
        rows = [(label, value) for label, value in rows if value is not None]
    if not rows:
        return [f"### {title}", "", f"No {title.lower()} in the record.", ""]
    cells = pd.DataFrame([(label, number(value)) for label, value in rows])
    return [f"### {title}", "", md_table(cells.set_axis(["", "value"], axis=1)), ""]


def run_section(run: pd.Series, figure: str, out: Path) -> list[str]:
    """One run: how it ended, its records' tables, its training curves and its profile."""
    restarts = run["record"].environment.slurm_restart_count
    resumed = run["resumed_from_step"]  # the record's last launch resumed from that step (0: trained all)
    ended = f" ({run['reason']})" if pd.notna(run["reason"]) else ""  # failed: the error; preempted: where
    lines = [
        f"## {run['run']}",
        "",
        f"`{shown(run['output_dir'])}`: **{run['status']}**{ended}, exit code "
        f"{number(run['exit_code'])}, wall clock {number(run['wall_clock_seconds'])} s"
        + (f", requeued {restarts} time(s)" if restarts else "")
        + (f", its last launch resumed from step {resumed}" if pd.notna(resumed) and resumed > 0 else ""),
        "",
    ]
    for title, rows in sections(run).items():
        lines += section(title, rows)
        if title != "Training":
            continue
        if run["loss_curve"]:
            curves_figure(run["log_history"], run["run"]).savefig(out / figure)
            lines += [f"![training curves of {run['run']}]({figure})", ""]
        else:
            state = shown(Path(run["output_dir"], TRAINER_STATE_FILE))
            lines += [f"No training loss in `{state}`: no training curves.", ""]
    return lines + ["### Profiler", "", *profile_lines(run), ""]


def comparison(table: pd.DataFrame, base: int, out: Path) -> list[str]:
    """The scaling table against the baseline, the warning when runs differ in more than devices, the
    figures."""
    table = add_speedup(table, base, "train_runtime")
    devices = table["world_size"] / table.at[base, "world_size"]
    parameters = []
    for _, run in table.iterrows():
        rows = dict(sections(run)["Parameters"])
        if run["record"].params.trains_by_steps:  # the epochs go unused: runs differ in none
            rows["epochs"] = None
        parameters.append(rows)
    # a resumed run's times are its last launch's alone: said beside its name
    last_launch = " (times: its last launch, from step " + table["resumed_from_step"].astype("string") + ")"
    cells = pd.DataFrame(
        {
            "run": table["run"].where(~resumed_runs(table), table["run"] + last_launch),
            "wall clock s": table["wall_clock_seconds"],
            "train s": table["train_runtime"],
            "precision": table["precision"],
            "world size": table["world_size"],
            "global batch": [rows["global batch"] for rows in parameters],
            "train samples/s": table["train_samples_per_second"],
            "speedup": table["speedup"],
            "efficiency": table["speedup"] / devices,
            "EM": table["exact_match"],
            "F1": table["f1"],
            "peak memory MB": table["peak_memory_mb"],
        }
    )
    differ = {name: [number(rows[name]) for rows in parameters] for name in SAME}
    differ = {name: values for name, values in differ.items() if len(set(values)) > 1}
    warning = []
    if differ:
        warning = [
            "**Warning: the runs differ in "
            + "; ".join(f"{k} ({', '.join(v)})" for k, v in differ.items())
            + "**: the speedup measures more than the number of devices.",
            "",
        ]
    pngs = [path.name for path in write_plots(table, out)]
    return [
        "## Comparison",
        "",
        *warning,
        md_table(cells.astype(object).map(number)),
        "",
        f"Baseline {table.at[base, 'run']}. speedup = its train time / the run's (none for a run whose last "
        "launch resumed: its wall clock and train time are that launch's alone; compare its train "
        "samples/s); efficiency = speedup / (the run's devices / the baseline's); train samples/s over all "
        "ranks; peak memory as in each run's Memory table.",
        "",
        *(f"![{name}]({name})" for name in pngs),
        "",
    ]


def problem(raw: str) -> str | None:
    """Why RUN_DIR cannot be reported on, in one line naming the dir and the file; None when it can."""
    path = Path(raw)
    if not path.exists():
        return f"{raw}: not found"
    if not path.is_dir():
        return f"{raw}: not a directory"
    found = [marker for marker in OUTPUT_MARKERS if (path / marker).is_file()]
    if SUMMARY_FILE not in found:
        why = f", only {', '.join(found)} (an older layout" if found else " (not a run's output dir"
        return f"{raw}: no {SUMMARY_FILE}{why}, or a run killed before its end)"
    try:
        record = read_json_object(path / SUMMARY_FILE)
    except (OSError, ValueError) as err:
        return f"{raw}: {SUMMARY_FILE} cannot be read: {err}"
    missing = [key for key in NEEDED if key not in record]
    if missing:
        return f"{raw}: {SUMMARY_FILE} has no {', '.join(missing)} (an older layout)"
    return None


def to_html(markdown_text: str, out: Path) -> str:
    """report.html: the same document, the figures inside it (one file to mail or attach)."""
    import markdown  # installed with tensorboard

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code"])
    body = re.sub(
        r'src="([^"/]+\.png)"',
        lambda m: (
            'src="data:image/png;base64,' + base64.b64encode((out / m.group(1)).read_bytes()).decode() + '"'
        ),
        body,
    )
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px}pre{overflow-x:auto}"
    )
    return f"<!doctype html><meta charset=utf-8><title>run report</title><style>{style}</style>\n{body}\n"


def report_baseline(table: pd.DataFrame, runs: list[str], baseline: str | None) -> tuple[int, str | None]:
    """The row the others are compared with: --baseline (a RUN_DIR, a label, job name or id), else the
    first RUN_DIR; it must have ended ok with its train time. (0, None) for a run alone."""
    if baseline and Path(baseline).is_dir():  # a RUN_DIR: by its path (two runs' folders may share a name)
        matches = table.index[table["output_dir"].eq(str(Path(baseline).resolve()))]
        if not len(matches):
            return 0, f"--baseline {baseline}: not one of the RUN_DIRs ({', '.join(runs)})"
        base, error = usable_baseline(table, int(matches[0]), f"--baseline {baseline}", "train_runtime")
    elif baseline:
        base, error = pick_baseline(table, baseline, "train_runtime")
    elif len(table) > 1:
        base, error = usable_baseline(
            table, 0, f"the baseline, the first RUN_DIR {runs[0]},", "train_runtime"
        )
    else:
        return 0, None
    return (0 if base is None else base), error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qa_hpc.tools.report",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="a run's --output_dir (with run_summary.json)"
    )
    parser.add_argument(
        "--baseline",
        help="the run the others are compared with: its dir, job name or id (default: the first RUN_DIR)",
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="where report.md, report.html and figures go"
    )
    args = parser.parse_args(argv)
    error = next(filter(None, map(problem, args.runs)), None)
    resolved = [Path(raw).resolve() for raw in args.runs]
    if error is None and len(set(resolved)) < len(resolved):
        same = [raw for raw, path in zip(args.runs, resolved) if resolved.count(path) > 1]
        error = (
            f"{same[0]}: one run given more than once ({', '.join(same)}); a run compared with itself "
            "says nothing"
        )
    base = 0
    if error is None:
        # RUN_DIR order: the first is the default baseline
        order = [str(path) for path in resolved]
        table = read_runs(args.runs)[0].set_index("output_dir", drop=False).loc[order].reset_index(drop=True)
        base, error = report_baseline(table, args.runs, args.baseline)
    if error:
        print(f"ERROR: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        check_writable_dir(str(out), "--out")
    except OutputError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return EXIT_IOERR
    lines = [
        f"# Run report: {' vs '.join(table['run'])}",
        "",
        f"Written {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} by `python -m qa_hpc.tools.report` from "
        + ", ".join(f"`{shown(d)}`" for d in table["output_dir"])
        + ".",
        "",
    ]
    if len(table) > 1:
        lines += comparison(table, base, out)
    for i, run in table.iterrows():
        lines += run_section(run, f"run{i + 1}_training.png", out)
    text = "\n".join(lines)
    write_text_atomic(out / "report.html", to_html(text, out))
    write_text_atomic(out / "report.md", text)
    print(f"REPORT={out / 'report.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
