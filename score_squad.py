"""Score a SQuAD predictions file against the dataset's gold answers.

    python score_squad.py DATASET.json PREDICTIONS.json [--version_2_with_negative]
        [--na_prob_file F] [--na_prob_thresh 1.0] [> scores.json]

Prints one JSON line with the official evaluate-v1.1.py / evaluate-v2.0.py numbers (qa_hpc/metric/squad.py).
Unlike the official scripts, which crash or mis-score silently on bad input, every input problem names the
file, the record and the field and exits with status 2, printing no scores. Questions without a prediction
(they score 0) and ids the dataset does not hold (ignored, as officially) are warnings on stderr. The dataset
may be any file run_qa.py reads. Light on purpose: neither torch, datasets nor transformers is imported.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from qa_hpc.errors import EXIT_USAGE, UsageError
from qa_hpc.metric.squad import Scores, first_ids, score_v1, score_v2
from qa_hpc.squad_io import load_references

PROG = "score_squad.py"


def json_type_name(value: object) -> str:
    names = {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        dict: "an object",
        list: "an array",
        str: "a string",
    }
    return names.get(type(value), type(value).__name__)


def read_mapping_file(path: str, what: str, mapping: str) -> dict:
    """The JSON object in ``path`` (a UTF-8 BOM is accepted); UsageError naming the file otherwise."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: {what} file not found") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: {what} file is a directory") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what} file: {exc.strerror or exc}") from None
    try:
        value = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path}: {what} file is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path}: {what} file is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(value, dict):
        raise UsageError(
            f"{path}: {what} must be a JSON object mapping {mapping}, got {json_type_name(value)}"
        )
    return value


def warn_unknown(
    references: Mapping[str, object], mapping: Mapping[str, object], path: str, dataset: str
) -> None:
    """Ids not in the dataset are ignored, as the official scripts ignore them; many usually mean the wrong
    file, so they are named."""
    unknown = [qid for qid in mapping if qid not in references]
    if unknown:
        print(
            f"{PROG}: warning: {path}: {len(unknown)} id(s) are not questions of {dataset}: "
            f"{first_ids(unknown)}; ignored",
            file=sys.stderr,
        )


class _Parser(argparse.ArgumentParser):
    """A usage error is one ERROR line and exit 2, as every other failure of this project's commands."""

    def error(self, message: str) -> NoReturn:
        print(f"ERROR: {message} (python {PROG} --help lists the arguments)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog=PROG,
        description="Official SQuAD v1.1 / v2.0 metrics for a predictions file.",
        allow_abbrev=False,  # a flag's prefix is a typo, not the flag
    )
    parser.add_argument(
        "dataset_file",
        help="SQuAD dataset: the official nested JSON, or flat JSON / JSON Lines as run_qa.py reads",
    )
    parser.add_argument("prediction_file", help="JSON object: question id -> answer text")
    parser.add_argument(
        "--version_2_with_negative",
        action="store_true",
        help="score as SQuAD 2.0 (unanswerable questions; empty prediction = no answer)",
    )
    parser.add_argument("--na_prob_file", help="v2 only: JSON object question id -> probability of no answer")
    parser.add_argument(
        "--na_prob_thresh",
        type=float,
        default=None,
        help="v2 only: predict no answer when its probability exceeds this (default 1.0)",
    )
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


def compute(args: argparse.Namespace) -> Scores:
    """Read and check every input, then score (unanswered questions score 0, summarized in one warning)."""
    dataset = args.dataset_file
    pred_file = args.prediction_file
    na_file = args.na_prob_file
    references = load_references(dataset)
    predictions = read_mapping_file(pred_file, "predictions", "question id to answer text")
    warn_unknown(references, predictions, pred_file, dataset)
    for qid, text in predictions.items():
        if not isinstance(text, str):
            raise UsageError(
                f"{pred_file}: prediction for id {qid!r} must be a string, got {json_type_name(text)}"
            )
    na_probs = None
    if na_file:
        na_probs = read_mapping_file(na_file, "na_prob", "question id to a number")
        for qid, prob in na_probs.items():
            if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not math.isfinite(prob):
                shown = prob if isinstance(prob, float) else json_type_name(prob)
                raise UsageError(
                    f"{na_file}: no-answer probability for id {qid!r} must be a finite number, got {shown}"
                )
        warn_unknown(references, na_probs, na_file, dataset)
        absent = [qid for qid in references if qid in predictions and qid not in na_probs]
        if absent:
            raise UsageError(
                f"{na_file}: no no-answer probability for {len(absent)} predicted question(s): "
                f"{first_ids(absent)}"
            )
    try:
        if args.version_2_with_negative:
            result = score_v2(references, predictions, na_probs, args.na_prob_thresh)
        else:
            result = score_v1(references, predictions)
    except ValueError as exc:  # v1: questions without gold answers
        raise UsageError(f"{dataset}: {exc}") from None
    missing = [qid for qid in references if qid not in predictions]
    if missing:
        print(
            f"{PROG}: warning: {len(missing)} of {len(references)} question(s) in {dataset} have no "
            f"prediction in {pred_file} and will receive score 0: {first_ids(missing)}",
            file=sys.stderr,
        )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        line = json.dumps(compute(args))
    except UsageError as exc:  # DataError among them
        print(f"ERROR: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
