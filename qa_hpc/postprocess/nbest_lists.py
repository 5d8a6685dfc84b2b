"""Span candidates of a whole eval set -> the reference loop's n-best lists, answers and null odds, on flat arrays."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from qa_hpc.postprocess.nbest_table import NBestTable, SpanTexts
from qa_hpc.postprocess.reference import PostprocessConfig, QAPredictions


@dataclass
class Spans:
    """One row per answer candidate, in the loop's insertion order (feature, start rank, end rank)."""

    example: np.ndarray  # int64
    score: np.ndarray  # float64: the sum in the logits' dtype, then a Python float, like the loop's
    start_logit: np.ndarray  # float64
    end_logit: np.ndarray  # float64
    char_start: np.ndarray  # int64: the text is context[char_start:char_end]
    char_end: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.example)

    def take(self, rows: np.ndarray) -> Spans:
        return Spans(*(getattr(self, f.name)[rows] for f in fields(self)))

    def extended(self, example: np.ndarray, score: np.ndarray) -> Spans:
        """These rows, then one empty-text row per entry of `example` (start/end logits 0.0)."""
        zeros = np.zeros(len(example))
        added = (example, score, zeros, zeros, zeros.astype(np.int64), zeros.astype(np.int64))
        return Spans(*(np.concatenate([getattr(self, f.name), extra]) for f, extra in zip(fields(self), added)))


def assemble_predictions(
    ids: list[str], contexts: list[str], spans: Spans, cfg: PostprocessConfig,
    min_null: np.ndarray | None = None, has_null: np.ndarray | None = None,
) -> QAPredictions:
    """Answers, n-best table and (v2: min_null, has_null given) null odds from every example's candidates.

    The loop sorts each example's candidates by score (stable), keeps n_best; in v2 it then sorts those
    with the null answer (stable: the null goes after spans of equal score), keeps n_best, and appends the
    null when it fell off; an example left with nothing gets one empty answer (text "", all scores 0.0).
    Here that is one stable sort of all rows (spans, then each example's null, then the empty answers) by
    (example, -score), keeping the first n_best per example and every null.
    """
    n_ex, n_spans = len(ids), len(spans)
    has_null = np.zeros(n_ex, dtype=bool) if has_null is None else has_null
    null_ex = np.flatnonzero(has_null)
    empty_ex = np.flatnonzero(~has_null & (np.bincount(spans.example, minlength=n_ex) == 0))
    null_scores = min_null[null_ex] if min_null is not None else np.zeros(0)
    rows = spans.extended(np.concatenate([null_ex, empty_ex]), np.concatenate([null_scores, np.zeros(len(empty_ex))]))
    is_null = np.zeros(len(rows), dtype=bool)
    is_null[n_spans : n_spans + len(null_ex)] = True

    order = by_example_then_score(rows.example, rows.score)
    by_example = rows.example[order]
    rank = np.arange(len(order)) - _group_bounds(by_example, n_ex)[by_example]
    kept = order[(rank < cfg.n_best_size) | is_null[order]]  # still grouped by example, best first
    rows = rows.take(kept)
    bounds = _group_bounds(rows.example, n_ex)
    texts = SpanTexts(contexts, rows.example, rows.char_start, rows.char_end)
    table = NBestTable(ids, bounds, texts, _grouped_softmax(rows.score, bounds), rows.score, rows.start_logit,
                       rows.end_logit, is_null[kept])

    answers, odds = _answers(rows, texts, np.flatnonzero(kept < n_spans), cfg, min_null, has_null)
    return QAPredictions(dict(zip(ids, answers)), table, None if odds is None else dict(zip(ids, odds.tolist())))


def _answers(
    rows: Spans, texts: SpanTexts, span_at: np.ndarray, cfg: PostprocessConfig,
    min_null: np.ndarray | None, has_null: np.ndarray,
) -> tuple[list[str], np.ndarray | None]:
    """Per example, the answer text and (v2) null odds, from its kept n-best rows (span rows: `span_at`).

    The best span is an example's first kept span row: v2 with n_best 1 may have kept only the null.
    """
    answered, first = np.unique(rows.example[span_at], return_index=True)
    best = span_at[first]
    odds = None
    if min_null is not None:
        odds = np.where(has_null, min_null, 0.0)
        odds[answered] = min_null[answered] - rows.start_logit[best] - rows.end_logit[best]  # the loop's float ops
        beaten = odds[answered] > cfg.null_score_diff_threshold
        answered, best = answered[~beaten], best[~beaten]
    answers = [""] * len(has_null)
    for ex, text in zip(answered.tolist(), texts.cut(best)):
        answers[ex] = text
    return answers, odds


def by_example_then_score(example: np.ndarray, score: np.ndarray) -> np.ndarray:
    """`np.lexsort((-score, example))`: by example, then by descending score, ties in input order.

    As one stable sort of integer keys (example-major, then the rank of -score among the distinct
    scores; equal scores share a rank, NaN ranks last): ~3x sooner than lexsort on the ~0.2 million
    candidates of a SQuAD dev set, as the rows come mostly in example order already.
    """
    distinct, rank = np.unique(-score, return_inverse=True)
    return np.argsort(example * len(distinct) + rank, kind="stable")


def _group_bounds(group: np.ndarray, n_groups: int) -> np.ndarray:
    """Rows bounds[g] .. bounds[g + 1] - 1 of `group` (sorted) hold group g."""
    return np.searchsorted(group, np.arange(n_groups + 1))


def _grouped_softmax(scores: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """reference._softmax of every list scores[bounds[i] : bounds[i + 1]], the same floats.

    One 2-D array per list length, so the max, exp and sum run in numpy, not per list.
    """
    lengths = np.diff(bounds)
    probs = np.empty(len(scores), dtype=np.float64)
    for m in np.unique(lengths[lengths > 0]).tolist():
        idx = bounds[:-1][lengths == m][:, None] + np.arange(m)
        mat = scores[idx]
        exp = np.exp(mat - np.max(mat, axis=1, keepdims=True))
        probs[idx] = exp / exp.sum(axis=1, keepdims=True)
    return probs
