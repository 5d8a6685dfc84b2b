#!/usr/bin/env python
"""One row per run from the runs' records: where runs went, how fast, how good, how big.

    python -m qa_hpc.tools.collect_results                          # logs/ and outputs/ of the checkout
    python -m qa_hpc.tools.collect_results logs/ outputs/ --baseline bert_squad_ft3 --format md
    python -m qa_hpc.tools.collect_results outputs/ --format csv > runs.csv
    python -m qa_hpc.tools.collect_results logs/ outputs/ --plot plots/  # loss_curves, throughput, wall_time .png

Every figure comes from the run's record, <output_dir>/run_summary.json (and the loss curve
from trainer_state.json). A job log (`name-jobid.out`) is matched to its record by job id;
a run that never wrote a record (it failed before its inputs were checked, is still running,
or was killed) is shown from its log: failed with the log's last `ERROR:` line, or incomplete.
Missing figures read n/a. Speedup is baseline/run for times and run/baseline for throughput
(--speedup_on), against --baseline (a run label, job name or job id) or else the first
successful row; only runs that ended ok get one.
"""

from __future__ import annotations

import argparse
import os
import sys

from qa_hpc.tools.collect.plots import write_plots
from qa_hpc.tools.collect.runs import build_rows
from qa_hpc.tools.collect.table import SPEEDUP_ON, add_speedup, frame, pick_baseline, to_csv, to_json, to_markdown


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m qa_hpc.tools.collect_results",
                                     description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="job logs, log dirs, output dirs and dirs of output dirs "
                        "(default: logs/ outputs/)")
    parser.add_argument("--baseline", help="run label, job name or job id the speedup is relative to "
                        "(default: the first successful run)")
    parser.add_argument("--speedup_on", default="train_runtime", choices=sorted(SPEEDUP_ON),
                        help="figure the speedup compares (default: train_runtime)")
    parser.add_argument("--format", default="md", choices=["md", "csv", "json"])
    parser.add_argument("--plot", metavar="DIR", help="write loss_curves.png, throughput.png, wall_time.png here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paths = args.paths or [p for p in ("logs", "outputs") if os.path.exists(p)]
    if not paths:
        print("ERROR: no paths given and no logs/ or outputs/ here", file=sys.stderr)
        return 2
    rows, warnings = build_rows(paths)
    for warning in warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    if not rows:
        print(f"ERROR: no runs found in {' '.join(paths)} (looked for *.out/*.err/*.log and dirs with "
              "run_summary.json)", file=sys.stderr)
        return 2
    table = frame(rows)
    base, error = pick_baseline(table, args.baseline, args.speedup_on)
    if error:
        print(f"ERROR: {error}", file=sys.stderr)
        return 2
    table = add_speedup(table, base, args.speedup_on)
    if args.format == "md":
        sys.stdout.write(to_markdown(table, base, args.speedup_on))
    elif args.format == "csv":
        sys.stdout.write(to_csv(table))
    else:
        sys.stdout.write(to_json(table, base, args.speedup_on))
    if args.plot:
        for path in write_plots(table, args.plot):
            print(f"PLOT={path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
