"""Where tokenized features are cached, so a second run with the same data and settings skips tokenizing.

Datasets made from local files (Dataset.from_list) have no cache file of their
own, so datasets.map would tokenize again on every run. Here each featurization
gets a cache file named by a fingerprint of everything its output depends on:
the data file's bytes (or the hub dataset's fingerprint), how the records were
read, the tokenizer, the feature settings and the feature code itself.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)


@lru_cache(maxsize=16)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def data_digest(source: str, examples: Any) -> str:
    """The file's content hash for a local file, else the dataset's own fingerprint."""
    if os.path.isfile(source):
        st = os.stat(source)
        return "file:" + _file_digest(os.path.abspath(source), st.st_size, st.st_mtime_ns)
    return "dataset:" + str(getattr(examples, "_fingerprint", source))


def tokenizer_digest(tokenizer: Any) -> str:
    """Vocabulary, normalizer and pre-tokenizer (the fast tokenizer's full JSON), plus padding side."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else repr(tokenizer)
    return hashlib.sha256(f"{type(tokenizer).__name__}|{tokenizer.padding_side}|{body}".encode()).hexdigest()


def code_digest(fn: Any) -> str:
    """The whole module that defines the feature function (helpers included)."""
    module = inspect.getmodule(fn)
    try:
        source = inspect.getsource(module) if module is not None else inspect.getsource(fn)
    except (OSError, TypeError):
        source = getattr(fn, "__qualname__", repr(fn))
    return hashlib.sha256(f"{getattr(fn, '__qualname__', fn)}|{source}".encode()).hexdigest()


def fingerprint(parts: Iterable[Any]) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:24]


def default_cache_dir() -> str:
    import datasets

    return os.path.join(str(datasets.config.HF_DATASETS_CACHE), "qa_hpc_features")


def features_cache_file(
    cache_dir: str | None, split: str, examples: Any, fn: Any, tokenizer: Any, cfg: Any, read_options: Iterable[Any]
) -> str:
    """<cache_dir>/<split>-<fingerprint>/features.arrow for this exact featurization."""
    key = fingerprint(
        [
            data_digest(cfg.source, examples),
            len(examples),
            *read_options,
            tokenizer_digest(tokenizer),
            cfg.max_seq_length,
            cfg.doc_stride,
            cfg.pad_to_max_length,
            code_digest(fn),
        ]
    )
    return os.path.join(cache_dir or default_cache_dir(), f"{split}-{key}", "features.arrow")


def cache_files_in(cache_file: str) -> set[str]:
    """Files (shards included) in the cache file's directory, to tell a reuse from a fresh computation."""
    folder = os.path.dirname(cache_file)
    if not os.path.isdir(folder):
        return set()
    return {n for n in os.listdir(folder) if n.endswith(".arrow")}


__all__ = ["cache_files_in", "default_cache_dir", "features_cache_file", "fingerprint", "tokenizer_digest"]
