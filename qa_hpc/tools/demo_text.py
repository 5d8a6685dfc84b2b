"""The invented text of the demo data: names from syllables, entity blocks of factual sentences, questions.

Used by qa_hpc.tools.make_demo_data (its docstring explains why the text looks as it does).
"""

from __future__ import annotations

import random
import string
from typing import Any

# --------------------------------------------------------------------------- vocabulary

# Simple consonant-vowel syllables with few clusters and codas read like names
# ("Kalomi", "Besudra") and split into a handful of WordPiece pieces.
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "h", "j",
           "b", "d", "k", "l", "m", "n", "r", "s", "t", "v", "br", "dr", "tr", "st"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "o", "e", "i"]
_CODAS = [""] * 8 + ["n", "r", "l", "s", "k"]

_COLOURS = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple", "grey",
            "brown", "silver", "golden", "pink", "violet"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
_GOODS = ["salt", "wool", "copper", "timber", "glass", "cheese", "silk", "leather", "honey",
          "pottery", "tea", "iron", "wine", "paper", "rope", "tin", "barley", "amber"]
_FESTIVALS = ["lanterns", "bread", "music", "kites", "flowers", "masks", "boats", "candles",
              "apples", "drums", "ribbons", "stars", "horses", "bells"]
_ANIMALS = ["fox", "owl", "bear", "wolf", "heron", "stag", "eagle", "otter", "hare", "swan",
            "badger", "falcon", "lynx", "crane", "boar", "raven", "beaver", "goat"]
_JOBS = ["baker", "teacher", "sailor", "doctor", "painter", "carpenter", "judge", "miller",
         "blacksmith", "farmer", "merchant", "poet", "builder", "weaver", "soldier", "priest",
         "surveyor", "printer"]
_FISH = ["trout", "pike", "salmon", "carp", "perch", "eels", "catfish", "bream"]
_DIRECTIONS = ["north", "south", "east", "west"]
_BOOK_ADJ = ["Silent", "Golden", "Hidden", "Last", "Broken", "Northern", "Quiet", "Distant",
             "Burning", "Frozen", "Endless", "Lonely", "Secret", "Crimson", "Little", "Winter"]
_BOOK_NOUN = ["Harbour", "Garden", "Valley", "Bridge", "Lantern", "Orchard", "Tower", "Road",
              "Island", "Forest", "Letter", "Mirror", "Kingdom", "River", "Meadow", "Window"]

# --------------------------------------------------------------------------- templates
# A fact: (sentence template, [(slot answered, [question paraphrases])]).
# {E} is the block's entity; other slots are drawn per fact. Slot kinds come from
# the slot name before any digit: T town, P person, Y year, N population, ...

_FACTS: dict[str, list[tuple[str, list[tuple[str, list[str]]]]]] = {
    "town": [
        ("{E} was founded in {Y} by {P}.",
         [("Y", ["In what year was {E} founded?", "When was the town of {E} founded?"]),
          ("P", ["Who founded {E}?", "Which person founded the town of {E}?"])]),
        ("About {N} people live in {E} today.",
         [("N", ["How many people live in {E}?", "What is the population of {E}?"])]),
        ("The flag of {E} is {C}.",
         [("C", ["What colour is the flag of {E}?", "Which colour does the flag of {E} have?"])]),
        ("The main trade of {E} is {G}.",
         [("G", ["What is the main trade of {E}?", "What does {E} mainly trade in?"])]),
        ("Every year in {M}, the people of {E} hold a festival of {F}.",
         [("M", ["In which month is the festival of {E} held?", "When do the people of {E} hold their festival?"]),
          ("F", ["What is the festival of {E} about?", "What do the people of {E} celebrate at their festival?"])]),
        ("The {A} is the symbol of {E}.",
         [("A", ["Which animal is the symbol of {E}?", "What animal stands for {E}?"])]),
        ("The old bridge of {E} has {K} arches.",
         [("K", ["How many arches does the old bridge of {E} have?", "How many arches are in the bridge of {E}?"])]),
    ],
    "river": [
        ("The river {E} flows through the town of {T}.",
         [("T", ["Which town does the river {E} flow through?", "Through which town does the {E} flow?"])]),
        ("The {E} is {L} long.",
         [("L", ["How long is the river {E}?", "What is the length of the {E}?"])]),
        ("In the end the river {E} runs into Lake {W}.",
         [("W", ["Into which lake does the river {E} flow?", "Which lake does the {E} run into?"])]),
    ],
    "person": [
        ("{E} was born in {T} in {Y}.",
         [("T", ["Where was {E} born?", "In which town was {E} born?"]),
          ("Y", ["In what year was {E} born?", "When was {E} born?"])]),
        ("For many years {E} worked as a {J}.",
         [("J", ["What did {E} work as?", "What was the job of {E}?"])]),
        ("{E} wrote a book called {B}.",
         [("B", ["What book did {E} write?", "What is the name of the book written by {E}?"])]),
    ],
    "mountain": [
        ("Mount {E} rises {H} above the valley.",
         [("H", ["How high is Mount {E}?", "What is the height of Mount {E}?"])]),
        ("The first person to climb Mount {E} was {P}, in {Y}.",
         [("P", ["Who first climbed Mount {E}?", "Who was the first to reach the top of Mount {E}?"]),
          ("Y", ["When was Mount {E} first climbed?", "In what year was Mount {E} first climbed?"])]),
    ],
    "lake": [
        ("Lake {E} lies {D} {R} of {T}.",
         [("D", ["How far is Lake {E} from {T}?", "What is the distance from {T} to Lake {E}?"]),
          ("R", ["In which direction from {T} does Lake {E} lie?", "Is Lake {E} north, south, east or west of {T}?"])]),
        ("Lake {E} is famous for its {I}.",
         [("I", ["What is Lake {E} famous for?", "Which fish is Lake {E} known for?"])]),
    ],
}

# Sentences with no question: distractors and a more natural read.
_FILLER: dict[str, list[str]] = {
    "town": ["Many travellers visit {E} in the summer.", "The streets of {E} are narrow and old.",
             "A small school stands at the centre of {E}."],
    "river": ["The water of the {E} is cold and clear.", "Boats once carried goods along the {E}."],
    "person": ["{E} was known as a patient and careful person.", "Many people still remember {E}."],
    "mountain": ["Snow covers Mount {E} for most of the year.", "A narrow path leads up Mount {E}."],
    "lake": ["The shores of Lake {E} are covered with reeds.", "In winter Lake {E} freezes over."],
}

_KIND_WEIGHTS = [("town", 5), ("person", 4), ("river", 2), ("mountain", 2), ("lake", 2)]


# --------------------------------------------------------------------------- generation


class Paragraph:
    """Builds one context; keeps names and answer values unique within it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.words: set[str] = set()  # every name word used, to keep names unique
        self.values: set[str] = set()  # every answer value used
        self.towns: list[str] = []
        self.parts: list[str] = []
        self.length = 0  # characters so far (parts joined by single spaces)
        self.n_words = 0
        self.qas: list[dict] = []  # candidate questions with absolute answer offsets
        self.entities: dict[str, list[str]] = {k: [] for k, _ in _KIND_WEIGHTS}

    # -- names and values
    def _word(self, lo: int = 2, hi: int = 3) -> str:
        while True:
            n = self.rng.randint(lo, hi)
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                        for _ in range(n))
            w = w.capitalize()
            if w not in self.words and 4 <= len(w) <= 10:
                self.words.add(w)
                return w

    def name(self, kind: str) -> str:
        if kind == "person":
            return f"{self._word(2, 3)} {self._word(1, 2)}"
        return self._word()

    def _unique(self, make: Any) -> str | None:
        for _ in range(50):
            v = make()
            if v not in self.values:
                self.values.add(v)
                return v
        return None  # pool exhausted in this paragraph: the caller leaves the fact out

    def value(self, slot: str) -> str | None:
        r = self.rng
        kind = slot.rstrip(string.digits)
        if kind == "T":  # a town: reuse one already in the paragraph half of the time
            if self.towns and r.random() < 0.5:
                return r.choice(self.towns)
            return self.name("town")
        if kind == "P":
            return self.name("person")
        if kind == "W":
            return self.name("lake")
        makers = {
            "Y": lambda: str(r.randint(1120, 1960)),
            "N": lambda: str(r.randint(12, 990) * 100 + r.choice([0, 0, 50])),
            "C": lambda: r.choice(_COLOURS),
            "G": lambda: r.choice(_GOODS),
            "M": lambda: r.choice(_MONTHS),
            "F": lambda: r.choice(_FESTIVALS),
            "A": lambda: r.choice(_ANIMALS),
            "K": lambda: str(r.randint(3, 19)),
            "L": lambda: f"{r.randint(21, 980)} kilometres",
            "J": lambda: r.choice(_JOBS),
            "B": lambda: f"The {r.choice(_BOOK_ADJ)} {r.choice(_BOOK_NOUN)}",
            "H": lambda: f"{r.randint(800, 4800)} metres",
            "D": lambda: f"{r.randint(2, 95)} kilometres",
            "R": lambda: r.choice(_DIRECTIONS),
            "I": lambda: r.choice(_FISH),
        }
        return self._unique(makers[kind])

    # -- text
    def _append(self, sentence: str) -> int:
        """Append a sentence; return its character offset in the context."""
        start = self.length + (1 if self.parts else 0)
        self.parts.append(sentence)
        self.length = start + len(sentence)
        self.n_words += len(sentence.split())
        return start

    def add_block(self, kind: str) -> None:
        ent = self.name(kind)
        self.entities[kind].append(ent)
        if kind == "town":
            self.towns.append(ent)
        facts = list(_FACTS[kind])
        self.rng.shuffle(facts)
        facts = facts[: self.rng.randint(max(1, len(facts) - 2), len(facts))]
        sentences: list[tuple[str, dict[str, tuple[int, int]], list[tuple[str, list[str]]], dict[str, str]]] = []
        for template, questions in facts:
            slots: dict[str, str] = {"E": ent}
            ok = True
            for _, fname, _, _ in string.Formatter().parse(template):
                if fname and fname not in slots:
                    v = self.value(fname)
                    if v is None:
                        ok = False
                        break
                    slots[fname] = v
            if not ok:
                continue
            text, spans = _fill(template, slots)
            sentences.append((text, spans, questions, slots))
        if self.rng.random() < 0.4:
            filler = self.rng.choice(_FILLER[kind]).format(E=ent)
            sentences.insert(self.rng.randint(0, len(sentences)), (filler, {}, [], {}))
        for text, spans, questions, slots in sentences:
            off = self._append(text)
            for slot, paraphrases in questions:
                q = self.rng.choice(paraphrases).format(**slots)
                s, e = spans[slot]
                self.qas.append({"question": q, "text": text[s:e], "start": off + s, "sentence": off,
                                 "kind": kind, "slot": slot, "template": paraphrases, "slots": slots})

    @property
    def context(self) -> str:
        return " ".join(self.parts)


def _fill(template: str, slots: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Format ``template`` and record where each slot's value landed."""
    out: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    for literal, fname, _, _ in string.Formatter().parse(template):
        out.append(literal)
        pos += len(literal)
        if fname:
            val = slots[fname]
            spans.setdefault(fname, (pos, pos + len(val)))
            out.append(val)
            pos += len(val)
    return "".join(out), spans


def impossible_question(par: Paragraph, cand: dict) -> str:
    """Same question as ``cand`` but about an entity absent from the paragraph."""
    ctx = par.context
    while True:
        fake = par.name(cand["kind"])
        if fake not in ctx and all(w not in ctx for w in fake.split()):
            break
    slots = dict(cand["slots"], E=fake)
    return par.rng.choice(cand["template"]).format(**slots)


def choose_kind(rng: random.Random) -> str:
    total = sum(w for _, w in _KIND_WEIGHTS)
    x = rng.uniform(0, total)
    for kind, w in _KIND_WEIGHTS:
        x -= w
        if x <= 0:
            return kind
    return _KIND_WEIGHTS[-1][0]
