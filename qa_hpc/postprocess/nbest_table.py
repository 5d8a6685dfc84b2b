"""N-best lists of a whole eval set held as flat columns, read like the loop's dict of lists of dicts.

The vectorized postprocessor ends with about 20 candidates per question in flat arrays (211,000 on
the SQuAD v1.1 dev set). Turning them into Python dicts and text slices costs more than all the array
work before it, and an eval needs only the best answer per question at once: the table builds an
example's dicts when that example is read, and all of them once, when the n-best file is written.
"""

from __future__ import annotations

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

    def cut(self, rows: slice | np.ndarray = slice(None)) -> list[str]:
        """Texts of `rows` (a slice or an index array)."""
        c = self.contexts
        return [c[e][a:b] for e, a, b in zip(self.example[rows].tolist(), self.start[rows].tolist(),
                                             self.end[rows].tolist())]


class NBestTable(Mapping):
    """Mapping qid -> list of {"text", "probability", "score", "start_logit", "end_logit"} dicts.

    Entries of example i are rows bounds[i] .. bounds[i+1]-1 of the columns, best first.
    Rows where `logits_none` is True hold start_logit/end_logit None (SQuAD v2's null answer).
    """

    def __init__(
        self,
        ids: Sequence[str],
        bounds: np.ndarray,
        text: SpanTexts,
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
        self._floats = {name: np.asarray(col, dtype=np.float64) for name, col in (
            ("probability", probability), ("score", score), ("start_logit", start_logit), ("end_logit", end_logit))}
        self._none = np.zeros(n_rows, dtype=bool) if logits_none is None else np.asarray(logits_none, dtype=bool)
        self._index: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self._lookup())

    def __iter__(self) -> Iterator[str]:  # a repeated id keeps its first place and its last list, as a dict would
        return iter(self._lookup())

    def __contains__(self, qid: object) -> bool:
        return qid in self._lookup()

    def __getitem__(self, qid: str) -> list[dict[str, Any]]:
        ex = self._lookup()[qid]
        return self._entries(slice(int(self._bounds[ex]), int(self._bounds[ex + 1])))

    def __repr__(self) -> str:
        return f"NBestTable({len(self._ids)} examples, {int(self._bounds[-1])} entries)"

    def as_dict(self) -> dict[str, list[dict[str, Any]]]:
        """The whole table as the loop's dict, every entry built in one pass over the columns."""
        entries = self._entries(slice(None))
        lists = (entries[lo:hi] for lo, hi in zip(self._bounds[:-1].tolist(), self._bounds[1:].tolist()))
        return dict(zip(self._ids, lists))

    def _entries(self, rows: slice) -> list[dict[str, Any]]:
        prob, score, start, end = (self._floats[name][rows].tolist()
                                   for name in ("probability", "score", "start_logit", "end_logit"))
        for row in np.flatnonzero(self._none[rows]).tolist():  # the null answer has no start/end logit
            start[row] = end[row] = None
        return [{"text": t, "probability": p, "score": s, "start_logit": a, "end_logit": b}
                for t, p, s, a, b in zip(self._text.cut(rows), prob, score, start, end)]

    def _lookup(self) -> dict[str, int]:
        if self._index is None:
            self._index = {qid: i for i, qid in enumerate(self._ids)}
        return self._index


__all__ = ["NBestTable", "SpanTexts"]
