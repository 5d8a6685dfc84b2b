"""Vectorized QA postprocessing: exactly the answers of utils_qa.postprocess_qa_predictions_loop, sooner.

On the SQuAD v1.1 dev set: ~10x less time than the loop as run_qa.py runs it, ~5x from pre-built
lists (docs/PERFORMANCE.md); what is left is mostly building the n-best lists' Python dicts.

The reference loop visits every feature and tries n_best x n_best (start, end)
pairs in Python: about 4 million iterations on the SQuAD dev set, more time than a
GPU needs for the whole forward pass. This module does the same work on arrays:

1. top-n_best start and end positions of every feature at once (argpartition,
   then a sort of the few survivors);
2. all n_best x n_best scores of every feature as one array, masked by the same
   validity rules (context tokens only, end >= start, at most max_answer_length);
3. one stable sort of the surviving candidates by (example, -score), on a packed integer key;
4. the first n_best per example, the v2 null answer, softmax and texts on flat arrays, then the
   n-best dicts built in bulk and sliced per example.

Exactly the loop's answers, including its tie-breaking:
- the loop ranks positions with np.argsort, whose order among equal logits is an
  implementation detail; rows where equal values reach the top n_best (common with
  bf16 logits, or short rows padded with -100) are ranked by the very same
  np.argsort call, all other rows have one possible ranking and take the fast path;
- candidates of equal score keep the loop's insertion order (feature, start rank,
  end rank), because every sort here is stable;
- scores are sums in the logits' own dtype, then Python floats, like the loop's.

Offsets come either as Python lists (None outside the context), or straight from
the Arrow column of a datasets.Dataset, which avoids building millions of Python
objects at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from utils_qa import PostprocessConfig, QAPredictions

_NULL = -1  # candidate kind marker for the v2 null answer


@dataclass
class FlatOffsets:
    """Offsets of all features laid end to end.

    Feature f owns flat positions row_start[f] .. row_start[f] + length[f] - 1; a
    token has offsets (start[i], end[i]) when valid[i] (a context token) is True.
    """

    row_start: np.ndarray  # int64 [F]
    length: np.ndarray  # int64 [F]
    valid: np.ndarray  # bool [T]
    start: np.ndarray  # int64 [T]
    end: np.ndarray  # int64 [T]


def flat_offsets(offset_mapping: Any) -> FlatOffsets:
    """Offsets from a pyarrow (Chunked)Array of list<list<int>> or from Python lists."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError:  # pragma: no cover - pyarrow comes with datasets
        pa = None
    if pa is not None and isinstance(offset_mapping, (pa.Array, pa.ChunkedArray)):
        arr = offset_mapping.combine_chunks() if isinstance(offset_mapping, pa.ChunkedArray) else offset_mapping
        wanted = pa.list_(pa.list_(pa.int64()))
        if not (pa.types.is_list(arr.type) and pa.types.is_list(arr.type.value_type)) or arr.type != wanted:
            arr = arr.cast(wanted)  # e.g. list<null> when a column holds no offsets at all
        length = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        tokens = arr.flatten()  # one entry per token; null outside the context
        valid = tokens.is_valid().to_numpy(zero_copy_only=False)
        token_len = pc.fill_null(pc.list_value_length(tokens), 0).to_numpy(zero_copy_only=False)
        if np.any(token_len[valid] != 2):
            raise ValueError("offset_mapping entries must be [start, end] pairs or null")
        values = tokens.flatten().to_numpy(zero_copy_only=False).astype(np.int64)  # nulls contribute nothing
        start = np.zeros(len(valid), dtype=np.int64)
        end = np.zeros(len(valid), dtype=np.int64)
        start[valid] = values[0::2]
        end[valid] = values[1::2]
    else:
        rows = list(offset_mapping)
        length = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        flat = list(itertools.chain.from_iterable(rows))
        valid = np.fromiter((o is not None for o in flat), dtype=bool, count=len(flat))
        pairs = [o for o in flat if o is not None]
        start = np.zeros(len(flat), dtype=np.int64)
        end = np.zeros(len(flat), dtype=np.int64)
        if pairs:  # fromiter over the flattened pairs: about 2x sooner than np.asarray on a list of tuples
            if np.any(np.fromiter(map(len, pairs), dtype=np.int64, count=len(pairs)) != 2):
                raise ValueError("offset_mapping entries must be [start, end] pairs or None")
            both = np.fromiter(itertools.chain.from_iterable(pairs), dtype=np.int64, count=2 * len(pairs))
            both = both.reshape(len(pairs), 2)
            start[valid] = both[:, 0]
            end[valid] = both[:, 1]
    row_start = np.zeros(len(length), dtype=np.int64)
    np.cumsum(length[:-1], out=row_start[1:])
    return FlatOffsets(row_start, length, valid, start, end)


def top_k_like_argsort(logits: np.ndarray, k: int) -> np.ndarray:
    """Per row, `np.argsort(row)[-1:-k-1:-1]`: indices of the k largest, largest first.

    Rows whose top k (plus the next value, which decides membership) hold no equal
    values and no NaN have exactly one such ranking, found with argpartition. Any
    other row is ranked by np.argsort itself, so ties come out as the loop has them.
    """
    n, width = logits.shape
    k_eff = min(k, width)
    if n == 0 or width == 0:
        return np.zeros((n, k_eff), dtype=np.int64)
    keep = min(k_eff + 1, width)  # the (k+1)-th value decides whether the k-th is unique
    ranked, ranked_vals = _top_sorted(logits, keep)
    ambiguous = np.any(ranked_vals[:, :-1] == ranked_vals[:, 1:], axis=1) | np.isnan(ranked_vals).any(axis=1)
    out = ranked[:, :k_eff].astype(np.int64)
    for row in np.flatnonzero(ambiguous):
        out[row] = np.argsort(logits[row])[-1 : -k - 1 : -1]
    return out


def mask_padding(logits: tuple[np.ndarray, np.ndarray], lengths: np.ndarray, fill: float = -100.0):
    """Logits past each feature's real length set to `fill` (the Trainer's own padding value).

    With dynamic padding a feature's row holds the model's output on pad tokens up to its batch's
    width, and those values compete for the top n_best start/end slots. Batch widths depend on which
    features share a batch (length-sorted or not, batch size, world size), so unmasked they would make
    answers depend on batching. Masked, every feature's row depends only on the feature.
    """
    out = []
    for arr in logits:
        arr = np.asarray(arr)
        cols = np.arange(arr.shape[1])
        out.append(np.where(cols[None, :] < np.asarray(lengths)[:, None], arr, np.asarray(fill, dtype=arr.dtype)))
    return out[0], out[1]


def _top_sorted(logits: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the `keep` largest per row, largest first (any order among equal values)."""
    try:
        import torch

        values, indices = torch.topk(torch.from_numpy(np.ascontiguousarray(logits)), keep, dim=1, sorted=True)
        return indices.numpy(), values.numpy()
    except (ImportError, RuntimeError, TypeError):  # no torch, or a dtype its CPU topk lacks
        width = logits.shape[1]
        part = np.argpartition(logits, width - keep, axis=1)[:, width - keep :] if keep < width else (
            np.broadcast_to(np.arange(width), logits.shape).copy()
        )
        vals = np.take_along_axis(logits, part, axis=1)
        order = np.argsort(vals, axis=1, kind="stable")[:, ::-1]
        return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)


def _kth_largest(rows: np.ndarray, k: int) -> np.ndarray:
    """The k-th largest value of every row (exact: a value, not an index, so ties do not matter)."""
    try:
        import torch

        return torch.topk(torch.from_numpy(np.ascontiguousarray(rows)), k, dim=1, sorted=True).values[:, -1].numpy()
    except (ImportError, RuntimeError, TypeError):
        n = rows.shape[1]
        return np.partition(rows, n - k, axis=1)[:, n - k]


_SORT_BITS = {np.dtype(np.float16): np.uint16, np.dtype(np.float32): np.uint32}


def _by_example_then_score(ex: np.ndarray, score: np.ndarray, n_ex: int) -> np.ndarray:
    """`np.lexsort((-score, ex))`: by example, then by descending score, ties in input order.

    For float16/float32 scores this is one stable sort of a uint64 key (example index in the high bits, the
    score's bits mapped to an order-preserving unsigned integer and flipped in the low bits), about 4x
    sooner than lexsort. -0.0 is folded into +0.0 first (they compare equal); NaN falls back to lexsort.
    """
    utype = _SORT_BITS.get(score.dtype)
    if utype is None or n_ex >= 2**31 or (len(score) and np.isnan(score).any()):
        return np.lexsort((-score.astype(np.float64), ex))
    nbits = 8 * score.dtype.itemsize
    bits = (score + score.dtype.type(0)).view(utype).astype(np.uint64)  # -0.0 + 0.0 == +0.0
    sign, full = np.uint64(1 << (nbits - 1)), np.uint64((1 << nbits) - 1)
    ascending = np.where(bits & sign, full ^ bits, bits | sign)  # unsigned order == float order
    key = (ex.astype(np.uint64) << np.uint64(nbits)) | (full ^ ascending)
    return np.argsort(key, kind="stable")


def _example_index(example_ids: Sequence[str], feature_example_ids: Sequence[str]) -> np.ndarray:
    index = {eid: i for i, eid in enumerate(example_ids)}
    try:
        return np.fromiter((index[e] for e in feature_example_ids), dtype=np.int64, count=len(feature_example_ids))
    except KeyError as err:
        pos = next(f for f, e in enumerate(feature_example_ids) if e not in index)
        raise ValueError(f"feature {pos} belongs to unknown example id {err.args[0]!r}") from None


def postprocess_qa_predictions_vectorized(
    examples: Mapping[str, Sequence],
    features: Mapping[str, Any],
    predictions: tuple[np.ndarray, np.ndarray],
    cfg: PostprocessConfig,
) -> QAPredictions:
    """Same contract and same output as utils_qa.postprocess_qa_predictions_loop."""
    start_logits, end_logits = (np.asarray(p) for p in predictions)
    feature_ids = features["example_id"]
    if len(start_logits) != len(feature_ids):
        raise ValueError(f"got {len(start_logits)} logit rows for {len(feature_ids)} features")
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2:
        raise ValueError(f"start/end logits must be two arrays of one 2-D shape, got {start_logits.shape} "
                         f"and {end_logits.shape}")
    ids = list(examples["id"])
    contexts = examples["context"]
    if not isinstance(contexts, list):  # e.g. a datasets Column: item access reads a whole row each time
        contexts = list(contexts)
    n_ex, n_feat = len(ids), len(start_logits)
    k = cfg.n_best_size
    ex_of_feat = _example_index(ids, list(feature_ids))
    offs = flat_offsets(features["offset_mapping"])
    if len(offs.length) != n_feat:
        raise ValueError(f"got {len(offs.length)} offset rows for {n_feat} features")

    # 1. ranked candidates per feature
    s_idx = top_k_like_argsort(start_logits, k)
    e_idx = top_k_like_argsort(end_logits, k)
    s_val = np.take_along_axis(start_logits, s_idx, axis=1)
    e_val = np.take_along_axis(end_logits, e_idx, axis=1)

    # 2. validity of every (start rank, end rank) pair, as the loop tests it
    length = offs.length[:, None]
    s_in, e_in = s_idx < length, e_idx < length
    s_flat = offs.row_start[:, None] + np.where(s_in, s_idx, 0)
    e_flat = offs.row_start[:, None] + np.where(e_in, e_idx, 0)
    total = len(offs.valid)
    s_ok = s_in & (offs.valid[np.minimum(s_flat, max(total - 1, 0))] if total else False)
    e_ok = e_in & (offs.valid[np.minimum(e_flat, max(total - 1, 0))] if total else False)
    small = start_logits.shape[1] < 2**15
    idx_t = np.int16 if small else np.int64
    span = e_idx.astype(idx_t)[:, None, :] - s_idx.astype(idx_t)[:, :, None]
    # 0 <= span < max_answer_length in one comparison: negative spans wrap to huge unsigned values
    fits = span.view(np.uint16 if small else np.uint64) < cfg.max_answer_length
    ok = fits & s_ok[:, :, None] & e_ok[:, None, :]
    scores = s_val[:, :, None] + e_val[:, None, :]  # in the logits' dtype, like the loop's scalar sums
    n_pairs = scores.shape[1] * scores.shape[2]
    if n_feat and n_pairs > k and not (np.isnan(s_val).any() or np.isnan(e_val).any()):
        # only a feature's own top n_best can reach its example's top n_best: keep the pairs scoring at least
        # the n_best-th valid score (ties kept; the stable sort settles them). Features with fewer valid
        # pairs get -inf there and keep them all. Done on every feature at once: most are crowded, and
        # gathering the crowded ones would cost more than it saves.
        kth = _kth_largest(np.where(ok, scores, -np.inf).reshape(n_feat, n_pairs), k)
        ok &= scores >= kth[:, None, None]
    f_c, si_c, ei_c = np.nonzero(ok)  # C order = the loop's insertion order within a feature
    score_native = scores[f_c, si_c, ei_c]
    score_c = score_native.astype(np.float64)
    ex_c = ex_of_feat[f_c]

    # 3. per example, candidates by descending score; stable, so ties keep insertion order. Features of one
    #    example are visited in feature order by the loop, which a stable sort on the example index keeps.
    order = _by_example_then_score(ex_c, score_native, n_ex)
    ex_sorted = ex_c[order]
    counts = np.bincount(ex_sorted, minlength=n_ex)
    first = np.zeros(n_ex + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    rank = np.arange(len(order)) - first[ex_sorted]
    top = order[rank < k]  # still grouped by example, best first
    n_top = np.minimum(counts, k)
    top_first = np.zeros(n_ex + 1, dtype=np.int64)
    np.cumsum(n_top, out=top_first[1:])

    f_t, si_t, ei_t = f_c[top], si_c[top], ei_c[top]
    score_t = score_c[top]
    sl_t = s_val[f_t, si_t].astype(np.float64).tolist()
    el_t = e_val[f_t, ei_t].astype(np.float64).tolist()
    char_s = offs.start[s_flat[f_t, si_t]].tolist()
    char_e = offs.end[e_flat[f_t, ei_t]].tolist()
    ex_t = ex_c[top].tolist()
    texts = [contexts[e][a:b] for e, a, b in zip(ex_t, char_s, char_e)]

    if not cfg.version_2_with_negative:
        return _v1_output(ids, texts, score_t, sl_t, el_t, n_top, top_first)
    # v2: the smallest null score (CLS start + end) over each example's features
    has_feat = np.bincount(ex_of_feat, minlength=n_ex) > 0
    mins = np.full(n_ex, np.inf)
    if n_feat:
        np.minimum.at(mins, ex_of_feat, (start_logits[:, 0] + end_logits[:, 0]).astype(np.float64))
    return _v2_output(ids, texts, score_t, sl_t, el_t, n_top, top_first, mins, has_feat, cfg)


def _v2_output(
    ids: list[str], texts: list[str], scores: np.ndarray, start_l: list[float], end_l: list[float],
    n_top: np.ndarray, first: np.ndarray, min_null: np.ndarray, with_null: np.ndarray, cfg: PostprocessConfig,
) -> QAPredictions:
    """SQuAD v2 results: each example's spans with its null answer slotted in where the loop's sort puts it.

    The loop sorts spans + null by score (stable, so the null goes after spans of equal score), keeps
    n_best, and appends the null when it fell off. Per example: pos = spans scoring >= null; if pos < n_best
    the list is spans[:pos] + null + spans[pos:n_best - 1], else spans[:n_best] + null. Every list is laid
    out in one flat array, softmaxed per list length on 2-D arrays, and cut into per-example slices.
    with_null: examples that have features (each such example has a null score).
    """
    k = cfg.n_best_size
    n_ex = len(ids)
    ex_of = np.repeat(np.arange(n_ex), n_top)
    ge = (scores >= min_null[ex_of]).astype(np.int64)
    pos = np.bincount(ex_of, weights=ge, minlength=n_ex).astype(np.int64) if len(ex_of) else np.zeros(n_ex, np.int64)
    kept = np.where(with_null & (pos < k), np.minimum(n_top, k - 1), n_top)
    total = np.where(with_null, kept + 1, np.maximum(kept, 1))  # no features: one empty answer
    out_first = np.zeros(n_ex + 1, dtype=np.int64)
    np.cumsum(total, out=out_first[1:])
    n_out = int(out_first[-1])

    # flat slots: span j of example e -> out_first[e] + j + (j >= pos[e]); the null -> out_first[e] + pos[e]
    j = np.arange(len(ex_of)) - first[ex_of]
    span_keep = j < kept[ex_of]
    span_src = np.flatnonzero(span_keep)
    span_ex, span_j = ex_of[span_keep], j[span_keep]
    span_slot = out_first[span_ex] + span_j + (with_null[span_ex] & (span_j >= pos[span_ex]))
    null_ex = np.flatnonzero(with_null)
    null_slot = out_first[null_ex] + pos[null_ex]
    empty_ex = np.flatnonzero(~with_null & (kept == 0))
    empty_slot = out_first[empty_ex]

    slot_scores = np.zeros(n_out, dtype=np.float64)  # the empty answer scores 0.0
    slot_scores[span_slot] = scores[span_src]
    slot_scores[null_slot] = min_null[null_ex]
    probs = _grouped_softmax(slot_scores, out_first, total)

    # one dict per slot, built in bulk per kind, then put in slot order
    if len(span_src) == len(texts):  # usually no span is cut: take the lists as they are
        t_k, sl_k, el_k = texts, start_l, end_l
    else:
        src = span_src.tolist()
        t_k, sl_k, el_k = [texts[i] for i in src], [start_l[i] for i in src], [end_l[i] for i in src]
    span_dicts = [
        {"text": t, "probability": p, "score": sc, "start_logit": a, "end_logit": b}
        for t, p, sc, a, b in zip(t_k, probs[span_slot].tolist(), scores[span_src].tolist(), sl_k, el_k)
    ]
    null_dicts = [
        {"text": "", "probability": p, "score": sc, "start_logit": None, "end_logit": None}
        for p, sc in zip(probs[null_slot].tolist(), min_null[null_ex].tolist())
    ]
    empty_dicts = [
        {"text": "", "probability": p, "score": 0.0, "start_logit": 0.0, "end_logit": 0.0}
        for p in probs[empty_slot].tolist()
    ]
    order = np.argsort(np.concatenate([span_slot, null_slot, empty_slot]), kind="stable").tolist()
    pool = span_dicts + null_dicts + empty_dicts
    dicts = [pool[i] for i in order]

    # answer: the best span unless the null beats it by more than the threshold
    has_span = kept > 0
    best = first[:-1][has_span]
    best_sl = np.array(start_l, dtype=np.float64)[best] if len(best) else np.zeros(0)
    best_el = np.array(end_l, dtype=np.float64)[best] if len(best) else np.zeros(0)
    odds = np.where(with_null, min_null, 0.0)
    odds[has_span] = min_null[has_span] - best_sl - best_el  # same float64 operations as the loop
    pick = np.zeros(n_ex, dtype=bool)
    pick[has_span] = ~(odds[has_span] > cfg.null_score_diff_threshold)
    best_of = np.zeros(n_ex, dtype=np.int64)
    best_of[has_span] = best
    answers: dict[str, str] = {}
    nbest: dict[str, list[dict]] = {}
    null_odds: dict[str, float] = {}
    bounds = out_first.tolist()
    for ex, (qid, o, pk, b) in enumerate(zip(ids, odds.tolist(), pick.tolist(), best_of.tolist())):
        nbest[qid] = dicts[bounds[ex] : bounds[ex + 1]]
        null_odds[qid] = o
        answers[qid] = texts[b] if pk else ""
    return QAPredictions(answers, nbest, null_odds)


def _v1_output(
    ids: list[str], texts: list[str], scores: np.ndarray, start_l: list[float], end_l: list[float],
    n_top: np.ndarray, first: np.ndarray,
) -> QAPredictions:
    """SQuAD v1 results from flat per-candidate lists grouped by example (no per-example array work)."""
    probs = _grouped_softmax(scores, first, n_top)
    entries = [
        {"text": t, "probability": p, "score": s, "start_logit": a, "end_logit": b}
        for t, p, s, a, b in zip(texts, probs.tolist(), scores.tolist(), start_l, end_l)
    ]
    answers: dict[str, str] = {}
    nbest: dict[str, list[dict]] = {}
    bounds = first.tolist()
    for ex, qid in enumerate(ids):
        lo, hi = bounds[ex], bounds[ex + 1]
        if hi > lo:
            nbest[qid] = entries[lo:hi]
            answers[qid] = texts[lo]
        else:  # no valid span in any feature: the loop's empty answer
            nbest[qid] = [{"text": "", "probability": 1.0, "score": 0.0, "start_logit": 0.0, "end_logit": 0.0}]
            answers[qid] = ""
    return QAPredictions(answers, nbest, None)


def _grouped_softmax(scores: np.ndarray, first: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """utils_qa._softmax of every list scores[first[i] : first[i] + lengths[i]], same floats.

    One 2-D array per list length, so the max, exp and sum run in numpy, not per list.
    """
    probs = np.empty(len(scores), dtype=np.float64)
    for m in np.unique(lengths[lengths > 0]).tolist():
        rows = np.flatnonzero(lengths == m)
        idx = first[rows][:, None] + np.arange(m)
        mat = scores[idx]
        exp = np.exp(mat - np.max(mat, axis=1, keepdims=True))
        probs[idx] = exp / exp.sum(axis=1, keepdims=True)
    return probs


__all__ = ["FlatOffsets", "flat_offsets", "mask_padding", "postprocess_qa_predictions_vectorized", "top_k_like_argsort"]
