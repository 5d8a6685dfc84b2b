"""N-best lists of a whole eval set held as flat columns: read like a dict, written as JSON without dicts.

The vectorized postprocessor ends with about 20 candidates per question in flat
arrays (211,000 on the SQuAD v1.1 dev set). Turning each into a Python dict and a
text slice costs more than all the array work before it, and writing those dicts
with `json.dumps(indent=2)` (the pure-Python encoder: indent turns the C one off)
costs seconds more. A run needs the best answer per question at once and the n-best
file once, so this table keeps the columns (texts as context + character offsets),
builds an example's dicts only when someone reads that example, and writes the file
straight from the columns: byte for byte what
`json.dumps(dict(table), indent=2, ensure_ascii=False)` writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

@dataclass
class SpanTexts:
    """Row r's text is contexts[example[r]][start[r]:end[r]], cut only when it is read."""

    contexts: Sequence[str]
    example: np.ndarray  # int64 [rows]
    start: np.ndarray  # int64 [rows], character offsets
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.example)

    def cut(self, lo: int = 0, hi: int | None = None) -> list[str]:
        c = self.contexts
        sl = slice(lo, hi)
        return [c[e][a:b] for e, a, b in zip(self.example[sl].tolist(), self.start[sl].tolist(), self.end[sl].tolist())]


class NBestTable(Mapping):
    """Mapping qid -> list of {"text", "probability", "score", "start_logit", "end_logit"} dicts.

    Entries of example i are rows bounds[i] .. bounds[i+1]-1 of the columns, best first.
    Rows where `logits_none` is True hold start_logit/end_logit None (SQuAD v2's null answer).
    `text` is a list of strings or a SpanTexts.
    """

    def __init__(
        self,
        ids: Sequence[str],
        bounds: np.ndarray,
        text: list[str] | SpanTexts,
        probability: np.ndarray,
        score: np.ndarray,
        start_logit: np.ndarray,
        end_logit: np.ndarray,
        logits_none: np.ndarray | None = None,
    ) -> None:
        if len(bounds) != len(ids) + 1:
            raise ValueError(f"bounds has {len(bounds)} entries for {len(ids)} examples (want one more)")
        n_rows = int(bounds[-1])
        for name, col in (("text", text), ("probability", probability), ("score", score),
                          ("start_logit", start_logit), ("end_logit", end_logit)):
            if len(col) != n_rows:
                raise ValueError(f"column {name} has {len(col)} rows, bounds say {n_rows}")
        self._ids = list(ids)
        self._bounds = np.asarray(bounds, dtype=np.int64)
        self._text = text
        self._probability = np.asarray(probability, dtype=np.float64)
        self._score = np.asarray(score, dtype=np.float64)
        self._start = np.asarray(start_logit, dtype=np.float64)
        self._end = np.asarray(end_logit, dtype=np.float64)
        self._none = None if logits_none is None or not np.any(logits_none) else np.asarray(logits_none, dtype=bool)
        self._index: dict[str, int] | None = None

    # Mapping interface: an example's dicts are built when it is read
    def __len__(self) -> int:
        return len(self._lookup())

    def __iter__(self) -> Iterator[str]:  # a repeated id keeps its first place and its last list, as a dict would
        return iter(self._lookup())

    def __contains__(self, qid: object) -> bool:
        return qid in self._lookup()

    def __getitem__(self, qid: str) -> list[dict[str, Any]]:
        ex = self._lookup()[qid]
        lo, hi = int(self._bounds[ex]), int(self._bounds[ex + 1])
        start, end = self._start[lo:hi].tolist(), self._end[lo:hi].tolist()
        if self._none is not None:
            none = self._none[lo:hi].tolist()
            start = [None if n else v for v, n in zip(start, none)]
            end = [None if n else v for v, n in zip(end, none)]
        return [
            {"text": t, "probability": p, "score": s, "start_logit": a, "end_logit": b}
            for t, p, s, a, b in zip(self._texts(lo, hi), self._probability[lo:hi].tolist(),
                                     self._score[lo:hi].tolist(), start, end)
        ]

    def __repr__(self) -> str:
        return f"NBestTable({len(self._ids)} examples, {self.n_entries} entries)"

    @property
    def n_entries(self) -> int:
        return int(self._bounds[-1])

    def _texts(self, lo: int = 0, hi: int | None = None) -> list[str]:
        return self._text.cut(lo, hi) if isinstance(self._text, SpanTexts) else self._text[lo:hi]

    def _lookup(self) -> dict[str, int]:
        if self._index is None:
            self._index = {qid: i for i, qid in enumerate(self._ids)}
        return self._index

    def to_json(self, indent: int = 2) -> str:
        """`json.dumps(dict(self), indent=indent, ensure_ascii=False, allow_nan=True)`, from the columns.

        One str.join over pieces laid out by slice assignment; floats turned to text by one repr() of
        each column's list (json writes a finite float as its repr).
        """
        n = self.n_entries
        floats = (self._probability, self._score, self._start, self._end)
        if (not self._ids or n == 0 or not all(np.isfinite(col).all() for col in floats)
                or len(self._lookup()) != len(self._ids) or np.any(np.diff(self._bounds) == 0)):
            # empty lists, NaN/inf spelling and repeated keys: rare, and json's business
            return json.dumps(dict(self.items()), indent=indent, ensure_ascii=False, allow_nan=True)
        quote = json.encoder.encode_basestring  # what json.dumps uses with ensure_ascii=False
        p1, p2, p3 = " " * indent, " " * (2 * indent), " " * (3 * indent)
        start, end = _float_texts(self._start), _float_texts(self._end)
        if self._none is not None:
            for row in np.flatnonzero(self._none).tolist():
                start[row] = end[row] = "null"
        entry_open = f",\n{p2}{{\n{p3}\"text\": "
        closing = f"\n{p2}}}"
        opens = [entry_open] * n
        closes = [closing] * n
        firsts, lasts = self._bounds[:-1].tolist(), (self._bounds[1:] - 1).tolist()
        for i, (row, qid) in enumerate(zip(firsts, self._ids)):
            opens[row] = f"{',' if i else ''}\n{p1}{quote(qid)}: [\n{p2}{{\n{p3}\"text\": "
        for row in lasts:
            closes[row] = f"{closing}\n{p1}]"
        pieces: list[str] = [""] * (11 * n)
        pieces[0::11] = opens
        pieces[1::11] = list(map(quote, self._texts()))
        pieces[2::11] = [f",\n{p3}\"probability\": "] * n
        pieces[3::11] = _float_texts(self._probability)
        pieces[4::11] = [f",\n{p3}\"score\": "] * n
        pieces[5::11] = _float_texts(self._score)
        pieces[6::11] = [f",\n{p3}\"start_logit\": "] * n
        pieces[7::11] = start
        pieces[8::11] = [f",\n{p3}\"end_logit\": "] * n
        pieces[9::11] = end
        pieces[10::11] = closes
        return "{" + "".join(pieces) + "\n}"


def _float_texts(values: np.ndarray) -> list[str]:
    """[repr(v) for v in values] in one C-level repr of the whole list (finite values only)."""
    if not len(values):
        return []
    return repr(values.tolist())[1:-1].split(", ")


def nbest_json(nbest: Mapping[str, list[dict]], indent: int = 2) -> str:
    """JSON text of any n-best mapping: the table's own writer, or json.dumps for plain dicts."""
    if isinstance(nbest, NBestTable):
        return nbest.to_json(indent=indent)
    return json.dumps(nbest, indent=indent, ensure_ascii=False, allow_nan=True)


__all__ = ["NBestTable", "SpanTexts", "nbest_json"]
