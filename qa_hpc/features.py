"""Examples of each split -> token windows of at most ``max_seq_length`` tokens overlapping by ``doc_stride``.

Train windows are labelled with the answer's token span when they hold the whole answer, else with the CLS
token; eval windows keep context offsets and their example's id, so logits can be turned back into text.
Checked records of a local file are fingerprinted by the file's bytes and the reading options, so datasets'
own ``map`` cache finds the features again (one process per filesystem writes it).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
from datasets.fingerprint import Hasher

from qa_hpc import squad_io, squad_records
from qa_hpc.dist import first_on_each_filesystem, launch_env
from qa_hpc.errors import UsageError, check_writable_dir
from qa_hpc.squad_io import check_dataset_rows, load_qa_records
from qa_hpc.squad_records import LoadedFile

# annotations only: postprocessing and utils_qa import this module without the model stack
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from qa_hpc.flags import DataTrainingArguments, ModelArguments, QATrainingArguments

logger = logging.getLogger(__name__)

# each split's name in log lines and cache folders: the stage that reads it
STAGE_OF_SPLIT = {"train": "train", "validation": "eval", "test": "predict"}
_TEXT = datasets.Value("string")
# given, not inferred: a first batch of unanswerable records has no types
RECORD_FEATURES = datasets.Features(
    {
        "id": _TEXT,
        "title": _TEXT,
        "context": _TEXT,
        "question": _TEXT,
        "answers": {"text": datasets.List(_TEXT), "answer_start": datasets.List(datasets.Value("int64"))},
    }
)


class FeatureError(UsageError):
    """A record that cannot be turned into features: its id, the field and why. build_data names the
    record's place in its file: the tokenizing processes know only its id."""

    def __init__(self, record_id: str, field: str, why: str) -> None:
        super().__init__(f"record id={record_id!r}: field '{field}' {why}")
        self.record_id = record_id
        self.field = field
        self.why = why

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        # raised in a --preprocessing_num_workers process, rebuilt in the main one as it was made
        return type(self), (self.record_id, self.field, self.why)


@dataclass(frozen=True)
class FeatureConfig:
    """How examples are cut into windows."""

    max_seq_length: int = 384
    doc_stride: int = 128
    pad_to_max_length: bool = False


def _tokenize(
    examples: Mapping[str, list], tokenizer: PreTrainedTokenizerBase, cfg: FeatureConfig
) -> tuple[Any, list[int], int]:
    """Windows of question + context (context + question for left-padding tokenizers), each window's example
    index, and the sequence id of the context."""
    special = tokenizer.num_special_tokens_to_add(pair=True)
    for qid, ids in zip(
        examples["id"], tokenizer(examples["question"], add_special_tokens=False)["input_ids"]
    ):
        room = cfg.max_seq_length - len(ids) - special
        # checked here: the fast tokenizer would fail with an opaque Rust error
        if room <= cfg.doc_stride:
            raise FeatureError(
                qid,
                "question",
                f"has {len(ids)} tokens, leaving {room} for the context at --max_seq_length "
                f"{cfg.max_seq_length} (needs more than --doc_stride {cfg.doc_stride}); shorten the "
                "question, raise --max_seq_length or lower --doc_stride",
            )
    questions = [q.lstrip() for q in examples["question"]]
    right = tokenizer.padding_side == "right"  # BERT-style: question first, context truncated
    tokenized = tokenizer(
        questions if right else examples["context"],
        examples["context"] if right else questions,
        truncation="only_second" if right else "only_first",
        max_length=cfg.max_seq_length,
        stride=cfg.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if cfg.pad_to_max_length else False,
        # whatever side the tokenizer pads (it puts a left-padding model's context first, above): the
        # padding goes last, where the logits' masks expect it (postprocess.mask_padding, batching.span_loss)
        padding_side="right",
    )
    return tokenized, tokenized.pop("overflow_to_sample_mapping"), 1 if right else 0


def _checked_sequence_ids(
    tokenized: Any, window: int, context_index: int, examples: Mapping[str, list], example_index: int
) -> list[int | None]:
    """The sequence ids of a window, which must hold context tokens: a context of characters the tokenizer
    drops (zero-width spaces) passes the reader's checks and leaves none, where training would fail looking
    for the answer and evaluation would answer nothing without a word."""
    sequence_ids = tokenized.sequence_ids(window)
    if context_index not in sequence_ids:
        raise FeatureError(
            examples["id"][example_index],
            "context",
            "has no tokens once tokenized: it holds only characters the tokenizer drops (such as zero-width "
            "spaces); give the question a context with text",
        )
    return sequence_ids


def prepare_train_features(
    examples: Mapping[str, list], tokenizer: PreTrainedTokenizerBase, cfg: FeatureConfig
) -> dict[str, list]:
    """Tokenize a batch of examples into labelled training windows."""
    tokenized, sample_map, context_index = _tokenize(examples, tokenizer, cfg)
    starts: list[int] = []
    ends: list[int] = []
    for i, offsets in enumerate(tokenized.pop("offset_mapping")):
        input_ids = tokenized["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
        sequence_ids = _checked_sequence_ids(tokenized, i, context_index, examples, sample_map[i])
        answers = examples["answers"][sample_map[i]]
        start, end = cls_index, cls_index  # no answer, or not wholly in this window
        if answers["answer_start"]:
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            first = sequence_ids.index(context_index)
            last = len(input_ids) - 1 - sequence_ids[::-1].index(context_index)
            if offsets[first][0] <= start_char and offsets[last][1] >= end_char:
                while (
                    first < len(offsets)
                    and sequence_ids[first] == context_index
                    and offsets[first][0] <= start_char
                ):
                    first += 1
                while sequence_ids[last] == context_index and offsets[last][1] >= end_char:
                    last -= 1
                start, end = first - 1, last + 1
        starts.append(start)
        ends.append(end)
    tokenized["start_positions"] = starts
    tokenized["end_positions"] = ends
    return dict(tokenized)


# what prepare_validation_features adds for postprocessing, which the model does not take
POSTPROCESS_COLUMNS = ("example_id", "offset_mapping")


def prepare_validation_features(
    examples: Mapping[str, list], tokenizer: PreTrainedTokenizerBase, cfg: FeatureConfig
) -> dict[str, list]:
    """Tokenize a batch of examples into eval windows that remember offsets and their example."""
    tokenized, sample_map, context_index = _tokenize(examples, tokenizer, cfg)
    tokenized["example_id"] = [examples["id"][s] for s in sample_map]
    # None outside the context: no answer there
    tokenized["offset_mapping"] = [
        [
            o if sequence_id == context_index else None
            for o, sequence_id in zip(
                offsets, _checked_sequence_ids(tokenized, i, context_index, examples, sample_map[i])
            )
        ]
        for i, offsets in enumerate(tokenized["offset_mapping"])
    ]
    return dict(tokenized)


# The code that makes what the caches hold, whose source is in their keys: a fix of how records are read and
# checked, or of how windows are cut, reaches a cached file (inspect reads the source with newlines
# normalised, so a CRLF checkout shares the cache; a comment changed elsewhere in these modules does not)
RECORDS_CODE: tuple[Any, ...] = (squad_io, squad_records)
FEATURES_CODE: tuple[Any, ...] = (
    FeatureConfig,
    _tokenize,
    _checked_sequence_ids,
    prepare_train_features,
    prepare_validation_features,
)


def code_digest(code: tuple[Any, ...]) -> str:
    """A digest of the source of these modules, classes and functions."""
    return Hasher.hash([inspect.getsource(part) for part in code])


def real_lengths(features: datasets.Dataset | Mapping[str, list]) -> np.ndarray:
    """Real (unpadded) token count of every feature: its attention mask's sum."""
    if not isinstance(features, datasets.Dataset):
        return np.array([int(sum(r)) for r in features["attention_mask"]], dtype=np.int64)
    # one list array
    masks = features.with_format("arrow")["attention_mask"].combine_chunks()
    sums = np.concatenate([[0], np.cumsum(masks.values.to_numpy(zero_copy_only=False), dtype=np.int64)])
    # into values: a selection's slice of them is still right
    offsets = masks.offsets.to_numpy()
    return sums[offsets[1:]] - sums[offsets[:-1]]


@dataclass
class QAData:
    """Examples and their features for each split that runs."""

    train: datasets.Dataset | None = None
    eval_examples: datasets.Dataset | None = None
    eval_features: datasets.Dataset | None = None
    predict_examples: datasets.Dataset | None = None
    predict_features: datasets.Dataset | None = None


def build_data(
    model_args: ModelArguments,
    data_args: DataTrainingArguments,
    training_args: QATrainingArguments,
    tokenizer: PreTrainedTokenizerBase,
) -> QAData:
    """Read and check every split the flags ask for, then featurize each (before the model is loaded)."""
    wanted = [
        (split, fn, limit)
        for split, fn, limit, on in (
            ("train", prepare_train_features, data_args.max_train_samples, training_args.do_train),
            ("validation", prepare_validation_features, data_args.max_eval_samples, training_args.do_eval),
            ("test", prepare_validation_features, data_args.max_predict_samples, training_args.do_predict),
        )
        if on
    ]
    # every bad input is found before any split is featurized
    read = _read_splits(data_args, model_args, [split for split, _, _ in wanted])
    cache_dir = data_args.features_cache_dir or os.path.join(
        datasets.config.HF_DATASETS_CACHE, "qa_hpc_features"
    )
    # found by datasets as it writes, a folder it cannot write (a shared, read-only HF cache) is a traceback
    flag = (
        "--features_cache_dir"
        if data_args.features_cache_dir
        else "the features cache (--features_cache_dir)"
    )
    check_writable_dir(cache_dir, flag)
    examples: dict[str, datasets.Dataset] = {}
    features: dict[str, datasets.Dataset] = {}
    reader = code_digest(RECORDS_CODE)
    for split, fn, limit in wanted:
        with first_on_each_filesystem():
            loaded = read[split]
            # the checked records: cached as Arrow, keyed by the bytes read (a dataset: its fingerprint) and
            # the code that read and checked them
            fingerprint = Hasher.hash(
                [
                    loaded.digest,
                    reader,
                    split,
                    data_args.version_2_with_negative,
                    data_args.answer_check,
                ]
            )
            ds = datasets.Dataset.from_generator(
                partial(iter, loaded.records),
                features=RECORD_FEATURES,
                cache_dir=cache_dir,
                fingerprint=fingerprint,
            )
            if not loaded.scorable:  # a test file without answers: predicted, not scored
                ds = ds.remove_columns("answers")
            examples[split] = ds.select(range(min(limit, len(ds)))) if limit is not None else ds
            cfg = FeatureConfig(data_args.max_seq_length, data_args.doc_stride, data_args.pad_to_max_length)
            # --overwrite_cache: recomputed by global rank 0 alone; the others, after it, read what it wrote
            # (each rewriting the shared file would replace the one rank 0 reads, memory-mapped)
            recompute = data_args.overwrite_cache and launch_env().rank == 0
            try:
                features[split] = _featurize(
                    examples[split],
                    fn,
                    tokenizer,
                    cfg,
                    data_args,
                    STAGE_OF_SPLIT[split],
                    cache_dir,
                    recompute,
                )
            except FeatureError as err:  # named where the reader names a record: file, place, id, field
                where = loaded.seen.get(err.record_id)
                raise loaded.fail(where, err.why, rid=err.record_id, fld=err.field) from None
    return QAData(
        features.get("train"),
        examples.get("validation"),
        features.get("validation"),
        examples.get("test"),
        features.get("test"),
    )


def _read_splits(
    data_args: DataTrainingArguments, model_args: ModelArguments, splits: list[str]
) -> dict[str, LoadedFile]:
    """Each split's local file, else the hub dataset's split, read and checked."""
    # --train_file, --validation_file, --test_file
    paths = {split: getattr(data_args, f"{split}_file") for split in splits}
    hub = _load_hub_dataset(data_args, model_args, [split for split in splits if paths[split] is None])
    read: dict[str, LoadedFile] = {}
    for split in splits:
        if paths[split] is not None:
            _, read[split] = load_qa_records(
                paths[split],
                split=split,
                answer_check=data_args.answer_check,
                version_2_with_negative=data_args.version_2_with_negative,
            )
        else:
            # its rows are checked as a file's records are: squad_v2 without --version_2_with_negative
            # stops here, not at scoring after the training
            read[split] = check_dataset_rows(
                hub[split].to_list(),  # 2.5x faster than the dataset's own row by row
                hub[split].column_names,
                data_args.dataset_name,
                split=split,
                answer_check=data_args.answer_check,
                version_2_with_negative=data_args.version_2_with_negative,
            )
            # private: listed in qa_hpc/private_api.py
            read[split].digest = hub[split]._fingerprint
        logger.info("%s split=%s", read[split].summary(), split)
    return read


def _load_hub_dataset(
    data_args: DataTrainingArguments, model_args: ModelArguments, splits: list[str]
) -> datasets.DatasetDict | None:
    """The --dataset_name dataset when some split has no file of its own, with every such split in it."""
    if not splits:
        return None
    if not data_args.dataset_name:
        raise UsageError(f"no --{splits[0]}_file and no --dataset_name to read the {splits[0]} split from")
    # model.py (torch, transformers' models) is loaded only by runs that read a hub dataset
    from qa_hpc.model import from_disk_or_hub

    with from_disk_or_hub("dataset", data_args.dataset_name, model_args.cache_dir):
        hub = datasets.load_dataset(
            data_args.dataset_name,
            data_args.dataset_config_name,
            cache_dir=model_args.cache_dir,
            token=model_args.token,
        )
    for split in splits:
        if split not in hub:
            raise UsageError(f"dataset {data_args.dataset_name} has no '{split}' split (has {list(hub)})")
    return hub


def _featurize(
    examples: datasets.Dataset,
    fn: Callable,
    tokenizer: PreTrainedTokenizerBase,
    cfg: FeatureConfig,
    data_args: DataTrainingArguments,
    name: str,
    cache_dir: str,
    recompute: bool,
) -> datasets.Dataset:
    """examples.map(fn) into a cache file named by the examples' fingerprint, the tokenizer and the
    settings; `recompute`: even where that file is there."""
    # the tokenizer by its vocabulary and rules, not the folder it came from nor the truncation a call
    # left set
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    key = Hasher.hash(
        [
            # private: listed in qa_hpc/private_api.py
            examples._fingerprint,
            code_digest(FEATURES_CODE),
            fn.__name__,
            type(tokenizer).__name__,
            tokenizer.padding_side,
            {k: v for k, v in spec.items() if k not in ("truncation", "padding")},
            cfg.max_seq_length,
            cfg.doc_stride,
            cfg.pad_to_max_length,
        ]
    )
    folder = os.path.join(cache_dir, f"{name}-{key}")
    os.makedirs(folder, exist_ok=True)
    before = set(os.listdir(folder))
    t0 = time.time()
    features = examples.map(
        fn,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, "cfg": cfg},
        num_proc=data_args.preprocessing_num_workers,
        remove_columns=examples.column_names,
        load_from_cache_file=not recompute,
        new_fingerprint=key,
        cache_file_name=os.path.join(folder, "features.arrow"),
        desc=f"{name} features",
    )
    computed = recompute or not before or set(os.listdir(folder)) != before
    logger.info(
        "FEATURES_CACHE split=%s %s in %.1fs features=%d path=%s",
        name,
        "computed" if computed else "reused",
        time.time() - t0,
        len(features),
        folder,
    )
    # the real tokens, against padding every feature to max_seq_length
    real = int(real_lengths(features).sum())
    n = len(features)
    logger.info(
        "TOKENS split=%s features=%d real_tokens=%d tokens_at_max_length=%d mean_len=%.1f",
        name,
        n,
        real,
        n * cfg.max_seq_length,
        real / max(1, n),
    )
    return features
