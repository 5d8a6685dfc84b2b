#!/usr/bin/env python
"""Write a SQuAD file as flat JSON, {"version": ..., "data": [records]}: the shape HF's run_qa.py reads.

HF's example loads local files with `datasets`' json builder and `field="data"`, so it cannot read
the official nested files. Reading through the project's own reader (qa_hpc.squad_io, which
checks every record) keeps the records and their order exactly what our run_qa.py trains and
scores on, so `--first N` here selects the same N questions as our `--max_*_samples N`.

    python -m bench.flatten_squad ../shared/data/squad-v1.1/dev-v1.1.json /tmp/w/dev.flat.json --first 500
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from qa_hpc.atomic_io import write_text_atomic
from qa_hpc.squad_io import load_qa_records

FIELDS = ("id", "title", "context", "question", "answers")  # what HF's script reads; nothing else


def flatten(src: str, dst: str, first: int | None = None, split: str = "validation") -> int:
    """Write the first `first` records of src (all when None) to dst as flat JSON; return how many."""
    records, _report = load_qa_records(src, split=split)
    rows = [{k: r[k] for k in FIELDS} for r in records[:first]]
    write_text_atomic(dst, json.dumps({"version": "1.1", "data": rows}, ensure_ascii=False))
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "src", help="a SQuAD file in any form run_qa.py reads (official nested JSON included)"
    )
    parser.add_argument("dst", help="flat JSON to write")
    parser.add_argument("--first", type=int, default=None, help="keep only the first N questions")
    parser.add_argument("--split", default="validation", choices=("train", "validation"))
    args = parser.parse_args(argv)
    if not os.path.isfile(args.src):
        parser.error(f"{args.src}: no such file")
    n = flatten(args.src, args.dst, args.first, args.split)
    print(f"FLATTENED questions={n} src={args.src} dst={args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
