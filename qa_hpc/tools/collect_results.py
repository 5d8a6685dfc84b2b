#!/usr/bin/env python
"""One row per run from SLURM logs and output dirs: where runs went, how fast, how good, how big.

    python -m qa_hpc.tools.collect_results                          # logs/ and outputs/ of the checkout
    python -m qa_hpc.tools.collect_results logs/ outputs/ --baseline bert_squad_ft3 --format md
    python -m qa_hpc.tools.collect_results logs/*.out --format csv > runs.csv
    python -m qa_hpc.tools.collect_results logs/ outputs/ --plot plots/   # + loss_curves.png throughput.png wall_time.png

A log (`*.out`, `*.err`, `*.log`; `name-id.out` and `name-id.err` are one run) gives the
KEY=value lines run_qa.py prints at the end (WALL_CLOCK_SECONDS last), the job's name,
id, nodes and exit code, and the error when the run failed. An output dir gives
run_summary.json, all_results.json, memory.json and trainer_state.json (loss curve).
A log that names its output dir (OUTPUT_DIR=) is merged with it into one row.

Runs that failed, are still running, or lack a figure are rows too: the figure reads
n/a and the status says what happened. Speedup is baseline/run for times and
run/baseline for throughput (--speedup_on), against --baseline (a run label, job name
or job id) or else the first successful row.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LOG_SUFFIXES = (".out", ".err", ".log")
OUTPUT_MARKERS = ("run_summary.json", "all_results.json", "trainer_state.json", "memory.json")
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "runs", "profiler", "hf_cache", "wandb"}

KV_LINE = re.compile(r"^(?:\[qa-hpc [0-9:]+\] )?([A-Za-z_][A-Za-z0-9_]*)=(.*?)\s*$")
LOSS_DICT = re.compile(r"\{'loss': [^{}]*\}")
ERROR_LINE = re.compile(r"^(?:\[qa-hpc [0-9:]+\] )?ERROR: (.+)$")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): ?(.*)$")
# slurmstepd's own words when it ends a job: time limit, preemption, the cgroup OOM killer
SLURM_CANCEL = re.compile(
    r"(CANCELLED AT \S+ DUE TO [A-Z ]+|Detected \d+ oom[-_]kill event\(s\)[^\n]*|"
    r"killed by the cgroup out-of-memory handler)"
)

SPEEDUP_METRICS = {
    "train_runtime": "time",
    "wall_clock_seconds": "time",
    "train_samples_per_second": "rate",
}

COLUMNS = (
    ("run", "run"),
    ("job_id", "job id"),
    ("layout", "nodes×GPUs"),
    ("device", "device"),
    ("precision", "precision"),
    ("wall_clock_seconds", "wall s"),
    ("train_runtime", "train s"),
    ("train_samples_per_second", "train samples/s"),
    ("eval_samples_per_second", "eval samples/s"),
    ("exact_match", "EM"),
    ("f1", "F1"),
    ("peak_memory", "peak memory"),
    ("speedup", "speedup"),
    ("status", "status"),
)


@dataclass
class Run:
    """Everything one row shows, with where it came from."""

    run: str = ""
    job_name: str | None = None
    job_id: str | None = None
    logs: list[str] = field(default_factory=list)
    output_dir: str | None = None
    status: str = "unknown"
    reason: str | None = None
    exit_code: int | None = None
    nodes: int | None = None
    world_size: int | None = None
    device: str | None = None
    precision: str | None = None
    wall_clock_seconds: float | None = None
    train_runtime: float | None = None
    train_samples_per_second: float | None = None
    eval_samples_per_second: float | None = None
    exact_match: float | None = None
    f1: float | None = None
    peak_memory_mb: float | None = None
    peak_memory_source: str | None = None
    speedup: float | None = None
    loss_curve: list[tuple[float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def procs_per_node(self) -> int | None:
        if self.world_size and self.nodes:
            return max(1, self.world_size // self.nodes)
        return None


# --- small helpers ---------------------------------------------------------------------------
def _num(value: Any) -> float | None:
    """A finite float from a log/JSON value (handles '0:01:04.38' durations), else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    text = str(value).strip()
    if re.fullmatch(r"\d+:\d{2}:\d{2}(\.\d+)?", text):
        h, m, s = text.split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _first(*values: Any) -> Any:
    for value in values:
        if value not in (None, ""):
            return value
    return None


# --- logs ------------------------------------------------------------------------------------
@dataclass
class LogInfo:
    """What one run's log files say."""

    stem: str
    files: list[str]
    kv: dict[str, str]
    output_dirs: list[str]
    job_name: str | None
    job_id: str | None
    nodes: int | None
    world_size: int | None
    device: str | None
    precision: str | None
    exit_code: int | None
    error: str | None
    losses: list[tuple[float, float]]


def _last_attempt(text: str) -> str:
    """A requeued job appends to its log: keep the last attempt (from the last JOB context line)."""
    marks = [m.start() for m in re.finditer(r"^\[qa-hpc [0-9:]+\] JOB name=", text, re.M)]
    return text[marks[-1]:] if len(marks) > 1 else text


def _name_id_from_stem(stem: str) -> tuple[str | None, str | None]:
    """`name-1234`, `name_1234`, `slurm-1234`, `name-1234_7` (array task) -> (name, id).

    The job scripts' own logs outside SLURM are `name-local-<time>`: a name, no id.
    """
    local = re.fullmatch(r"(.*)-local-[0-9-]+", stem)
    if local:
        return local.group(1), None
    m = re.fullmatch(r"(.*?)[-_.](\d+(?:_\d+)?)", stem)
    if not m:
        return stem, None
    name, job_id = m.group(1), m.group(2)
    return (None if name == "slurm" else name), job_id


def parse_log(stem: str, files: list[str]) -> LogInfo:
    text = ""
    for path in files:
        try:
            text += Path(path).read_text(encoding="utf-8", errors="replace") + "\n"
        except OSError as err:
            text += f"ERROR: cannot read {path}: {err}\n"
    text = _last_attempt(text)
    lines = [ln for ln in re.split(r"[\r\n]+", text) if ln.strip()]
    kv: dict[str, str] = {}
    output_dirs: list[str] = []
    for line in lines:
        m = KV_LINE.match(line.strip())
        if m:
            kv[m.group(1)] = m.group(2)
            if m.group(1) == "OUTPUT_DIR":
                output_dirs.append(m.group(2))
    job_name = job_id = None
    m = None
    for m in re.finditer(r"JOB name=(\S+) id=(\S+)", text):
        pass
    if m is not None:
        job_name = None if m.group(1) == "local" else m.group(1)
        job_id = None if m.group(2) == "none" else m.group(2)
    job_name = _first(job_name, kv.get("SLURM_JOB_NAME"))
    job_id = _first(job_id, kv.get("SLURM_JOB_ID"))
    nodes = _int(kv.get("RUN_NODES"))
    ddp = re.findall(r"DDP nodes=(\d+) nproc_per_node=(\d+)", text)
    if nodes is None and ddp:
        nodes = int(ddp[-1][0])
    dist_lines = re.findall(r"DISTRIBUTED world_size=(\d+) .*?device=(\S+)", text)
    world_size = _int(kv.get("RUN_WORLD_SIZE")) or (int(dist_lines[-1][0]) if dist_lines else None)
    device = kv.get("RUN_DEVICE") or (("cpu" if dist_lines[-1][1] == "cpu" else dist_lines[-1][1]) if dist_lines else None)
    precision = kv.get("RUN_PRECISION")
    if precision is None:
        pm = re.findall(r"\bprecision=-*(bf16|fp16|fp32)\b", text)
        precision = pm[-1] if pm else None
    exit_code = None
    for pattern in (r"JOB_EXIT_CODE=(-?\d+)", r"\bEXIT_CODE=(-?\d+)"):
        codes = re.findall(pattern, text)
        if codes:
            exit_code = int(codes[-1])
            break
    error = _failure_reason(lines, text)
    losses = []
    for i, blob in enumerate(LOSS_DICT.findall(text), start=1):
        lm = re.search(r"'loss': '?([-0-9.eE+naif]+)'?", blob)
        loss = _num(lm.group(1)) if lm else None
        if loss is not None:
            losses.append((float(i), loss))
    return LogInfo(stem, files, kv, output_dirs, job_name, job_id, nodes, world_size, device, precision,
                   exit_code, error, losses)


def _failure_reason(lines: list[str], text: str) -> str | None:
    """The most telling line of a failed run: our ERROR line, SLURM's cancel line, or the exception."""
    errors = [m.group(1) for ln in lines if (m := ERROR_LINE.match(ln.strip()))]
    if errors:
        return errors[-1]
    cancel = SLURM_CANCEL.findall(text)
    if cancel:
        return cancel[-1].strip()
    exceptions = [f"{m.group(1)}: {m.group(2)}".rstrip(": ") for ln in lines if (m := EXCEPTION_LINE.match(ln.strip()))]
    if exceptions:
        return exceptions[-1]
    return None


# --- output dirs -----------------------------------------------------------------------------
@dataclass
class DirInfo:
    """What one output dir holds."""

    path: str
    summary: dict[str, Any]
    results: dict[str, Any]
    memory: dict[str, Any] | None
    losses: list[tuple[float, float]]


def parse_output_dir(path: str) -> DirInfo:
    root = Path(path)
    summary = _read_json(root / "run_summary.json") or {}
    results = dict(_read_json(root / "all_results.json") or {})
    results.update(summary.get("results") or {})
    memory = _read_json(root / "memory.json")
    state = _read_json(root / "trainer_state.json")
    if state is None:
        checkpoints = sorted(root.glob("checkpoint-*"), key=lambda p: _int(p.name.split("-")[-1]) or -1)
        state = _read_json(checkpoints[-1] / "trainer_state.json") if checkpoints else None
    losses = []
    for entry in (state or {}).get("log_history", []):
        if "loss" in entry and "step" in entry and _num(entry["loss"]) is not None:
            losses.append((float(entry["step"]), float(entry["loss"])))
    return DirInfo(str(root.resolve()), summary, results, memory if isinstance(memory, dict) else None, losses)


# --- discovery -------------------------------------------------------------------------------
def discover(paths: list[str]) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """(log groups by stem path, output dirs, paths that were not found)."""
    logs: dict[str, list[str]] = {}
    dirs: list[str] = []
    missing: list[str] = []

    def add_log(file: Path) -> None:
        logs.setdefault(str(file.with_suffix("").resolve()), []).append(str(file.resolve()))

    for raw in paths:
        p = Path(raw)
        if p.is_file():
            add_log(p)
        elif p.is_dir():
            if any((p / marker).is_file() for marker in OUTPUT_MARKERS):
                dirs.append(str(p.resolve()))
                continue
            for current, subdirs, files in os.walk(p):
                subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.startswith("checkpoint-"))
                here = Path(current)
                if here != p and any(f in files for f in OUTPUT_MARKERS):
                    dirs.append(str(here.resolve()))
                    subdirs[:] = []
                    continue
                for name in sorted(files):
                    if name.endswith(LOG_SUFFIXES):
                        add_log(here / name)
        else:
            missing.append(raw)
    for stem in logs:
        logs[stem] = sorted(set(logs[stem]), key=lambda f: (not f.endswith(".out"), f))
    return logs, sorted(set(dirs)), missing


def _resolve_output_dir(candidates: list[str], log_file: str) -> str | None:
    """The first OUTPUT_DIR a log names that exists: absolute, or relative to the checkout or cwd."""
    base = Path(log_file).resolve().parent
    for cand in reversed(candidates):
        for root in (Path("/"), base.parent, base, Path.cwd()):
            path = Path(cand) if Path(cand).is_absolute() else root / cand
            if path.is_dir():
                return str(path.resolve())
    return None


# --- rows ------------------------------------------------------------------------------------
def build_runs(paths: list[str]) -> tuple[list[Run], list[str]]:
    """Rows for every run found under `paths`, and warnings about what was skipped."""
    log_groups, out_dirs, missing = discover(paths)
    warnings = [f"not found: {p}" for p in missing]
    dir_infos = {d: parse_output_dir(d) for d in out_dirs}
    used_dirs: set[str] = set()
    runs: list[Run] = []
    for stem, files in log_groups.items():
        log = parse_log(Path(stem).name, files)
        linked = _resolve_output_dir(log.output_dirs, files[0])
        if linked is None and log.job_id:
            linked = next((d for d, info in dir_infos.items()
                           if str(info.summary.get("slurm_job_id") or "") == log.job_id), None)
        info = dir_infos.get(linked) if linked else None
        if linked and info is None:
            info = parse_output_dir(linked)
        if linked:
            used_dirs.add(linked)
        runs.append(merge(log, info))
    for d, info in dir_infos.items():
        if d not in used_dirs:
            runs.append(merge(None, info))
    runs.sort(key=_order)
    return runs, warnings


def _order(run: Run) -> tuple:
    jid = run.job_id or ""
    m = re.match(r"\d+", jid)
    return (0 if m else 1, int(m.group(0)) if m else 0, jid, run.run)


def merge(log: LogInfo | None, info: DirInfo | None) -> Run:
    """One row from a log and/or an output dir; the log's KEY=value lines win, the files fill gaps."""
    kv = log.kv if log else {}
    summary = info.summary if info else {}
    results = info.results if info else {}
    params = summary.get("params") or {}
    run = Run()
    run.logs = list(log.files) if log else []
    run.output_dir = info.path if info else None
    stem_name, stem_id = _name_id_from_stem(log.stem) if log else (None, None)
    run.job_name = _first(log.job_name if log else None, summary.get("slurm_job_name"), stem_name)
    run.job_id = _first(log.job_id if log else None, summary.get("slurm_job_id"), stem_id)
    run.job_id = str(run.job_id) if run.job_id is not None else None
    if run.job_name and run.job_id:
        run.run = f"{run.job_name}-{run.job_id}"
    else:
        run.run = run.job_name or (log.stem if log else Path(info.path).name if info else "?")

    def metric(key: str, *alts: str) -> float | None:
        for k in (key, *alts):
            for source in (kv, results):
                value = _num(source.get(k))
                if value is not None:
                    return value
        return None

    run.wall_clock_seconds = _num(kv.get("WALL_CLOCK_SECONDS"))
    if run.wall_clock_seconds is None and summary.get("status") == "ok":
        run.wall_clock_seconds = _num(summary.get("wall_clock_seconds"))
    run.train_runtime = metric("train_runtime")
    run.train_samples_per_second = metric("train_samples_per_second")
    run.eval_samples_per_second = metric("eval_samples_per_second")
    run.exact_match = metric("eval_exact_match", "eval_exact")
    run.f1 = metric("eval_f1")
    run.world_size = _first(log.world_size if log else None, _int(params.get("world_size")))
    memory = info.memory if info else None
    hosts = {r.get("host") for r in (memory or {}).get("ranks", []) if isinstance(r, dict)}
    run.nodes = _first(log.nodes if log else None, len(hosts) or None, 1 if run.world_size else None)
    gpu = summary.get("gpu_name") if summary.get("gpu_available") else None
    run.device = _first(log.device if log else None, gpu, params.get("device"))
    if run.device and run.device.startswith("cuda") and gpu:
        run.device = gpu
    run.precision = _first(log.precision if log else None, params.get("precision"))
    _peak_memory(run, kv, memory)
    run.loss_curve = (info.losses if info and info.losses else (log.losses if log else []))
    _status(run, log, summary)
    return run


def _peak_memory(run: Run, kv: dict[str, str], memory: dict[str, Any] | None) -> None:
    peaks = (memory or {}).get("max_over_ranks") or {}
    cuda = _first(_num(kv.get("MEMORY_CUDA_PEAK_ALLOCATED_MB")), _num(peaks.get("cuda_peak_allocated_mb")))
    if cuda is not None:
        run.peak_memory_mb, run.peak_memory_source = cuda, "cuda"
        return
    rss = _first(_num(kv.get("MEMORY_CPU_PEAK_RSS_MB")), _num(peaks.get("cpu_peak_rss_mb")))
    if rss is not None:
        run.peak_memory_mb, run.peak_memory_source = rss, "rss"


def _status(run: Run, log: LogInfo | None, summary: dict[str, Any]) -> None:
    run.exit_code = log.exit_code if log else None
    finished = run.wall_clock_seconds is not None
    if log is None:
        run.status = "ok" if summary.get("status") == "ok" else "incomplete"
        if not run.ok:
            run.reason = "no run_summary.json (the run did not finish)"
        return
    if finished and (run.exit_code in (None, 0)):
        run.status = "ok"
    elif run.exit_code == 75 and not finished:
        run.status, run.reason = "preempted", "preempted: checkpoint saved, requeued to resume"
    elif log.error or (run.exit_code not in (None, 0)):
        run.status = "failed"
        run.reason = log.error or f"exit code {run.exit_code}"
        if run.exit_code not in (None, 0) and log.error:
            run.reason = f"exit code {run.exit_code}: {log.error}"
    else:
        run.status, run.reason = "incomplete", "no WALL_CLOCK_SECONDS line (still running, or killed)"


def apply_speedup(runs: list[Run], baseline: str | None, metric: str) -> tuple[Run | None, str | None]:
    """Set run.speedup against the chosen baseline; return it, or an error message."""
    if not runs:
        return None, None
    if baseline:
        exact = [r for r in runs if baseline in (r.run, r.job_name, r.job_id, r.output_dir and Path(r.output_dir).name)]
        matches = exact or [r for r in runs if baseline in r.run]
        if not matches:
            return None, f"--baseline {baseline!r} matches no run (runs: {', '.join(r.run for r in runs)})"
        if len(matches) > 1:
            return None, f"--baseline {baseline!r} matches several runs ({', '.join(r.run for r in matches)})"
        base = matches[0]
    else:
        base = next((r for r in runs if r.ok and getattr(r, metric) is not None), None)
        if base is None:
            return None, None
    reference = getattr(base, metric)
    for run in runs:
        value = getattr(run, metric)
        if reference is None or value is None or value == 0 or reference == 0:
            run.speedup = None
        elif SPEEDUP_METRICS[metric] == "time":
            run.speedup = reference / value
        else:
            run.speedup = value / reference
    return base, None


# --- output ----------------------------------------------------------------------------------
def _cell(run: Run, key: str) -> str:
    na = "n/a"
    if key == "layout":
        return f"{run.nodes}×{run.procs_per_node}" if run.nodes and run.procs_per_node else na
    if key == "job_id":
        return run.job_id or na
    if key == "peak_memory":
        if run.peak_memory_mb is None:
            return na
        return f"{run.peak_memory_mb:,.0f} MB ({run.peak_memory_source})"
    if key == "speedup":
        return f"{run.speedup:.2f}×" if run.speedup is not None else na
    if key == "status":
        if run.ok or not run.reason:
            return run.status if run.ok else run.status.upper()
        reason = run.reason if len(run.reason) <= 100 else run.reason[:97] + "..."  # full text: --format json/csv
        return f"{run.status.upper()}: {reason}"
    value = getattr(run, key)
    if value is None:
        return na
    if key in ("exact_match", "f1"):
        return f"{value:.2f}"
    if key == "wall_clock_seconds":
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value).replace("|", "/")


def format_markdown(runs: list[Run], base: Run | None, metric: str) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(_cell(r, key).replace("|", "/") for key, _ in COLUMNS) + " |" for r in runs]
    foot = []
    if base is not None:
        foot.append(f"speedup: {metric} of {base.run} / each run's" if SPEEDUP_METRICS[metric] == "time"
                    else f"speedup: each run's {metric} / {base.run}'s")
    foot.append("peak memory: cuda = CUDA peak allocated (max over ranks); rss = CPU peak RSS")
    return "\n".join([head, rule, *body]) + "\n\n" + "\n".join(foot) + "\n"


def _record(run: Run) -> dict[str, Any]:
    record = asdict(run)
    record.pop("loss_curve")
    record["procs_per_node"] = run.procs_per_node
    return record


def format_csv(runs: list[Run]) -> str:
    buffer = io.StringIO()
    records = [_record(r) for r in runs]
    fields = list(records[0]) if records else list(_record(Run()))
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: ";".join(v) if isinstance(v, list) else ("" if v is None else v) for k, v in record.items()})
    return buffer.getvalue()


def format_json(runs: list[Run], base: Run | None, metric: str) -> str:
    payload = {
        "baseline": base.run if base else None,
        "speedup_on": metric,
        "runs": [{**_record(r), "loss_curve": r.loss_curve} for r in runs],
    }
    return json.dumps(payload, indent=2) + "\n"


def write_plots(runs: list[Run], out_dir: str) -> list[str]:
    """loss_curves.png (overlaid), throughput.png and wall_time.png (bars; failed runs marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    curves = [r for r in runs if r.loss_curve]
    for run in curves:
        steps, losses = zip(*run.loss_curve)
        ax.plot(steps, losses, marker="o", markersize=3, label=run.run)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title("Training loss")
    if curves:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no loss curves found", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "loss_curves.png")
    fig.savefig(path)
    plt.close(fig)
    written.append(path)

    for name, key, label in (
        ("throughput.png", "train_samples_per_second", "train samples/s (all ranks)"),
        ("wall_time.png", "wall_clock_seconds", "wall clock seconds"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        labels = [r.run for r in runs]
        values = [getattr(r, key) or 0.0 for r in runs]
        colors = ["tab:blue" if r.ok else "tab:red" for r in runs]
        bars = ax.bar(range(len(runs)), values, color=colors)
        for bar, run in zip(bars, runs):
            value = getattr(run, key)
            text = f"{value:.3g}" if value is not None else (run.status if not run.ok else "n/a")
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=8)
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(label + " per run")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="log files, log dirs and output dirs (default: logs/ outputs/)")
    parser.add_argument("--baseline", help="run label, job name or job id the speedup is relative to "
                        "(default: the first successful run)")
    parser.add_argument("--speedup_on", default="train_runtime", choices=sorted(SPEEDUP_METRICS),
                        help="figure the speedup compares (default: train_runtime)")
    parser.add_argument("--format", default="md", choices=["md", "csv", "json"])
    parser.add_argument("--plot", metavar="DIR", help="write loss_curves.png, throughput.png, wall_time.png here")
    args = parser.parse_args(argv)

    paths = args.paths or [p for p in ("logs", "outputs") if os.path.exists(p)]
    if not paths:
        print("ERROR: no paths given and no logs/ or outputs/ here", file=sys.stderr)
        return 2
    runs, warnings = build_runs(paths)
    for warning in warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    if not runs:
        print(f"ERROR: no runs found in {' '.join(paths)} (looked for *.out/*.err/*.log and dirs with "
              "run_summary.json/all_results.json)", file=sys.stderr)
        return 2
    base, error = apply_speedup(runs, args.baseline, args.speedup_on)
    if error:
        print(f"ERROR: {error}", file=sys.stderr)
        return 2
    if args.format == "md":
        sys.stdout.write(format_markdown(runs, base, args.speedup_on))
    elif args.format == "csv":
        sys.stdout.write(format_csv(runs))
    else:
        sys.stdout.write(format_json(runs, base, args.speedup_on))
    if args.plot:
        for path in write_plots(runs, args.plot):
            print(f"PLOT={path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
