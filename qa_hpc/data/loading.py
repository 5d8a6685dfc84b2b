"""Examples and features of each split a run needs: read, validated, tokenized once, cached.

Local files go through the one SQuAD reader (qa_hpc.data.squad_io), which checks every
record before anything runs; hub datasets through `datasets.load_dataset`. Tokenized
features are cached by a fingerprint of everything they depend on (features_cache), written
by one process per filesystem (qa_hpc.dist.first_on_each_filesystem) and reused by the others.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import datasets

from qa_hpc.data.features import FeatureConfig, prepare_train_features, prepare_validation_features, real_lengths
from qa_hpc.data.features_cache import cache_files_in, features_cache_file
from qa_hpc.data.squad_io import load_qa_records
from qa_hpc.dist import first_on_each_filesystem
from qa_hpc.errors import UsageError
from qa_hpc.model import from_disk_or_hub
from qa_hpc.flags import DataTrainingArguments, ModelArguments

logger = logging.getLogger(__name__)

SPLIT_FLAGS = {"train": "train_file", "validation": "validation_file", "test": "test_file"}
LOG_NAMES = {"train": "train", "validation": "eval", "test": "predict"}  # split names in log lines and cache folders


@dataclass
class QAData:
    """Examples and their features for each split that runs."""

    train: datasets.Dataset | None = None
    eval_examples: datasets.Dataset | None = None
    eval_features: datasets.Dataset | None = None
    predict_examples: datasets.Dataset | None = None
    predict_features: datasets.Dataset | None = None


def load_split(data_args: DataTrainingArguments, model_args: ModelArguments, split: str,
               limit: int | None) -> datasets.Dataset:
    """Examples of one split: from a local file in any supported form, else from the hub."""
    path = getattr(data_args, SPLIT_FLAGS[split])
    if path is not None:
        records, report = load_qa_records(path, split=split, version_2_with_negative=data_args.version_2_with_negative,
                                          answer_check=data_args.answer_check)
        logger.info("%s split=%s", report.summary(), split)
        dataset = datasets.Dataset.from_list(records)
    else:
        if not data_args.dataset_name:
            raise UsageError(f"no --{SPLIT_FLAGS[split]} and no --dataset_name to read the {split} split from")
        with from_disk_or_hub("dataset", data_args.dataset_name, model_args.cache_dir):
            hub = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name,
                                        cache_dir=model_args.cache_dir, token=model_args.token)
        if split not in hub:
            raise UsageError(f"dataset {data_args.dataset_name} has no '{split}' split (has {list(hub)})")
        dataset = hub[split]
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return dataset


def featurize(examples: datasets.Dataset, fn: Any, tokenizer: Any, cfg: FeatureConfig,
              data_args: DataTrainingArguments, training_args: Any, split: str) -> datasets.Dataset:
    """Tokenize into the features cache, one writer per filesystem; the others read what it wrote."""
    name = LOG_NAMES[split]
    cache_file = features_cache_file(data_args.features_cache_dir, name, examples, fn, tokenizer, cfg,
                                     (data_args.version_2_with_negative, data_args.answer_check))
    with first_on_each_filesystem():
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        before, t0 = cache_files_in(cache_file), time.time()
        features = examples.map(
            fn, batched=True, fn_kwargs={"tokenizer": tokenizer, "cfg": cfg},
            num_proc=data_args.preprocessing_num_workers, remove_columns=examples.column_names,
            load_from_cache_file=not data_args.overwrite_cache, cache_file_name=cache_file, desc=f"{name} features",
        )
        computed = cache_files_in(cache_file) != before or data_args.overwrite_cache or not before
        logger.info("FEATURES_CACHE split=%s %s in %.1fs features=%d path=%s", name,
                    "computed" if computed else "reused", time.time() - t0, len(features), cache_file)
    log_token_counts(name, features, data_args.max_seq_length)
    return features


def log_token_counts(split: str, features: datasets.Dataset, max_seq_length: int) -> None:
    """How many tokens are real, against padding every feature to max_seq_length."""
    real = int(real_lengths(features).sum())
    n = len(features)
    logger.info("TOKENS split=%s features=%d real_tokens=%d tokens_at_max_length=%d mean_len=%.1f",
                split, n, real, n * max_seq_length, real / max(1, n))


def build_data(model_args: ModelArguments, data_args: DataTrainingArguments, training_args: Any,
               tokenizer: Any) -> QAData:
    """Load and featurize each split the flags ask for (every record is checked here, before training)."""

    def features_of(examples: datasets.Dataset, fn: Any, split: str) -> datasets.Dataset:
        source = getattr(data_args, SPLIT_FLAGS[split]) or data_args.dataset_name or split
        cfg = FeatureConfig(data_args.max_seq_length, data_args.doc_stride, data_args.pad_to_max_length, str(source))
        return featurize(examples, fn, tokenizer, cfg, data_args, training_args, split)

    data = QAData()
    if training_args.do_train:
        train = load_split(data_args, model_args, "train", data_args.max_train_samples)
        data.train = features_of(train, prepare_train_features, "train")
    if training_args.do_eval:
        data.eval_examples = load_split(data_args, model_args, "validation", data_args.max_eval_samples)
        data.eval_features = features_of(data.eval_examples, prepare_validation_features, "validation")
    if training_args.do_predict:
        data.predict_examples = load_split(data_args, model_args, "test", data_args.max_predict_samples)
        data.predict_features = features_of(data.predict_examples, prepare_validation_features, "test")
    return data
