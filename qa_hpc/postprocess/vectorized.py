"""Vectorized QA postprocessing: exactly the answers of reference.postprocess_qa_predictions_loop, sooner.

The reference loop visits every feature and tries n_best x n_best (start, end) pairs in Python:
about 4 million iterations on the SQuAD dev set, more time than a GPU needs for the whole forward
pass. This module does the same work on arrays (figures in docs/PERFORMANCE.md):

1. the top-n_best start and end positions of every feature at once, ranked as the loop's np.argsort
   ranks them, ties included (ranking.top_k_with_values);
2. all n_best x n_best scores of every feature as one array, masked by the loop's validity rules
   (context tokens only, end >= start, at most max_answer_length tokens), and pruned to the pairs
   that can still reach their example's n-best;
3. the n-best lists, answers and null odds from the surviving candidates (nbest_lists).

Scores are sums in the logits' own dtype, then Python floats, like the loop's; every sort is stable,
so candidates of equal score keep the loop's insertion order (feature, start rank, end rank).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from qa_hpc.postprocess.nbest_lists import Spans, assemble_predictions
from qa_hpc.postprocess.offsets import FlatOffsets, flat_offsets
from qa_hpc.postprocess.ranking import (
    as_tensor,
    first_minimum,
    kth_largest,
    top_k_with_values,
)
from qa_hpc.postprocess.reference import PostprocessConfig, QAPredictions


def mask_padding(
    logits: tuple[np.ndarray, np.ndarray], lengths: np.ndarray, fill: float = -100.0
) -> tuple[np.ndarray, np.ndarray]:
    """Logits past each feature's real length set to `fill` (the Trainer's own padding value), as new arrays.

    With dynamic padding a feature's row holds the model's output on pad tokens up to its batch's
    width, and those values compete for the top n_best start/end slots. Batch widths depend on which
    features share a batch (length-sorted or not, batch size, world size), so unmasked they would make
    answers depend on batching. Masked, every feature's row depends only on the feature.
    """
    start, end = (as_tensor(np.asarray(arr)) for arr in logits)
    keep = torch.arange(start.shape[1])[None, :] < torch.as_tensor(np.asarray(lengths))[:, None]
    # torch.where writes new arrays (the caller's stay as they are), in the logits' dtype, on every core
    return torch.where(keep, start, fill).numpy(), torch.where(keep, end, fill).numpy()


def postprocess_qa_predictions_vectorized(
    examples: Mapping[str, Sequence],
    features: Mapping[str, Any],
    predictions: tuple[np.ndarray, np.ndarray],
    cfg: PostprocessConfig,
) -> QAPredictions:
    """Same contract and same output as reference.postprocess_qa_predictions_loop.

    features["offset_mapping"] is best the features' Arrow column (what run_qa.py hands over); Python
    lists work too, converted to Arrow first.
    """
    start_logits, end_logits = (np.asarray(p) for p in predictions)
    feature_ids = list(features["example_id"])
    if len(start_logits) != len(feature_ids):
        raise ValueError(f"got {len(start_logits)} logit rows for {len(feature_ids)} features")
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2:
        raise ValueError(f"start/end logits must be two arrays of one 2-D shape, got {start_logits.shape} "
                         f"and {end_logits.shape}")
    ids = list(examples["id"])
    contexts = list(examples["context"])  # e.g. a datasets Column reads a whole row on each item access
    ex_of_feat = _example_index(ids, feature_ids)
    offs = flat_offsets(features["offset_mapping"])
    if len(offs.length) != len(feature_ids):
        raise ValueError(f"got {len(offs.length)} offset rows for {len(feature_ids)} features")
    spans = _span_candidates(start_logits, end_logits, offs, ex_of_feat, cfg)
    if not cfg.version_2_with_negative:
        return assemble_predictions(ids, contexts, spans, cfg)
    # v2: each example's null score is the smallest CLS start + end over its features, as the loop finds it
    null = (start_logits[:, 0] + end_logits[:, 0]).astype(np.float64)
    has_null = np.bincount(ex_of_feat, minlength=len(ids)) > 0
    return assemble_predictions(ids, contexts, spans, cfg, first_minimum(null, ex_of_feat, len(ids)), has_null)


def _span_candidates(start_logits: np.ndarray, end_logits: np.ndarray, offs: FlatOffsets, ex_of_feat: np.ndarray,
                     cfg: PostprocessConfig) -> Spans:
    """Every valid (start, end) pair that can reach its example's n-best, one row each."""
    k = cfg.n_best_size
    s_idx, s_val = top_k_with_values(start_logits, k)
    e_idx, e_val = top_k_with_values(end_logits, k)
    s_ok, s_flat = offs.context_tokens(s_idx)
    e_ok, e_flat = offs.context_tokens(e_idx)
    ok = s_ok[:, :, None] & e_ok[:, None, :]  # [feature, start rank, end rank]
    # int32: half the memory traffic of int64 over the ~4 million pairs of a dev set, and room for any width
    n_tokens = e_idx.astype(np.int32)[:, None, :] - s_idx.astype(np.int32)[:, :, None] + 1
    ok &= n_tokens >= 1
    ok &= n_tokens <= cfg.max_answer_length
    scores = s_val[:, :, None] + e_val[:, None, :]  # in the logits' dtype, like the loop's scalar sums
    ok = _prune_to_top_pairs(ok, scores, k)
    flat = np.flatnonzero(ok)  # C order = the loop's insertion order within a feature
    feature, pair = np.divmod(flat, scores.shape[1] * scores.shape[2])
    s_rank, e_rank = np.divmod(pair, scores.shape[2])
    return Spans(
        example=ex_of_feat[feature],
        score=scores.reshape(-1)[flat].astype(np.float64),
        start_logit=s_val[feature, s_rank].astype(np.float64),
        end_logit=e_val[feature, e_rank].astype(np.float64),
        char_start=offs.start_at(s_flat[feature, s_rank]),
        char_end=offs.end_at(e_flat[feature, e_rank]),
    )


def _prune_to_top_pairs(ok: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """`ok` less the pairs scoring below their feature's k-th best valid pair.

    Such a pair has k better pairs in its own example, so it can never be in the example's n-best;
    pairs equal to the k-th are kept (the stable sort settles ties). Features with fewer valid pairs get
    -inf there and keep them all. On the SQuAD dev set this leaves ~0.2 of its ~0.6 million valid pairs
    for the per-example sort, which costs more than the pruning. A NaN score makes the k-th value
    meaningless (NaN compares False), so then nothing is pruned.
    """
    n_feat, n_pairs = ok.shape[0], ok.shape[1] * ok.shape[2]
    if n_feat == 0 or n_pairs <= k or np.isnan(scores).any():
        return ok
    kth = kth_largest(np.where(ok, scores, -np.inf).reshape(n_feat, n_pairs), k)
    return ok & (scores >= kth[:, None, None])


def _example_index(example_ids: Sequence[str], feature_example_ids: Sequence[str]) -> np.ndarray:
    """Index of each feature's example; raises, like the loop, on an unknown example id."""
    index = {eid: i for i, eid in enumerate(example_ids)}
    try:
        return np.fromiter((index[e] for e in feature_example_ids), dtype=np.int64, count=len(feature_example_ids))
    except KeyError as err:
        pos = next(f for f, e in enumerate(feature_example_ids) if e not in index)
        raise ValueError(f"feature {pos} belongs to unknown example id {err.args[0]!r}") from None


__all__ = ["mask_padding", "postprocess_qa_predictions_vectorized"]
