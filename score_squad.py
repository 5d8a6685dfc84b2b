"""Score a SQuAD predictions file against the dataset's gold answers.

    python score_squad.py DATASET.json PREDICTIONS.json [--version_2_with_negative]
        [--na_prob_file F] [--na_prob_thresh 1.0] [--out_file F] [--ignore_unknown_ids]

Prints one JSON line with the official metrics (see qa_hpc/metric/squad.py, which gives
the same numbers as evaluate-v1.1.py / evaluate-v2.0.py). Why a new CLI rather
than the official scripts: those crash with a traceback (or silently mis-score)
on bad input; here every input problem is reported with the file, the record and
the field, exits with status 2 and writes nothing. Unanswered questions score 0,
stay in the denominator and are summarized in one warning on stderr.

The dataset is read by the reader training uses (qa_hpc.data.squad_io), so any file
run_qa.py takes can be scored: the official nested JSON, flat JSON / JSON Lines, CSV or
Parquet. Only ids and answer texts are required, as by the official scripts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qa_hpc.atomic_io import OutputError, write_text_atomic
from qa_hpc.data.squad_io import DataError, load_references
from qa_hpc.errors import EXIT_USAGE
from qa_hpc.metric import squad as squad_metric

PROG = "score_squad.py"
SHOWN_IDS = 5


class InputError(Exception):
    """A problem with an input or output file; the message names the file."""


# --------------------------------------------------------------------------- reading


def read_json(path: str, what: str) -> Any:
    """Decoded JSON of ``path``; InputError for unreadable, non-UTF-8 or invalid JSON."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: {what} file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: {what} file is a directory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")  # a leading BOM is harmless; accept it
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: {what} file is not valid UTF-8 "
            f"(byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}: {what} file is not valid JSON: {exc.msg} "
            f"(line {exc.lineno}, column {exc.colno})"
        ) from None


def load_predictions(path: str) -> dict[str, str]:
    """id -> predicted text; every value must be a string."""
    predictions = read_json(path, "predictions")
    if not isinstance(predictions, dict):
        raise InputError(
            f"{path}: predictions must be a JSON object mapping question id to answer text, "
            f"got {squad_metric.json_type_name(predictions)}"
        )
    for qid, text in predictions.items():
        if not isinstance(text, str):
            raise InputError(
                f"{path}: prediction for id {qid!r} must be a string, "
                f"got {squad_metric.json_type_name(text)}"
            )
    return predictions


def load_na_probs(path: str) -> dict[str, float]:
    """id -> probability of no answer; every value must be a finite number."""
    na_probs = read_json(path, "na_prob")
    if not isinstance(na_probs, dict):
        raise InputError(
            f"{path}: na_prob file must be a JSON object mapping question id to a number, "
            f"got {squad_metric.json_type_name(na_probs)}"
        )
    for qid, prob in na_probs.items():
        if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not math.isfinite(prob):
            shown = prob if isinstance(prob, float) else squad_metric.json_type_name(prob)
            raise InputError(
                f"{path}: no-answer probability for id {qid!r} must be a finite number, got {shown}"
            )
    return na_probs


# --------------------------------------------------------------------------- checks


def _first_ids(ids: Sequence[str]) -> str:
    """Up to SHOWN_IDS quoted ids, with a count of the rest."""
    shown = ", ".join(repr(qid) for qid in ids[:SHOWN_IDS])
    rest = len(ids) - SHOWN_IDS
    return shown + (f", ... ({rest} more)" if rest > 0 else "")


def check_unknown(
    references: Mapping[str, Any], mapping: Mapping[str, Any], path: str, dataset: str, allow: bool
) -> None:
    """Ids not in the dataset usually mean the wrong file: error unless allowed."""
    unknown = squad_metric.unknown_ids(references, mapping)
    if not unknown:
        return
    message = f"{path}: {len(unknown)} id(s) are not questions of {dataset}: {_first_ids(unknown)}"
    if not allow:
        raise InputError(message + " (pass --ignore_unknown_ids to score anyway)")
    warn(message + "; ignored")


def check_has_gold_answers(references: Mapping[str, Sequence[str]], dataset: str) -> None:
    """SQuAD v1.1 scoring needs a gold answer for every question."""
    empty = [qid for qid, golds in references.items() if not golds]
    if empty:
        raise InputError(
            f"{dataset}: {len(empty)} question(s) have no gold answers "
            f"(field 'answers' empty or 'is_impossible' true): {_first_ids(empty)}; "
            "pass --version_2_with_negative to score SQuAD 2.0 data"
        )


def check_na_probs_cover(
    references: Mapping[str, Any], predictions: Mapping[str, str], na_probs: Mapping[str, float],
    path: str,
) -> None:
    """Every predicted question needs a no-answer probability."""
    absent = [qid for qid in references if qid in predictions and qid not in na_probs]
    if absent:
        raise InputError(
            f"{path}: no no-answer probability for {len(absent)} predicted question(s): "
            f"{_first_ids(absent)}"
        )


def warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


# --------------------------------------------------------------------------- output


def write_output(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file + rename): readers never see half a file."""
    try:
        write_text_atomic(path, text)
    except OutputError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise InputError(f"{path}: cannot write output file: {reason}") from None


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Official SQuAD v1.1 / v2.0 metrics for a predictions file.",
    )
    parser.add_argument(
        "dataset_file",
        help="SQuAD dataset: the official nested JSON, or flat JSON / JSON Lines / CSV / Parquet as run_qa.py reads",
    )
    parser.add_argument("prediction_file", help="JSON object: question id -> answer text")
    parser.add_argument(
        "--version_2_with_negative", action="store_true",
        help="score as SQuAD 2.0 (unanswerable questions; empty prediction = no answer)",
    )
    parser.add_argument(
        "--na_prob_file", help="v2 only: JSON object question id -> probability of no answer",
    )
    parser.add_argument(
        "--na_prob_thresh", type=float, default=None,
        help="v2 only: predict no answer when its probability exceeds this (default 1.0)",
    )
    parser.add_argument("--out_file", help="also write the metrics JSON here (atomically)")
    parser.add_argument(
        "--ignore_unknown_ids", action="store_true",
        help="warn instead of failing when predictions name ids not in the dataset",
    )
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.version_2_with_negative:
        for flag in ("na_prob_file", "na_prob_thresh"):
            if getattr(args, flag) is not None:
                parser.error(f"--{flag} requires --version_2_with_negative")
    if args.na_prob_thresh is None:
        args.na_prob_thresh = 1.0
    elif math.isnan(args.na_prob_thresh):
        parser.error("--na_prob_thresh must be a number, not nan")
    return args


def compute(args: argparse.Namespace) -> dict[str, float | int]:
    """Load and validate every input, then score; raises InputError on bad input."""
    dataset = args.dataset_file
    references = load_references(dataset)
    predictions = load_predictions(args.prediction_file)
    check_unknown(references, predictions, args.prediction_file, dataset, args.ignore_unknown_ids)
    na_probs = None
    if args.na_prob_file:
        na_probs = load_na_probs(args.na_prob_file)
        check_unknown(references, na_probs, args.na_prob_file, dataset, args.ignore_unknown_ids)
        check_na_probs_cover(references, predictions, na_probs, args.na_prob_file)
    if not args.version_2_with_negative:
        check_has_gold_answers(references, dataset)

    missing = squad_metric.missing_ids(references, predictions)
    if missing:
        warn(
            f"{len(missing)} of {len(references)} question(s) in {dataset} have no prediction in "
            f"{args.prediction_file} and will receive score 0: {_first_ids(missing)}"
        )
    if args.version_2_with_negative:
        return squad_metric.score_v2(references, predictions, na_probs, args.na_prob_thresh)
    return squad_metric.score_v1(references, predictions)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = compute(args)
        line = json.dumps(result)
        if args.out_file:
            write_output(args.out_file, line + "\n")
    except (InputError, DataError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
