#!/usr/bin/env python
"""Compare the answers and scores of several evaluations of the same questions.

Each run is NAME=DIR where DIR holds `eval_predictions.json` ({id: answer text}) and
`eval_results.json` (eval_exact_match, eval_f1): both our run_qa.py and HF's write these.
The first run is the reference. For every other run it prints how many of the reference's
questions got the very same answer text, and its EM/F1 beside the reference's:

    PREDICTIONS name=hf_grouped ref=hf_padded same=1 of=100 em=0.00 f1=3.10 ref_em=... ref_f1=...

With --max_diff D it also checks that EM and F1 of every run are within D points of the
reference's (AGREEMENT line) and exits 1 when they are not.

    python -m bench.compare_predictions ours=/tmp/a/ours hf=/tmp/a/hf_eval --max_diff 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def load_run(directory: str) -> tuple[dict[str, str], dict[str, float]]:
    """(id -> answer, eval results) of one evaluation's output directory."""
    with open(os.path.join(directory, "eval_predictions.json"), encoding="utf-8") as fh:
        answers = json.load(fh)
    with open(os.path.join(directory, "eval_results.json"), encoding="utf-8") as fh:
        results = json.load(fh)
    return answers, results


def agreement(ref: dict[str, str], other: dict[str, str]) -> tuple[int, int]:
    """(questions of ref answered with the same text in other, questions of ref)."""
    same = sum(1 for qid, text in ref.items() if other.get(qid) == text)
    return same, len(ref)


def compare(runs: list[tuple[str, str]], max_diff: float | None) -> tuple[list[str], bool]:
    """Output lines and whether every run's EM/F1 is within max_diff of the first's."""
    (ref_name, ref_dir), *rest = runs
    ref_answers, ref_res = load_run(ref_dir)
    ref_em = ref_res["eval_exact_match"]
    ref_f1 = ref_res["eval_f1"]
    lines = [
        f"PREDICTIONS name={ref_name} ref={ref_name} same={len(ref_answers)} of={len(ref_answers)} "
        f"em={ref_em:.4f} f1={ref_f1:.4f}"
    ]
    ok = True
    for name, directory in rest:
        answers, res = load_run(directory)
        same, total = agreement(ref_answers, answers)
        em = res["eval_exact_match"]
        f1 = res["eval_f1"]
        lines.append(
            f"PREDICTIONS name={name} ref={ref_name} same={same} of={total} em={em:.4f} f1={f1:.4f} "
            f"ref_em={ref_em:.4f} ref_f1={ref_f1:.4f}"
        )
        if max_diff is not None:
            em_diff = abs(em - ref_em)
            f1_diff = abs(f1 - ref_f1)
            within = em_diff <= max_diff and f1_diff <= max_diff
            ok = ok and within
            lines.append(
                f"AGREEMENT name={name} ref={ref_name} em_diff={em_diff:.4f} f1_diff={f1_diff:.4f} "
                f"max_diff={max_diff} ok={int(within)}"
            )
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", help="NAME=DIR; the first is the reference")
    parser.add_argument("--max_diff", type=float, default=None, help="EM/F1 points allowed between runs")
    args = parser.parse_args(argv)
    runs = []
    for spec in args.runs:
        name, sep, directory = spec.partition("=")
        if not sep or not name:
            parser.error(f"{spec!r}: expected NAME=DIR")
        if not os.path.isfile(os.path.join(directory, "eval_predictions.json")):
            parser.error(f"{spec!r}: no eval_predictions.json in {directory}")
        runs.append((name, directory))
    if len(runs) < 2:
        parser.error("give at least two runs")
    lines, ok = compare(runs, args.max_diff)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
