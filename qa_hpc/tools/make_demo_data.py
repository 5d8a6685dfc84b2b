"""Generate SQuAD-format demo data from templates, with no third-party text.

Why: tests, smoke runs and "does my cluster setup work at all" checks need a
question-answering data set that ships with the project (no licence, no
download) and that a small pretrained BERT can actually *learn* in a few
hundred CPU steps, so a run that trains shows a clearly rising F1.

Design of the text:

* Entities (towns, rivers, people, mountains, lakes) get invented but
  pronounceable names built from syllables ("Kalomi", "Miraso Pell"), which an
  uncased WordPiece vocabulary splits into a few sub-words.
* Each paragraph is a sequence of entity blocks; each block is a few factual
  sentences from templates ("Talvek was founded in 1843 by Miraso Pell.").
  Paragraphs are long (``context_words``, default 450 words, i.e. well over
  384 WordPiece tokens), so every context spans several windows at
  max_seq_length 384 / doc_stride 128 and many answers sit in later windows.
* Each question paraphrases one sentence ("In what year was Talvek
  founded?") and its answer is a short span: a name, year, number with unit,
  colour, month, trade good, job or book title. Several entities of the same
  kind share a paragraph, so the model has to match the entity named in the
  question, not just the kind of answer.
* With ``with_impossible=True`` about a third of the questions ask about an
  entity that does not occur in the paragraph (``is_impossible: true``).

Output is deterministic: same arguments, same bytes.

CLI::

    python -m qa_hpc.tools.make_demo_data --output_dir data/demo [--num_train 2000] [--num_eval 400]
        [--seed 0] [--version_2_with_negative] [--context_words 450]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

from qa_hpc.atomic_io import write_text_atomic
from qa_hpc.tools.demo_text import Paragraph, choose_kind, impossible_question

def generate_squad(num_questions: int, *, seed: int = 0, with_impossible: bool = False,
                   context_words: int = 450, title_prefix: str = "demo",
                   questions_per_paragraph: int = 6, paragraphs_per_article: int = 5) -> dict:
    """Return a deterministic SQuAD data set in the official nested layout.

    The random stream is seeded from ``(seed, title_prefix)``, so train and
    evaluation sets made with the same seed but different prefixes differ,
    and the same arguments always give the same data. Ids are
    ``{title_prefix}-{n:06d}``: unique within a set and across prefixes.
    """
    if num_questions < 1:
        raise ValueError(f"num_questions must be >= 1, got {num_questions}")
    if context_words < 10:
        raise ValueError(f"context_words must be >= 10, got {context_words}")
    if questions_per_paragraph < 1 or paragraphs_per_article < 1:
        raise ValueError("questions_per_paragraph and paragraphs_per_article must be >= 1")
    rng = random.Random(f"squad-demo:{seed}:{title_prefix}")
    articles: list[dict] = []
    made = 0
    while made < num_questions:
        title = f"{title_prefix}_{len(articles):04d}"
        paragraphs = []
        for _ in range(paragraphs_per_article):
            if made >= num_questions:
                break
            par = Paragraph(rng)
            while par.n_words < context_words:
                par.add_block(choose_kind(rng))
            context = par.context
            # at most one question per sentence, so a paragraph's questions differ
            groups: dict[int, list[dict]] = {}
            for c in par.qas:
                groups.setdefault(c["sentence"], []).append(c)
            facts = list(groups.values())
            k = min(questions_per_paragraph, len(facts), num_questions - made)
            qas = []
            for fi in sorted(rng.sample(range(len(facts)), k)):
                c = rng.choice(facts[fi])
                qid = f"{title_prefix}-{made:06d}"
                made += 1
                if with_impossible and rng.random() < 1 / 3:
                    qas.append({"id": qid, "question": impossible_question(par, c), "answers": [],
                                "is_impossible": True})
                    continue
                assert context[c["start"]:c["start"] + len(c["text"])] == c["text"]
                qa: dict[str, Any] = {"id": qid, "question": c["question"],
                                      "answers": [{"text": c["text"], "answer_start": c["start"]}]}
                if with_impossible:
                    qa["is_impossible"] = False
                qas.append(qa)
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": title, "paragraphs": paragraphs})
    return {"version": "2.0" if with_impossible else "1.1", "data": articles}


def strip_answers(dataset: dict) -> dict:
    """A copy without answers: the shape of an unlabeled test file."""
    out = copy.deepcopy(dataset)
    for art in out["data"]:
        for par in art["paragraphs"]:
            for qa in par["qas"]:
                qa.pop("answers", None)
                qa.pop("is_impossible", None)
    return out


def to_bytes(dataset: dict) -> bytes:
    """Canonical serialisation: same dict, same bytes."""
    return to_text(dataset).encode("utf-8")


def to_text(dataset: dict) -> str:
    return json.dumps(dataset, ensure_ascii=False, separators=(",", ":")) + "\n"


def _count(dataset: dict) -> tuple[int, int, int]:
    q = imp = p = 0
    for art in dataset["data"]:
        for par in art["paragraphs"]:
            p += 1
            for qa in par["qas"]:
                q += 1
                imp += bool(qa.get("is_impossible"))
    return q, imp, p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output_dir", required=True, help="where train.json, validation.json, test.json go")
    ap.add_argument("--num_train", type=int, default=2000, help="training questions (default 2000)")
    ap.add_argument("--num_eval", type=int, default=400, help="validation questions (default 400)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--version_2_with_negative", action="store_true",
                    help="add ~1/3 unanswerable questions (SQuAD v2.0 format)")
    ap.add_argument("--context_words", type=int, default=450,
                    help="words per paragraph (default 450: > 384 WordPiece tokens)")
    args = ap.parse_args(argv)
    if args.num_train < 1 or args.num_eval < 1:
        ap.error("--num_train and --num_eval must be >= 1")
    if args.context_words < 10:
        ap.error("--context_words must be >= 10")

    out = Path(args.output_dir)
    common = dict(seed=args.seed, with_impossible=args.version_2_with_negative,
                  context_words=args.context_words)
    train = generate_squad(args.num_train, title_prefix="demo-train", **common)
    val = generate_squad(args.num_eval, title_prefix="demo-validation", **common)
    files = [("train.json", train), ("validation.json", val), ("test.json", strip_answers(val))]
    for name, ds in files:
        text = to_text(ds)
        data = text.encode("utf-8")
        path = out / name
        write_text_atomic(path, text)
        q, imp, p = _count(ds)
        print(f"DEMO_DATA_WRITTEN path={path} version={ds['version']} questions={q} impossible={imp} "
              f"paragraphs={p} bytes={len(data)} sha256={hashlib.sha256(data).hexdigest()[:12]}"
              + (" answers=none" if name == "test.json" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
