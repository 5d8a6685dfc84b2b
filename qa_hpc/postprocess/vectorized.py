"""Vectorized QA postprocessing: exactly the answers of utils_qa.postprocess_qa_predictions_loop, sooner.

On the SQuAD v1.1 dev set: ~46x less time than the loop as run_qa.py runs it, ~24x from pre-built
lists (docs/PERFORMANCE.md).

The reference loop visits every feature and tries n_best x n_best (start, end)
pairs in Python: about 4 million iterations on the SQuAD dev set, more time than a
GPU needs for the whole forward pass. This module does the same work on arrays:

1. top-n_best start and end positions of every feature at once (argpartition,
   then a sort of the few survivors);
2. all n_best x n_best scores of every feature as one array, masked by the same
   validity rules (context tokens only, end >= start, at most max_answer_length);
3. one stable sort of the surviving candidates by (example, -score), on a packed integer key;
4. the first n_best per example, the v2 null answer and softmax on flat arrays, kept as an
   nbest_table.NBestTable: the n-best dicts and texts are built when read or written, not here.

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

from qa_hpc.postprocess.nbest_table import NBestTable, SpanTexts
from qa_hpc.postprocess.reference import PostprocessConfig, QAPredictions


@dataclass
class FlatOffsets:
    """Offsets of all features laid end to end, read only where a candidate needs them.

    Feature f owns flat positions row_start[f] .. row_start[f] + length[f] - 1. Token i is a context
    token when valid[i]; its offsets are then values[pair_at[i]] and values[pair_at[i] + 1]. From Arrow
    these are the column's own buffers (no copy of the ~2 million offsets of a dev set).
    """

    row_start: np.ndarray  # int64 [F]
    length: np.ndarray  # int64 [F]
    valid: np.ndarray  # bool [T]
    pair_at: np.ndarray  # int [T]; meaningful where valid
    values: np.ndarray  # int64, start/end character offsets

    def start_at(self, tokens: np.ndarray) -> np.ndarray:
        """Start character of each (valid) flat token index."""
        return self.values[self.pair_at[tokens]].astype(np.int64)

    def end_at(self, tokens: np.ndarray) -> np.ndarray:
        return self.values[self.pair_at[tokens] + 1].astype(np.int64)

    @property
    def start(self) -> np.ndarray:
        """Start of every token (0 outside the context): the whole column, for checks."""
        out = np.zeros(len(self.valid), dtype=np.int64)
        out[self.valid] = self.start_at(np.flatnonzero(self.valid))
        return out

    @property
    def end(self) -> np.ndarray:
        out = np.zeros(len(self.valid), dtype=np.int64)
        out[self.valid] = self.end_at(np.flatnonzero(self.valid))
        return out


def flat_offsets(offset_mapping: Any) -> FlatOffsets:
    """Offsets from a pyarrow (Chunked)Array of list<list<int>> or from Python lists."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError:  # pragma: no cover - pyarrow comes with datasets
        pa = None
    if pa is not None and isinstance(offset_mapping, (pa.Array, pa.ChunkedArray)):
        arr = offset_mapping.combine_chunks() if isinstance(offset_mapping, pa.ChunkedArray) else offset_mapping
        if not (pa.types.is_list(arr.type) and pa.types.is_list(arr.type.value_type)):
            arr = arr.cast(pa.list_(pa.list_(pa.int64())))  # e.g. list<null> when a column holds no offsets at all
        length = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        tokens = arr.flatten()  # one entry per token, null outside the context; honours slices of arr
        valid = tokens.is_valid().to_numpy(zero_copy_only=False)
        pair_at = tokens.offsets.to_numpy()[:-1]  # where each token's pair sits in tokens.values
        pair_len = pc.min_max(pc.list_value_length(tokens))  # nulls (non-context tokens) skipped
        if pair_len["min"].as_py() not in (None, 2) or pair_len["max"].as_py() not in (None, 2):
            raise ValueError("offset_mapping entries must be [start, end] pairs or null")
        values = tokens.values
        if values.null_count:
            raise ValueError("offset_mapping pairs must not hold nulls")
        values = values.to_numpy(zero_copy_only=False)
        if not np.issubdtype(values.dtype, np.integer):
            values = values.astype(np.int64)
    else:
        rows = list(offset_mapping)
        length = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        flat = list(itertools.chain.from_iterable(rows))
        valid = np.fromiter((o is not None for o in flat), dtype=bool, count=len(flat))
        pairs = [o for o in flat if o is not None]
        values = np.zeros(0, dtype=np.int64)
        pair_at = np.zeros(len(flat), dtype=np.int64)
        if pairs:  # fromiter over the flattened pairs: about 2x sooner than np.asarray on a list of tuples
            if np.any(np.fromiter(map(len, pairs), dtype=np.int64, count=len(pairs)) != 2):
                raise ValueError("offset_mapping entries must be [start, end] pairs or None")
            values = np.fromiter(itertools.chain.from_iterable(pairs), dtype=np.int64, count=2 * len(pairs))
            pair_at[valid] = np.arange(0, 2 * len(pairs), 2)
    row_start = np.zeros(len(length), dtype=np.int64)
    np.cumsum(length[:-1], out=row_start[1:])
    return FlatOffsets(row_start, length, valid, pair_at, values)


def top_k_like_argsort(logits: np.ndarray, k: int) -> np.ndarray:
    """Per row, `np.argsort(row)[-1:-k-1:-1]`: indices of the k largest, largest first.

    Rows whose top k (plus the next value, which decides membership) hold no equal
    values and no NaN have exactly one such ranking, found with argpartition. Any
    other row is ranked by np.argsort itself, so ties come out as the loop has them.
    """
    return top_k_with_values(logits, k)[0]


def top_k_with_values(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """top_k_like_argsort's indices and the logits at them (what take_along_axis would give)."""
    n, width = logits.shape
    k_eff = min(k, width)
    if n == 0 or width == 0:
        return np.zeros((n, k_eff), dtype=np.int64), np.zeros((n, k_eff), dtype=logits.dtype)
    keep = min(k_eff + 1, width)  # the (k+1)-th value decides whether the k-th is unique
    ranked, ranked_vals = _top_sorted(logits, keep)
    ambiguous = np.any(ranked_vals[:, :-1] == ranked_vals[:, 1:], axis=1) | np.isnan(ranked_vals).any(axis=1)
    out = ranked[:, :k_eff].astype(np.int64)
    vals = np.ascontiguousarray(ranked_vals[:, :k_eff]).astype(logits.dtype, copy=False)
    for row in np.flatnonzero(ambiguous):
        out[row] = np.argsort(logits[row])[-1 : -k - 1 : -1]
        vals[row] = logits[row, out[row]]
    return out, vals


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
        keep = np.arange(arr.shape[1])[None, :] < np.asarray(lengths)[:, None]
        try:  # torch runs the select on every core; numpy on one
            import torch

            if not arr.flags.writeable:  # torch.from_numpy warns about read-only arrays
                raise TypeError("read-only")
            out.append(torch.where(torch.from_numpy(keep), torch.from_numpy(arr), fill).numpy())
        except (ImportError, RuntimeError, TypeError, ValueError):  # no torch, a dtype or layout it lacks
            out.append(np.where(keep, arr, np.asarray(fill, dtype=arr.dtype)))
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
    s_idx, s_val = top_k_with_values(start_logits, k)
    e_idx, e_val = top_k_with_values(end_logits, k)

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
    flat_c = np.flatnonzero(ok)  # C order = the loop's insertion order within a feature
    f_c, pair_c = np.divmod(flat_c, n_pairs)
    si_c, ei_c = np.divmod(pair_c, scores.shape[2])
    score_native = scores.reshape(-1)[flat_c]
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
    sl_t = s_val[f_t, si_t].astype(np.float64)
    el_t = e_val[f_t, ei_t].astype(np.float64)
    spans = SpanTexts(contexts, ex_c[top], offs.start_at(s_flat[f_t, si_t]), offs.end_at(e_flat[f_t, ei_t]))

    if not cfg.version_2_with_negative:
        return _assemble(ids, spans, score_t, sl_t, el_t, n_top, top_first, cfg, None, np.zeros(n_ex, dtype=bool))
    # v2: the smallest null score (CLS start + end) over each example's features
    has_feat = np.bincount(ex_of_feat, minlength=n_ex) > 0
    null = (start_logits[:, 0] + end_logits[:, 0]).astype(np.float64)
    mins = _first_minimum(null, ex_of_feat, n_ex)
    return _assemble(ids, spans, score_t, sl_t, el_t, n_top, top_first, cfg, mins, has_feat)


def _first_minimum(values: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group, the loop's `if first or v < best: best = v` over its values in order (inf where none).

    Not just np.minimum.at: among equal values the loop keeps the first (0.0 and -0.0 are equal but
    are written differently), and a NaN is kept only when it comes first (nothing is < NaN, NaN < x is False).
    """
    mins = np.full(n_groups, np.inf)
    if not len(values):
        return mins
    np.fmin.at(mins, group, values)  # fmin: NaN never wins
    hits = np.flatnonzero(values == mins[group])
    _, first_hit = np.unique(group[hits], return_index=True)  # hits are in order: the first per group
    mins[group[hits[first_hit]]] = values[hits[first_hit]]
    _, first_feat = np.unique(group, return_index=True)
    nan_first = np.isnan(values[first_feat])
    mins[group[first_feat[nan_first]]] = np.nan
    return mins


def _assemble(
    ids: list[str], spans: SpanTexts, scores: np.ndarray, start_l: np.ndarray, end_l: np.ndarray,
    n_top: np.ndarray, first: np.ndarray, cfg: PostprocessConfig, min_null: np.ndarray | None,
    with_null: np.ndarray,
) -> QAPredictions:
    """Answers and the n-best table from each example's spans (flat, grouped by example, best first).

    Lays out every example's n-best list as the loop builds it, in one flat set of columns:
    - v1 (with_null all False): the spans; an example without any span gets the loop's single empty
      answer (text "", scores and logits 0.0).
    - v2 (with_null: examples that have features, hence a null score): the loop sorts spans + null by
      score (stable, so the null goes after spans of equal score), keeps n_best, and appends the null
      when it fell off. Per example: pos = spans scoring >= null; if pos < n_best the list is
      spans[:pos] + null + spans[pos:n_best - 1], else spans[:n_best] + null.
    Then one softmax per list (grouped by length), and no per-entry dicts: NBestTable builds them on read.
    """
    k = cfg.n_best_size
    n_ex = len(ids)
    ex_of = np.repeat(np.arange(n_ex), n_top)
    if min_null is not None and len(ex_of):
        ge = (scores >= min_null[ex_of]).astype(np.int64)
        pos = np.bincount(ex_of, weights=ge, minlength=n_ex).astype(np.int64)
    else:
        pos = np.zeros(n_ex, dtype=np.int64)
    kept = np.where(with_null & (pos < k), np.minimum(n_top, k - 1), n_top)
    total = np.where(with_null, kept + 1, np.maximum(kept, 1))  # no span and no null: one empty answer
    out_first = np.zeros(n_ex + 1, dtype=np.int64)
    np.cumsum(total, out=out_first[1:])
    n_out = int(out_first[-1])

    # flat slots: span j of example e -> out_first[e] + j + (j >= pos[e] when e has a null);
    # the null -> out_first[e] + pos[e]; the empty answer -> out_first[e]
    j = np.arange(len(ex_of)) - first[ex_of]
    span_keep = j < kept[ex_of]
    span_src = np.flatnonzero(span_keep)
    span_ex, span_j = ex_of[span_keep], j[span_keep]
    span_slot = out_first[span_ex] + span_j + (with_null[span_ex] & (span_j >= pos[span_ex]))
    null_ex = np.flatnonzero(with_null)
    null_slot = out_first[null_ex] + pos[null_ex]

    score_out = np.zeros(n_out, dtype=np.float64)  # the empty answer scores 0.0
    start_out = np.zeros(n_out, dtype=np.float64)
    end_out = np.zeros(n_out, dtype=np.float64)
    score_out[span_slot] = scores[span_src]
    start_out[span_slot] = start_l[span_src]
    end_out[span_slot] = end_l[span_src]
    logits_none = None
    if len(null_ex):
        score_out[null_slot] = min_null[null_ex]
        logits_none = np.zeros(n_out, dtype=bool)
        logits_none[null_slot] = True  # the null answer has no start/end logit
    if n_out == len(spans) == len(span_src):  # every span kept, no null, no empty answer: slots are 0..n-1
        text_out = spans
    else:  # the null and the empty answer are "": context 0, characters 0..0
        cols = [np.zeros(n_out, dtype=np.int64) for _ in range(3)]
        for col, src in zip(cols, (spans.example, spans.start, spans.end)):
            col[span_slot] = src[span_src]
        text_out = SpanTexts(spans.contexts, *cols)
    probs = _grouped_softmax(score_out, out_first, total)
    table = NBestTable(ids, out_first, text_out, probs, score_out, start_out, end_out, logits_none)

    # answer: the best span (v2: unless the null beats it by more than the threshold)
    has_span = kept > 0
    best = first[:-1][has_span]
    if min_null is None:
        pick, odds = has_span, None
    else:
        odds = np.where(with_null, min_null, 0.0)
        odds[has_span] = min_null[has_span] - start_l[best] - end_l[best]  # same float64 operations as the loop
        pick = has_span & ~(odds > cfg.null_score_diff_threshold)
    texts = [""] * n_ex
    picked = np.flatnonzero(pick)
    best_span = first[:-1][picked]
    for ex, text in zip(picked.tolist(), SpanTexts(spans.contexts, spans.example[best_span], spans.start[best_span],
                                                    spans.end[best_span]).cut()):
        texts[ex] = text
    answers = dict(zip(ids, texts))
    return QAPredictions(answers, table, None if odds is None else dict(zip(ids, odds.tolist())))

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


__all__ = ["FlatOffsets", "flat_offsets", "mask_padding", "postprocess_qa_predictions_vectorized", "top_k_like_argsort",
           "top_k_with_values"]
