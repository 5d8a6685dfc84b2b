#!/usr/bin/env python
"""Postprocessing micro-benchmark on a whole dev set: the HF example's loop vs ours (vectorized), same logits.

The loop is the tests' oracle, tests/fixtures/postprocess_loop.py (run from the checkout's root). Checks that
both return identical answers, n-best lists (order, scores, probabilities) and v2 null odds, then reports
median times and the speedup. Three comparisons, all reported:

(a) as run_qa.py runs it: examples and features as datasets.Dataset objects, logits as the Trainer hands
    them, the padding mask applied, then each path reads the datasets its own way: the loop through
    dataset["col"] item by item, as the HF example does; ours through the Arrow columns
    (qa_hpc.postprocess.predictions_from_logits). Conversion is included. KEY=value line: POSTPROCESS_DATASET.
(b) the algorithm alone: the loop from pre-built Python lists; the vectorized path
    from the same lists and from a pyarrow array of the offsets. KEY=value line: POSTPROCESS.
(c) what an eval pays in all: (a) plus writing the prediction files (answers, n-best lists, v2 null
    odds) as run_qa.py writes them (qa_hpc.postprocess.write_prediction_files). The files of both paths must
    hold the same JSON values. KEY=value line: POSTPROCESS_WRITE.

    python -m bench.dev_logits --validation_file ../shared/data/squad-v1.1/dev-v1.1.json
    python -m bench.postprocess_bench --validation_file ../shared/data/squad-v1.1/dev-v1.1.json
    python -m bench.postprocess_bench ... --sizes 1000,2000,5000,10570   # postprocess time vs examples
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.dev_logits import add_args, load_or_build
from qa_hpc.features import real_lengths
from qa_hpc.postprocess import (
    PostprocessConfig,
    QAPredictions,
    mask_padding,
    postprocess_qa_predictions,
    predictions_from_logits,
    write_prediction_files,
)
from tests.fixtures.postprocess_loop import postprocess_qa_predictions_loop


def _time(fn, repeats: int) -> tuple[float, float, object]:
    """(median wall seconds, median CPU seconds of this process, last result).

    CPU seconds are reported beside wall time because a shared machine inflates
    wall time by however much other work it runs at the moment.
    """
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), out


def subset(dev, n_examples: int):
    """The first n examples and exactly their features/logit rows."""
    keep = set(dev.examples["id"][:n_examples])
    rows = [i for i, e in enumerate(dev.features["example_id"]) if e in keep]
    examples = {k: v[:n_examples] for k, v in dev.examples.items()}
    features = {k: [v[i] for i in rows] for k, v in dev.features.items()}
    return examples, features, (dev.start_logits[rows], dev.end_logits[rows])


def compare(a, b) -> list[str]:
    """Ids whose answers, n-best lists or null odds differ (exact equality)."""
    bad = [q for q in a.answers if a.answers[q] != b.answers.get(q) or a.nbest[q] != b.nbest.get(q)]
    if (a.null_odds or {}) != (b.null_odds or {}):
        bad += [q for q in (a.null_odds or {}) if a.null_odds[q] != (b.null_odds or {}).get(q)]
    if set(a.answers) != set(b.answers):
        bad.append("<different id sets>")
    return bad


def as_datasets(examples, features):
    """Examples and features as the eval datasets run_qa.py holds (attention_mask gives real lengths)."""
    import datasets

    ex_ds = datasets.Dataset.from_dict({"id": examples["id"], "context": examples["context"]})
    feat_ds = datasets.Dataset.from_dict(
        {
            "example_id": features["example_id"],
            "offset_mapping": [
                [list(o) if o is not None else None for o in row] for row in features["offset_mapping"]
            ],
            "attention_mask": [[1] * len(row) for row in features["offset_mapping"]],
        }
    )
    return ex_ds, feat_ds


def loop_from_datasets(ex_ds, feat_ds, logits: tuple, cfg: PostprocessConfig) -> QAPredictions:
    """The loop as the HF example runs it in an eval: the padding mask, then each column looked up once and
    read item by item (each item a dataset row read)."""
    logits = mask_padding(logits, real_lengths(feat_ds))
    examples = {"id": ex_ds["id"], "context": ex_ds["context"]}
    features = {"example_id": feat_ds["example_id"], "offset_mapping": feat_ds["offset_mapping"]}
    return postprocess_qa_predictions_loop(examples, features, logits, cfg)


def _timings(
    examples: dict, features: dict, logits: tuple, cfg: PostprocessConfig, repeats: int, loop_repeats: int
) -> dict[str, tuple[float, float, object]]:
    """(median wall s, median CPU s, result) of each way of running (a), (b) and (c) on the same input."""
    import pyarrow as pa

    arrow_feats = {
        "example_id": features["example_id"],
        "offset_mapping": pa.array(features["offset_mapping"]),
    }
    ex_ds, feat_ds = as_datasets(examples, features)
    t = {
        "loop": _time(lambda: postprocess_qa_predictions_loop(examples, features, logits, cfg), loop_repeats),
        "lists": _time(lambda: postprocess_qa_predictions(examples, features, logits, cfg), repeats),
        "arrow": _time(lambda: postprocess_qa_predictions(examples, arrow_feats, logits, cfg), repeats),
        "loop_ds": _time(lambda: loop_from_datasets(ex_ds, feat_ds, logits, cfg), loop_repeats),
        "vec_ds": _time(lambda: predictions_from_logits(ex_ds, feat_ds, logits, cfg), repeats),
    }
    out_dir = tempfile.mkdtemp(prefix="postprocess_bench_")
    paths = {"loop": loop_from_datasets, "vectorized": predictions_from_logits}
    try:

        def run_and_write(path: str) -> list[bytes]:
            preds = paths[path](ex_ds, feat_ds, logits, cfg)
            written = write_prediction_files(preds, os.path.join(out_dir, path), "eval")
            return [Path(f).read_bytes() for f in written]

        t["loop_w"] = _time(lambda: run_and_write("loop"), loop_repeats)
        t["vec_w"] = _time(lambda: run_and_write("vectorized"), repeats)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return t


def _mismatches(t: dict[str, tuple[float, float, object]]) -> list[str]:
    """Ids (or files) where any way of running differs from the loop on lists."""
    ref = t["loop"][2]
    bad = [q for name in ("lists", "arrow", "loop_ds", "vec_ds") for q in compare(ref, t[name][2])]
    if [json.loads(f) for f in t["loop_w"][2]] != [json.loads(f) for f in t["vec_w"][2]]:
        bad.append("<prediction files hold different JSON values>")
    return bad


def _row(
    examples: dict, features: dict, cfg: PostprocessConfig, t: dict[str, tuple[float, float, object]]
) -> dict:
    """The figures of one size, as the JSON report and the KEY=value lines name them."""
    bad = _mismatches(t)
    wall = {name: timing[0] for name, timing in t.items()}
    cpu = {name: timing[1] for name, timing in t.items()}
    return {
        "examples": len(examples["id"]),
        "features": len(features["example_id"]),
        "v2": cfg.version_2_with_negative,
        "loop_s": round(wall["loop"], 4),
        "vectorized_lists_s": round(wall["lists"], 4),
        "vectorized_arrow_s": round(wall["arrow"], 4),
        "speedup_lists": round(wall["loop"] / wall["lists"], 1),
        "speedup_arrow": round(wall["loop"] / wall["arrow"], 1),
        "loop_cpu_s": round(cpu["loop"], 4),
        "vectorized_lists_cpu_s": round(cpu["lists"], 4),
        "vectorized_arrow_cpu_s": round(cpu["arrow"], 4),
        "cpu_speedup_lists": round(cpu["loop"] / cpu["lists"], 1),
        "cpu_speedup_arrow": round(cpu["loop"] / cpu["arrow"], 1),
        "dataset_loop_s": round(wall["loop_ds"], 4),
        "dataset_vectorized_s": round(wall["vec_ds"], 4),
        "dataset_speedup": round(wall["loop_ds"] / wall["vec_ds"], 1),
        "dataset_loop_cpu_s": round(cpu["loop_ds"], 4),
        "dataset_vectorized_cpu_s": round(cpu["vec_ds"], 4),
        "dataset_cpu_speedup": round(cpu["loop_ds"] / cpu["vec_ds"], 1),
        "write_loop_s": round(wall["loop_w"], 4),
        "write_vectorized_s": round(wall["vec_w"], 4),
        "write_speedup": round(wall["loop_w"] / wall["vec_w"], 1),
        "write_loop_cpu_s": round(cpu["loop_w"], 4),
        "write_vectorized_cpu_s": round(cpu["vec_w"], 4),
        "write_cpu_speedup": round(cpu["loop_w"] / cpu["vec_w"], 1),
        "nbest_file_bytes": len(t["vec_w"][2][1]),
        "identical": not bad,
        "mismatched_ids": len(set(bad)),
    }


def _print_row(row: dict) -> None:
    """The three KEY=value lines of one row."""
    print(
        f"POSTPROCESS examples={row['examples']} features={row['features']} loop_s={row['loop_s']} "
        f"vectorized_lists_s={row['vectorized_lists_s']} vectorized_arrow_s={row['vectorized_arrow_s']} "
        f"speedup_lists={row['speedup_lists']} speedup_arrow={row['speedup_arrow']} "
        f"loop_cpu_s={row['loop_cpu_s']} vectorized_lists_cpu_s={row['vectorized_lists_cpu_s']} "
        f"vectorized_arrow_cpu_s={row['vectorized_arrow_cpu_s']} "
        f"cpu_speedup_lists={row['cpu_speedup_lists']} "
        f"cpu_speedup_arrow={row['cpu_speedup_arrow']} "
        f"identical={row['identical']} mismatched_ids={row['mismatched_ids']}",
        flush=True,
    )
    print(
        f"POSTPROCESS_DATASET examples={row['examples']} features={row['features']} "
        f"loop_s={row['dataset_loop_s']} vectorized_s={row['dataset_vectorized_s']} "
        f"speedup={row['dataset_speedup']} loop_cpu_s={row['dataset_loop_cpu_s']} "
        f"vectorized_cpu_s={row['dataset_vectorized_cpu_s']} cpu_speedup={row['dataset_cpu_speedup']} "
        f"identical={row['identical']}",
        flush=True,
    )
    print(
        f"POSTPROCESS_WRITE examples={row['examples']} loop_s={row['write_loop_s']} "
        f"vectorized_s={row['write_vectorized_s']} speedup={row['write_speedup']} "
        f"loop_cpu_s={row['write_loop_cpu_s']} vectorized_cpu_s={row['write_vectorized_cpu_s']} "
        f"cpu_speedup={row['write_cpu_speedup']} nbest_file_bytes={row['nbest_file_bytes']} "
        f"identical={row['identical']}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_args(parser)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the vectorized path (median)")
    parser.add_argument("--loop_repeats", type=int, default=1, help="timed runs of the loop (median)")
    parser.add_argument("--sizes", default="", help="comma-separated example counts for a scaling table")
    parser.add_argument(
        "--version_2_with_negative", action="store_true", help="postprocess as v2 (null answers)"
    )
    parser.add_argument("--json_out", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    dev, path, reused = load_or_build(args)
    cfg = PostprocessConfig(version_2_with_negative=args.version_2_with_negative)
    sizes = [int(s) for s in args.sizes.split(",") if s] or [len(dev.examples["id"])]
    print(f"# logits: {dev.source} ({'reused' if reused else 'computed'} {path}); cpu_count={os.cpu_count()}")
    rows = []
    for n in sizes:
        examples, features, logits = subset(dev, n)
        # as run_qa.py does before either path: logits past each feature's real length set to -100
        logits = mask_padding(logits, np.array([len(r) for r in features["offset_mapping"]]))
        rows.append(
            _row(
                examples,
                features,
                cfg,
                _timings(examples, features, logits, cfg, args.repeats, args.loop_repeats),
            )
        )
        _print_row(rows[-1])
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump({"source": dev.source, "rows": rows}, fh, indent=2)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
