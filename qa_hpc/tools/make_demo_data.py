"""Generate SQuAD-format demo data from templates, with no third-party text.

Tests, smoke runs and "does my cluster work at all" checks need a data set that ships with the project
(no licence, no download) and that a small BERT learns in a few hundred CPU steps (F1 clearly rises).
Invented entities (towns, rivers, people, mountains, lakes) get pronounceable names from syllables
("Kalomi", "Miraso Pell"), a few WordPieces each. A paragraph is blocks of template facts ("Talvek was
founded in 1843 by Miraso Pell."), --context_words long (450: > 384 tokens, so answers sit in later
windows too); a question paraphrases one fact and its answer is a short span. Entities of one kind
share a paragraph, so the model must match the entity named. With --version_2_with_negative about a
third of the questions ask about an entity the paragraph never mentions. Same arguments, same bytes.

    python -m qa_hpc.tools.make_demo_data --output_dir data/demo [--num_train 2000] [--num_eval 400]
        [--seed 0] [--version_2_with_negative] [--context_words 450]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import string
import sys
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any

from qa_hpc.atomic_io import write_text_atomic
from qa_hpc.errors import EXIT_IOERR, OutputError, check_writable_dir

# Consonant-vowel syllables with few clusters and codas read like names and split into few WordPieces.
# The lists' order and repeats are part of the data: the same seed must give the same bytes.
ONSETS = "b d f g k l m n p r s t v z h j b d k l m n r s t v br dr tr st".split()
VOWELS = "a e i o u a o e i".split()
CODAS = [""] * 8 + ["n", "r", "l", "s", "k"]
WORDS = {
    "C": "red blue green yellow white black orange purple grey brown silver golden pink violet",
    "M": "January February March April May June July August September October November December",
    "G": "salt wool copper timber glass cheese silk leather honey pottery tea iron wine paper rope tin "
    "barley amber",
    "F": "lanterns bread music kites flowers masks boats candles apples drums ribbons stars horses bells",
    "A": "fox owl bear wolf heron stag eagle otter hare swan badger falcon lynx crane boar raven beaver goat",
    "J": "baker teacher sailor doctor painter carpenter judge miller blacksmith farmer merchant poet builder "
    "weaver soldier priest surveyor printer",
    "I": "trout pike salmon carp perch eels catfish bream",
    "R": "north south east west",
}
CHOICES = {slot: words.split() for slot, words in WORDS.items()}
# a book title: adjective, noun
BOOK = (
    "Silent Golden Hidden Last Broken Northern Quiet Distant Burning Frozen Endless Lonely Secret Crimson "
    "Little Winter".split(),
    "Harbour Garden Valley Bridge Lantern Orchard Tower Road Island Forest Letter Mirror Kingdom "
    "River Meadow Window".split(),
)

# kind -> facts: (sentence, {slot answered: "paraphrase|paraphrase"}). {E} is the block's entity; other
# slots are drawn per fact (T town, P person, W lake, Y year, N population, C colour, ...).
FACTS: dict[str, list[tuple[str, dict[str, str]]]] = {
    "town": [
        (
            "{E} was founded in {Y} by {P}.",
            {
                "Y": "In what year was {E} founded?|When was the town of {E} founded?",
                "P": "Who founded {E}?|Which person founded the town of {E}?",
            },
        ),
        (
            "About {N} people live in {E} today.",
            {"N": "How many people live in {E}?|What is the population of {E}?"},
        ),
        (
            "The flag of {E} is {C}.",
            {"C": "What colour is the flag of {E}?|Which colour does the flag of {E} have?"},
        ),
        (
            "The main trade of {E} is {G}.",
            {"G": "What is the main trade of {E}?|What does {E} mainly trade in?"},
        ),
        (
            "Every year in {M}, the people of {E} hold a festival of {F}.",
            {
                "M": "In which month is the festival of {E} held?"
                "|When do the people of {E} hold their festival?",
                "F": "What is the festival of {E} about?"
                "|What do the people of {E} celebrate at their festival?",
            },
        ),
        (
            "The {A} is the symbol of {E}.",
            {"A": "Which animal is the symbol of {E}?|What animal stands for {E}?"},
        ),
        (
            "The old bridge of {E} has {K} arches.",
            {
                "K": "How many arches does the old bridge of {E} have?"
                "|How many arches are in the bridge of {E}?"
            },
        ),
    ],
    "river": [
        (
            "The river {E} flows through the town of {T}.",
            {"T": "Which town does the river {E} flow through?|Through which town does the {E} flow?"},
        ),
        ("The {E} is {L} long.", {"L": "How long is the river {E}?|What is the length of the {E}?"}),
        (
            "In the end the river {E} runs into Lake {W}.",
            {"W": "Into which lake does the river {E} flow?|Which lake does the {E} run into?"},
        ),
    ],
    "person": [
        (
            "{E} was born in {T} in {Y}.",
            {
                "T": "Where was {E} born?|In which town was {E} born?",
                "Y": "In what year was {E} born?|When was {E} born?",
            },
        ),
        ("For many years {E} worked as a {J}.", {"J": "What did {E} work as?|What was the job of {E}?"}),
        (
            "{E} wrote a book called {B}.",
            {"B": "What book did {E} write?|What is the name of the book written by {E}?"},
        ),
    ],
    "mountain": [
        (
            "Mount {E} rises {H} above the valley.",
            {"H": "How high is Mount {E}?|What is the height of Mount {E}?"},
        ),
        (
            "The first person to climb Mount {E} was {P}, in {Y}.",
            {
                "P": "Who first climbed Mount {E}?|Who was the first to reach the top of Mount {E}?",
                "Y": "When was Mount {E} first climbed?|In what year was Mount {E} first climbed?",
            },
        ),
    ],
    "lake": [
        (
            "Lake {E} lies {D} {R} of {T}.",
            {
                "D": "How far is Lake {E} from {T}?|What is the distance from {T} to Lake {E}?",
                "R": "In which direction from {T} does Lake {E} lie?"
                "|Is Lake {E} north, south, east or west of {T}?",
            },
        ),
        (
            "Lake {E} is famous for its {I}.",
            {"I": "What is Lake {E} famous for?|Which fish is Lake {E} known for?"},
        ),
    ],
}
# Sentences with no question: distractors, and a more natural read.
FILLER = {
    "town": [
        "Many travellers visit {E} in the summer.",
        "The streets of {E} are narrow and old.",
        "A small school stands at the centre of {E}.",
    ],
    "river": ["The water of the {E} is cold and clear.", "Boats once carried goods along the {E}."],
    "person": ["{E} was known as a patient and careful person.", "Many people still remember {E}."],
    "mountain": ["Snow covers Mount {E} for most of the year.", "A narrow path leads up Mount {E}."],
    "lake": ["The shores of Lake {E} are covered with reeds.", "In winter Lake {E} freezes over."],
}
NUMBERS: dict[str, Callable[[random.Random], str]] = {
    "Y": lambda r: str(r.randint(1120, 1960)),
    "N": lambda r: str(r.randint(12, 990) * 100 + r.choice([0, 0, 50])),
    "K": lambda r: str(r.randint(3, 19)),
    "L": lambda r: f"{r.randint(21, 980)} kilometres",
    "B": lambda r: f"The {r.choice(BOOK[0])} {r.choice(BOOK[1])}",
    "H": lambda r: f"{r.randint(800, 4800)} metres",
    "D": lambda r: f"{r.randint(2, 95)} kilometres",
}
KINDS = ("town", "person", "river", "mountain", "lake")
KIND_WEIGHTS = (5, 4, 2, 2, 2)
QUESTIONS_PER_PARAGRAPH = 6
PARAGRAPHS_PER_ARTICLE = 5
# a candidate question: its text, answer, offsets, kind, paraphrases, slots
Fact = dict[str, Any]


class _Paragraph:
    """One context being written: blocks of facts, its candidate questions, names and values unique in
    it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        # the words of the names used so far
        self.words: set[str] = set()
        # the answer values used so far, names aside
        self.values: set[str] = set()
        self.towns: list[str] = []
        self.parts: list[str] = []
        # candidate questions, answers at their offsets in the context
        self.facts: list[Fact] = []

    def word(self, lo: int, hi: int) -> str:
        while True:
            text = "".join(
                self.rng.choice(ONSETS) + self.rng.choice(VOWELS) + self.rng.choice(CODAS)
                for _ in range(self.rng.randint(lo, hi))
            ).capitalize()
            if text not in self.words and 4 <= len(text) <= 10:
                self.words.add(text)
                return text

    def name(self, kind: str) -> str:
        return f"{self.word(2, 3)} {self.word(1, 2)}" if kind == "person" else self.word(2, 3)

    def value(self, slot: str) -> str | None:
        """A value for `slot`: names are new (a town may repeat); other values are unique in the
        paragraph."""
        if slot == "T":
            return (
                self.rng.choice(self.towns) if self.towns and self.rng.random() < 0.5 else self.name("town")
            )
        if slot in ("P", "W"):
            return self.name("person" if slot == "P" else "lake")
        for _ in range(50):
            found = self.rng.choice(CHOICES[slot]) if slot in CHOICES else NUMBERS[slot](self.rng)
            if found not in self.values:
                self.values.add(found)
                return found
        return None  # the pool is used up in this paragraph: the caller leaves the fact out

    def fact(self, template: str, slots: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]] | None:
        """The sentence of `template` with its slots filled, and where each slot sits in it."""
        text = ""
        spans: dict[str, tuple[int, int]] = {}
        for literal, slot, _, _ in string.Formatter().parse(template):
            text += literal
            if slot:
                if slot not in slots:
                    if (filled := self.value(slot)) is None:
                        return None
                    slots[slot] = filled
                spans.setdefault(slot, (len(text), len(text) + len(slots[slot])))
                text += slots[slot]
        return text, spans

    def add_block(self) -> None:
        """A few facts about one new entity, in random order, sometimes with a filler sentence."""
        rng = self.rng
        kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
        entity = self.name(kind)
        if kind == "town":
            self.towns.append(entity)
        templates = list(FACTS[kind])
        rng.shuffle(templates)
        sentences = []
        for template, questions in templates[: rng.randint(max(1, len(templates) - 2), len(templates))]:
            slots = {"E": entity}
            if (filled := self.fact(template, slots)) is not None:
                sentences.append((*filled, questions, slots))
        if rng.random() < 0.4:
            filler = rng.choice(FILLER[kind]).format(E=entity)
            sentences.insert(rng.randint(0, len(sentences)), (filler, {}, {}, {}))
        for text, spans, questions, slots in sentences:
            offset = len(" ".join(self.parts)) + (1 if self.parts else 0)
            self.parts.append(text)
            for slot, paraphrases in questions.items():
                start, end = spans[slot]
                self.facts.append(
                    {
                        "question": rng.choice(paraphrases.split("|")).format(**slots),
                        "text": text[start:end],
                        "start": offset + start,
                        "sentence": offset,
                        "kind": kind,
                        "paraphrases": paraphrases.split("|"),
                        "slots": slots,
                    }
                )


def generate_squad(
    num_questions: int,
    *,
    seed: int = 0,
    with_impossible: bool = False,
    context_words: int = 450,
    title_prefix: str = "demo",
) -> dict[str, Any]:
    """A SQuAD data set in the official nested layout, the same for the same arguments.

    The random stream is seeded from (seed, title_prefix): train and evaluation sets of one seed differ.
    Ids are `{title_prefix}-{n:06d}`, unique within a set and across prefixes.
    """
    if num_questions < 1 or context_words < 10:
        raise ValueError(
            f"need num_questions >= 1 (got {num_questions}) and context_words >= 10 (got {context_words})"
        )
    rng = random.Random(f"squad-demo:{seed}:{title_prefix}")
    paragraphs: list[dict[str, Any]] = []
    made = 0
    while made < num_questions:
        # names stay unique in it
        paragraph = _Paragraph(rng)
        while sum(len(part.split()) for part in paragraph.parts) < context_words:
            paragraph.add_block()
        context = " ".join(paragraph.parts)
        name = paragraph.name
        # at most one question per sentence (a sentence's facts are adjacent)
        groups = [list(facts) for _, facts in itertools.groupby(paragraph.facts, key=itemgetter("sentence"))]
        qas: list[dict[str, Any]] = []
        asked = min(QUESTIONS_PER_PARAGRAPH, len(groups), num_questions - made)
        for index in sorted(rng.sample(range(len(groups)), asked)):
            fact = rng.choice(groups[index])
            qa: dict[str, Any] = {"id": f"{title_prefix}-{made:06d}"}
            made += 1
            # about an entity of that kind the context never names
            if with_impossible and rng.random() < 1 / 3:
                while (fake := name(fact["kind"])) in context or any(
                    word in context for word in fake.split()
                ):
                    pass
                question = rng.choice(fact["paraphrases"]).format(**dict(fact["slots"], E=fake))
                qas.append({**qa, "question": question, "answers": [], "is_impossible": True})
                continue
            qa.update(
                question=fact["question"], answers=[{"text": fact["text"], "answer_start": fact["start"]}]
            )
            qas.append({**qa, "is_impossible": False} if with_impossible else qa)
        paragraphs.append({"context": context, "qas": qas})
    articles = [
        {"title": f"{title_prefix}_{n:04d}", "paragraphs": paragraphs[at : at + PARAGRAPHS_PER_ARTICLE]}
        for n, at in enumerate(range(0, len(paragraphs), PARAGRAPHS_PER_ARTICLE))
    ]
    return {"version": "2.0" if with_impossible else "1.1", "data": articles}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--output_dir", required=True, help="where train.json, validation.json, test.json go")
    ap.add_argument("--num_train", type=int, default=2000, help="training questions (default 2000)")
    ap.add_argument("--num_eval", type=int, default=400, help="validation questions (default 400)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--version_2_with_negative",
        action="store_true",
        help="add ~1/3 unanswerable questions (SQuAD v2.0 format)",
    )
    ap.add_argument(
        "--context_words",
        type=int,
        default=450,
        help="words per paragraph (default 450: > 384 WordPiece tokens)",
    )
    args = ap.parse_args(argv)
    if args.num_train < 1 or args.num_eval < 1 or args.context_words < 10:
        ap.error("--num_train and --num_eval must be >= 1, --context_words >= 10")
    try:
        check_writable_dir(args.output_dir)
    except OutputError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return EXIT_IOERR
    common = dict(
        seed=args.seed, with_impossible=args.version_2_with_negative, context_words=args.context_words
    )
    val = generate_squad(args.num_eval, title_prefix="demo-validation", **common)
    # the validation set without its answers: the shape of an unlabeled test file
    test = {
        **val,
        "data": [
            {
                **art,
                "paragraphs": [
                    {
                        **par,
                        "qas": [
                            {k: v for k, v in qa.items() if k not in ("answers", "is_impossible")}
                            for qa in par["qas"]
                        ],
                    }
                    for par in art["paragraphs"]
                ],
            }
            for art in val["data"]
        ],
    }
    files = {
        "train.json": generate_squad(args.num_train, title_prefix="demo-train", **common),
        "validation.json": val,
        "test.json": test,
    }
    for name, dataset in files.items():
        # same dict, same bytes
        text = json.dumps(dataset, ensure_ascii=False, separators=(",", ":")) + "\n"
        path = Path(args.output_dir) / name
        data = text.encode()
        write_text_atomic(path, text)
        qas = [qa for art in dataset["data"] for par in art["paragraphs"] for qa in par["qas"]]
        print(
            f"DEMO_DATA_WRITTEN path={path} version={dataset['version']} questions={len(qas)} "
            f"impossible={sum(bool(qa.get('is_impossible')) for qa in qas)} "
            f"paragraphs={sum(len(art['paragraphs']) for art in dataset['data'])} bytes={len(data)} "
            f"sha256={hashlib.sha256(data).hexdigest()[:12]}"
            + (" answers=none" if name == "test.json" else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
