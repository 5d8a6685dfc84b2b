#!/usr/bin/env python
"""Run several commands on the same work, alternating, several times; report median ratios.

Alternating (A B C, then C B A, ...) spreads slow phases of a shared machine over
all commands instead of penalising whichever ran last. Each command is a shell
string with `{out}` where its output directory goes (emptied before each run); its closing
KEY=value lines (run_qa.py prints them), its wall time, and the figures of `{out}/all_results.json`
that its output lacks (HF's own run_qa.py prints its metrics as a table, and writes them there)
are collected.

    python -m bench.side_by_side --repeats 2 --workdir /tmp/sbs \
        --cmd "ours=python run_qa.py ... --output_dir {out}" \
        --cmd "hf_defaults=python run_qa.py ... --pad_to_max_length --output_dir {out}"

CPU time (user + sys of the command and its children) is reported beside wall time: on a
machine shared with other work it is far less disturbed than wall time.

Ratios are `other / first` for times (how many times longer than the first
command) and `first / other` for rates, so a value above 1 means the first
command is faster.

Achieved FLOP/s count useful FLOPs (real tokens only, qa_hpc/observe/efficiency.py). A command
that does not print ACHIEVED_TFLOPS (HF's script) gets the TRAIN_MODEL_TFLOP of the commands that
do, divided by its own train time: the commands of one comparison train on the same features,
so their useful work is the same. With --peak_tflops and --peak_bf16_tflops (bench/cpu_peak.py's
CPU_PEAK_TFLOPS and CPU_PEAK_BF16_TFLOPS) each run's achieved FLOP/s is also given as a fraction of the
peak of the precision it ran in: bf16 when its log says RUN_PRECISION=bf16 (ours) or its command asks
for --bf16 (HF's script), fp32 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time

# (key printed by run_qa.py, label, "time" | "rate" | "score")
METRICS = (
    ("wall_s", "end-to-end wall time (s)", "time"),
    ("cpu_s", "end-to-end CPU time, user+sys (s)", "time"),
    ("train_runtime", "train time (s)", "time"),
    ("train_samples_per_second", "train samples/s", "rate"),
    ("TRAIN_TOKENS_PER_SECOND", "train real tokens/s", "rate"),
    ("ACHIEVED_TFLOPS", "achieved TFLOP/s (useful FLOPs)", "rate"),
    ("peak_fraction", "fraction of CPU GEMM peak at the run's precision", "rate"),
    ("eval_runtime", "eval time (s; ours incl. postprocess, HF's script excl.)", "time"),
    ("eval_postprocess_seconds", "postprocess (s)", "time"),
    ("eval_exact_match", "EM", "score"),
    ("eval_f1", "F1", "score"),
)
_KV = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)\s*$")
RESULT_FILES = ("all_results.json",)  # the Trainer's save_metrics("all", ...) file: HF's script writes it


def parse_lines(text: str) -> dict[str, float]:
    """KEY=number lines of a run's output (the last value of a key wins)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _KV.match(line.strip())
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def file_figures(out_dir: str) -> dict[str, float]:
    """Numeric figures of the result files a run left in out_dir (none when there are none)."""
    out: dict[str, float] = {}
    for name in RESULT_FILES:
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            numbers = {
                k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            out.update({k: float(v) for k, v in numbers.items()})
    return out


def run_one(name: str, template: str, out_dir: str, log_path: str, timeout: float | None) -> dict[str, float]:
    """Run one command, tee its output to log_path, return its figures (wall_s measured here)."""
    cmd = template.replace("{out}", shlex.quote(out_dir))
    if os.path.isdir(out_dir):  # a run must not resume from (or refuse) an earlier sitting's output
        shutil.rmtree(out_dir)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # robust to other work on a shared machine
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    with open(log_path, "w", encoding="utf-8") as fh:
        fh.write(f"$ {cmd}\n{proc.stdout}")
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}; see {log_path}\n{proc.stdout[-2000:]}")
    figures = {**file_figures(out_dir), **parse_lines(proc.stdout)}  # printed lines win
    figures["wall_s"] = wall
    figures["cpu_s"] = cpu
    said = re.search(r"^RUN_PRECISION=(\w+)", proc.stdout, re.M)  # ours says; HF's script runs bf16 on --bf16
    figures["bf16"] = float(said.group(1) == "bf16" if said else "--bf16" in cmd.split())
    return figures


def add_flop_rates(
    runs: dict[str, list[dict[str, float]]], peak_tflops: float | None, peak_bf16_tflops: float | None = None
) -> None:
    """Fill ACHIEVED_TFLOPS where a run lacks it (same work as the runs that print it) and peak_fraction
    (against the peak of the run's precision: none for a bf16 run without a bf16 peak)."""
    work = [r["TRAIN_MODEL_TFLOP"] for rs in runs.values() for r in rs if "TRAIN_MODEL_TFLOP" in r]
    model_tflop = statistics.median(work) if work else None
    for rs in runs.values():
        for r in rs:
            if "ACHIEVED_TFLOPS" not in r and model_tflop and r.get("train_runtime"):
                r["ACHIEVED_TFLOPS"] = model_tflop / r["train_runtime"]
                r["achieved_tflops_from_shared_work"] = 1.0
            peak = peak_bf16_tflops if r.get("bf16") else peak_tflops
            if peak and "ACHIEVED_TFLOPS" in r:
                r["peak_fraction"] = r["ACHIEVED_TFLOPS"] / peak


def summarize(names: list[str], runs: dict[str, list[dict[str, float]]]) -> list[dict]:
    """Median of each metric per command, and its ratio against the first command."""
    base = names[0]
    rows = []
    for key, label, kind in METRICS:
        med = {}
        for n in names:
            vals = [r[key] for r in runs[n] if key in r]
            med[n] = statistics.median(vals) if vals else None
        row = {"metric": key, "label": label, "kind": kind, "median": med, "ratio": {}}
        for n in names[1:]:
            a, b = med[base], med[n]
            if a is None or b is None or kind == "score":
                continue
            if kind == "time" and a > 0:
                row["ratio"][n] = b / a
            elif kind == "rate" and b > 0:
                row["ratio"][n] = a / b
        rows.append(row)
    return rows


def print_table(names: list[str], rows: list[dict], repeats: int) -> None:
    base = names[0]
    head = (
        ["metric"]
        + [f"{n} (median of {repeats})" for n in names]
        + [f"{base} speedup vs {n}" for n in names[1:]]
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [row["label"]]
        for n in names:
            v = row["median"][n]
            cells.append("" if v is None else f"{v:.4g}")
        for n in names[1:]:
            r = row["ratio"].get(n)
            cells.append("" if r is None else f"{r:.2f}x")
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cmd", action="append", required=True, help="NAME=COMMAND with {out}; first is the base"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per command")
    parser.add_argument("--json_out", default=None, help="default: <workdir>/side_by_side.json")
    parser.add_argument(
        "--peak_tflops",
        type=float,
        default=None,
        help="the machine's fp32 GEMM TFLOP/s (python -m bench.cpu_peak): adds 'fraction of peak'",
    )
    parser.add_argument(
        "--peak_bf16_tflops",
        type=float,
        default=None,
        help="its bf16 GEMM TFLOP/s (CPU_PEAK_BF16_TFLOPS): the peak of the runs in bf16",
    )
    args = parser.parse_args(argv)
    commands = []
    for spec in args.cmd:
        name, sep, template = spec.partition("=")
        if not sep or not name or "{out}" not in template:
            parser.error(f"--cmd {spec!r}: expected NAME=COMMAND containing {{out}}")
        commands.append((name, template))
    names = [n for n, _ in commands]
    if len(set(names)) != len(names):
        parser.error("command names must differ")
    os.makedirs(args.workdir, exist_ok=True)
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for rep in range(args.repeats):
        order = commands if rep % 2 == 0 else commands[::-1]
        for name, template in order:
            out = os.path.join(args.workdir, f"{name}-rep{rep}")
            figures = run_one(
                name, template, out, os.path.join(args.workdir, f"{name}-rep{rep}.log"), args.timeout
            )
            runs[name].append(figures)
            print(
                f"RUN name={name} rep={rep} wall_s={figures['wall_s']:.1f} cpu_s={figures['cpu_s']:.1f} "
                f"train_runtime={figures.get('train_runtime', float('nan')):.1f} "
                f"eval_runtime={figures.get('eval_runtime', float('nan')):.1f} "
                f"eval_f1={figures.get('eval_f1', float('nan')):.2f}",
                flush=True,
            )
    add_flop_rates(runs, args.peak_tflops, args.peak_bf16_tflops)
    rows = summarize(names, runs)
    print_table(names, rows, args.repeats)
    for row in rows:
        for n, r in row["ratio"].items():
            print(f"SPEEDUP metric={row['metric']} base={names[0]} other={n} ratio={r:.3f}")
    path = args.json_out or os.path.join(args.workdir, "side_by_side.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(
            {
                "commands": dict(commands),
                "repeats": args.repeats,
                "runs": runs,
                "summary": rows,
                "host_cpus": os.cpu_count(),
                "peak_tflops": args.peak_tflops,
                "peak_bf16_tflops": args.peak_bf16_tflops,
            },
            fh,
            indent=2,
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
