"""Logits -> answers, n-best lists and (v2) null odds: what the HF example's loop gives, 20x+ sooner.

That loop (tests/fixtures/postprocess_loop.py, the oracle the tests and bench/postprocess_bench.py hold this
module to) tries n_best x n_best (start, end) pairs per feature in Python (~4 million on the SQuAD dev set).
Here the top-n_best starts and ends of all features become one grid of pairs, masked by the loop's rules; one
stable sort by (example, -score) then does the loop's sorts, n_best cut and null re-insertion at once. Scores
are sums in the logits' dtype, then float64, as the loop's; stable sorts keep its order among equal scores.
NaN or infinite logits (a diverged model) are refused: no answer read from them means anything.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import torch

from qa_hpc.atomic_io import json_text, write_text_atomic
from qa_hpc.errors import UsageError
from qa_hpc.features import real_lengths

logger = logging.getLogger(__name__)

Logits = tuple[np.ndarray, np.ndarray]
PAD_LOGIT = -100.0  # the Trainer's padding value, and the logit of a position past a feature's end


@dataclass(frozen=True)
class PostprocessConfig:
    """How logits become answers (the HF example's flags of the same names)."""

    version_2_with_negative: bool = False
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0


@dataclass
class QAPredictions:
    """Answers per example id, their n-best lists, and (v2) null-score differences."""

    answers: dict[str, str]
    # per example id: text, probability, score, start_logit, end_logit; best first
    nbest: Mapping[str, list[dict]]
    null_odds: dict[str, float] | None


class DivergedModel(UsageError):
    """NaN or infinite logits: the model diverged (exit 2, as other settings that cannot work)."""


def refuse_non_finite(logits: Logits, what: str) -> None:
    """Raise DivergedModel counting the NaN and infinite values in `logits` (one row per feature), if any:
    answers read from them follow no rule (NaN compares false with everything), and a silent EM of 0 costs a
    user a night."""
    start, end = (np.asarray(x) for x in logits)
    nan = int(np.count_nonzero(np.isnan(start))) + int(np.count_nonzero(np.isnan(end)))
    inf = int(np.count_nonzero(np.isinf(start))) + int(np.count_nonzero(np.isinf(end)))
    if nan or inf:
        rows = int(np.count_nonzero(~np.isfinite(start).all(axis=1) | ~np.isfinite(end).all(axis=1)))
        raise DivergedModel(
            f"{what} have {nan} NaN values and {inf} infinite values, in {rows} of {len(start)} features: "
            "the model diverged, so no answers were written; train again with a lower --learning_rate or in "
            "--precision bf16 or fp32 rather than fp16 (with --overwrite_output_dir or another --output_dir: "
            "its checkpoints are the diverged run's), or evaluate an earlier checkpoint"
        )


def example_of_features(
    example_ids: Sequence[str], feature_example_ids: Sequence[str], logit_rows: int
) -> list[int]:
    """The example index of every feature (a repeated id: its last place); ValueError names what is wrong."""
    if logit_rows != len(feature_example_ids):
        raise ValueError(f"got {logit_rows} logit rows for {len(feature_example_ids)} features")
    index = {eid: i for i, eid in enumerate(example_ids)}
    for f, eid in enumerate(feature_example_ids):
        if eid not in index:
            raise ValueError(f"feature {f} belongs to unknown example id {eid!r}")
    return [index[eid] for eid in feature_example_ids]


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing the array's memory (a read-only or strided one is copied: torch takes neither)."""
    return torch.from_numpy(np.require(array, requirements=["C", "W"]))


def mask_padding(logits: Logits, lengths: np.ndarray) -> Logits:
    """Logits past each feature's real length set to PAD_LOGIT, as new arrays.

    With dynamic padding a feature's row is as wide as its batch, and the model's outputs on its pad tokens
    would compete for the n-best: the answers would depend on which features share a batch."""
    start, end = (np.asarray(arr) for arr in logits)
    keep = np.arange(start.shape[1]) < np.asarray(lengths)[:, None]
    # a Python float keeps the logits' dtype
    return np.where(keep, start, PAD_LOGIT), np.where(keep, end, PAD_LOGIT)


def top_k_with_values(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, `np.argsort(row)[-1:-k-1:-1]` (the loop's ranking) and the logits at those indices.

    torch.topk ranks all rows at once; a row with equal values among its k + 1 largest (common with bf16
    logits or -100 padding) is ranked by np.argsort itself, whose order among equal values is its own."""
    width = logits.shape[1]
    k = min(k, width)
    # k + 1: a tie across the cut changes which indices make the top k (an empty array is fine)
    values, indices = (t.numpy() for t in torch.topk(_tensor(logits), min(k + 1, width), dim=1))
    ambiguous = np.any(values[:, :-1] == values[:, 1:], axis=1)
    indices = indices[:, :k].copy()
    values = values[:, :k].copy()
    for row in np.flatnonzero(ambiguous).tolist():
        indices[row] = np.argsort(logits[row])[-1 : -k - 1 : -1]
        values[row] = logits[row, indices[row]]
    return indices, values


def token_chars(offset_mapping: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(first token, token count) of each feature, per token (in the context?, index of its pair), and the
    [start, end] character pairs, read as Arrow so that a dev set's ~2 million offsets never become Python
    objects. One more token, outside the context, stands for positions past a feature's length."""
    if not isinstance(offset_mapping, (pa.Array, pa.ChunkedArray)):
        offset_mapping = pa.array(offset_mapping)
    arr = offset_mapping
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not (pa.types.is_list(arr.type) and pa.types.is_list(arr.type.value_type)):
        # e.g. list<null> when a column holds no offsets at all
        arr = arr.cast(pa.list_(pa.list_(pa.int64())))
    length = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    # one entry per token, null outside the context
    tokens = pc.list_flatten(arr)
    pair_len = pc.min_max(pc.list_value_length(tokens))  # nulls skipped
    if {pair_len["min"].as_py(), pair_len["max"].as_py()} - {None, 2}:
        raise ValueError("offset_mapping entries must be [start, end] pairs or null")
    values = pc.list_flatten(tokens)
    if values.null_count:
        raise ValueError("offset_mapping pairs must not hold nulls")
    in_context = np.append(tokens.is_valid().to_numpy(zero_copy_only=False), False)
    return (
        np.cumsum(length) - length,
        length,
        in_context,
        np.cumsum(in_context) - 1,
        values.to_numpy().reshape(-1, 2),
    )


def _span_candidates(logits: Logits, offsets: Any, ex_of_feat: np.ndarray, cfg: PostprocessConfig) -> dict:
    """Every valid (start, end) pair that can reach its example's n-best, one row each: example, score,
    start_logit, end_logit, char_start, char_end."""
    first, length, in_context, pair, chars = token_chars(offsets)
    if len(length) != len(ex_of_feat):
        raise ValueError(f"got {len(length)} offset rows for {len(ex_of_feat)} features")
    # The start and end heads score every position on their own; pairing all of them is a sequence's length
    # squared per feature. Only each head's n_best likeliest positions are paired (a valid span outside them
    # is never tried), which bounds the search, as in the HF example.
    s_idx, s_val = top_k_with_values(logits[0], cfg.n_best_size)
    e_idx, e_val = top_k_with_values(logits[1], cfg.n_best_size)
    # Flat token index of every ranked position. Past a feature's length: the added token outside the context,
    # so padding fails the context rule below.
    outside = len(in_context) - 1
    s_tok = np.where(s_idx < length[:, None], first[:, None] + s_idx, outside)
    e_tok = np.where(e_idx < length[:, None], first[:, None] + e_idx, outside)
    # An answer is a piece of the context: both ends must be context tokens, not the question, [CLS], [SEP] or
    # padding (their offsets are None). Shape [feature, start rank, end rank].
    ok = in_context[s_tok][:, :, None] & in_context[e_tok][:, None, :]
    # The two heads are not conditioned on each other, so a likely end may lie before a likely start or far
    # after it: a span runs forwards and holds at most max_answer_length tokens (int32: half the traffic).
    n_tokens = e_idx.astype(np.int32)[:, None, :] - s_idx.astype(np.int32)[:, :, None] + 1
    ok &= (n_tokens >= 1) & (n_tokens <= cfg.max_answer_length)
    # A span scores its start logit plus its end logit, summed in the logits' dtype as the loop sums them.
    scores = s_val[:, :, None] + e_val[:, None, :]
    # Pairs scoring below their feature's n_best-th valid pair can never reach the n-best (ties stay: the
    # stable sort settles them); the sort this spares costs more than the top-k.
    n_pairs = scores.shape[1] * scores.shape[2]
    if len(scores) and n_pairs > cfg.n_best_size:
        masked = np.where(ok, scores, -np.inf).reshape(len(scores), n_pairs)
        kth = torch.topk(_tensor(masked), cfg.n_best_size, dim=1).values[:, -1].numpy()
        ok &= scores >= kth[:, None, None]
    # C order is the loop's insertion order within a feature
    flat = np.flatnonzero(ok)
    feature, ranks = np.divmod(flat, n_pairs)
    s_rank, e_rank = np.divmod(ranks, scores.shape[2])
    return {
        "example": ex_of_feat[feature],
        "score": scores.reshape(-1)[flat].astype(np.float64),
        "start_logit": s_val[feature, s_rank].astype(np.float64),
        "end_logit": e_val[feature, e_rank].astype(np.float64),
        "char_start": chars[pair[s_tok[feature, s_rank]], 0],
        "char_end": chars[pair[e_tok[feature, e_rank]], 1],
    }


def by_example_then_score(example: np.ndarray, score: np.ndarray) -> np.ndarray:
    """`np.lexsort((-score, example))`, ~3x sooner: one stable sort of the keys (example, rank of -score)."""
    # equal scores share a rank
    distinct, rank = np.unique(-score, return_inverse=True)
    return np.argsort(example * len(distinct) + rank, kind="stable")


def _nbest_rows(spans: dict, null: list[float | None], cfg: PostprocessConfig) -> tuple[np.ndarray, dict]:
    """(bounds, rows): rows bounds[i]:bounds[i + 1] are example i's n-best list, best first."""
    n_ex = len(null)
    n_spans = len(spans["example"])
    # v2: "no answer" competes with the spans in each example's list (after spans of equal score)
    has_null = np.array([cfg.version_2_with_negative and v is not None for v in null], dtype=bool)
    null_ex = np.flatnonzero(has_null)
    # An example left with no valid span gets one empty answer (scores 0.0): every question gets a prediction
    # and an n-best list to read it from
    empty_ex = np.flatnonzero(~has_null & (np.bincount(spans["example"], minlength=n_ex) == 0))
    extra = len(null_ex) + len(empty_ex)
    rows = {name: np.concatenate([col, np.zeros(extra, col.dtype)]) for name, col in spans.items()}
    rows["example"][n_spans:] = np.concatenate([null_ex, empty_ex])
    rows["score"][n_spans : n_spans + len(null_ex)] = [null[i] for i in null_ex.tolist()]
    rows["is_null"] = np.zeros(len(rows["example"]), dtype=bool)
    rows["is_null"][n_spans : n_spans + len(null_ex)] = True

    order = by_example_then_score(rows["example"], rows["score"])
    rank = np.arange(len(order)) - np.searchsorted(rows["example"][order], rows["example"][order])
    # Only the n_best best answers of an example are listed. The null answer stays even when n_best spans beat
    # it: the n-best file then always shows the no-answer score the null odds come from.
    kept = order[(rank < cfg.n_best_size) | rows["is_null"][order]]
    # still grouped by example, best first
    rows = {name: col[kept] for name, col in rows.items()}
    bounds = np.searchsorted(rows["example"], np.arange(n_ex + 1))
    # Each list's probabilities: a softmax of its scores, less the largest first so that exp cannot overflow;
    # the loop's floats exactly, one 2-D array per list length
    lengths = np.diff(bounds)
    rows["probability"] = np.empty(len(kept), dtype=np.float64)
    for m in np.unique(lengths[lengths > 0]).tolist():
        idx = bounds[:-1][lengths == m][:, None] + np.arange(m)
        exp = np.exp(rows["score"][idx] - np.max(rows["score"][idx], axis=1, keepdims=True))
        rows["probability"][idx] = exp / exp.sum(axis=1, keepdims=True)
    return bounds, rows


class NBestLists(Mapping):
    """Example id -> its n-best list of dicts (the loop's), all built at the first read: the ~211,000 dicts
    of the SQuAD dev set cost more CPU than all the array work, and an eval reads them only to write them."""

    def __init__(
        self, ids: list[str], contexts: list[str], bounds: np.ndarray, rows: dict[str, np.ndarray]
    ) -> None:
        self._ids = ids
        self._contexts = contexts
        self._bounds = bounds
        self._rows = rows

    @cached_property
    def _lists(self) -> dict[str, list[dict]]:
        """A repeated id keeps its first place and its last list; the null answer's logits are None."""
        r = {name: col.tolist() for name, col in self._rows.items()}
        entries = [
            {
                "text": self._contexts[e][a:b],
                "probability": p,
                "score": s,
                "start_logit": None if null else x,
                "end_logit": None if null else y,
            }
            for e, a, b, p, s, x, y, null in zip(
                r["example"],
                r["char_start"],
                r["char_end"],
                r["probability"],
                r["score"],
                r["start_logit"],
                r["end_logit"],
                r["is_null"],
            )
        ]
        b = self._bounds.tolist()
        return dict(zip(self._ids, (entries[lo:hi] for lo, hi in zip(b[:-1], b[1:]))))

    def __getitem__(self, qid: str) -> list[dict]:
        return self._lists[qid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._lists)

    def __len__(self) -> int:
        return len(self._lists)


def postprocess_qa_predictions(
    examples: Mapping[str, Sequence],
    features: Mapping[str, Any],
    predictions: Logits,
    cfg: PostprocessConfig,
) -> QAPredictions:
    """The loop's contract and output. features["offset_mapping"]: best the features' Arrow column (lists
    work). NaN or infinite logits raise DivergedModel."""
    start_logits, end_logits = (np.asarray(p) for p in predictions)
    ids = list(examples["id"])
    contexts = list(examples["context"])
    # a long context is cut into overlapping windows (features): all windows of an example compete for it
    ex_of_feat = np.array(
        example_of_features(ids, list(features["example_id"]), len(start_logits)), dtype=np.int64
    )
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2:
        raise ValueError(
            f"start/end logits must be two arrays of one 2-D shape, got {start_logits.shape} "
            f"and {end_logits.shape}"
        )
    refuse_non_finite((start_logits, end_logits), "start/end logits")
    # v2's null score ("no answer": the span [CLS, CLS]) is the smallest CLS start + end over the example's
    # windows: the example has no answer only as far as every window agrees. Found as the loop finds it (the
    # first of equal values: 0.0 and -0.0 are written differently).
    null: list[float | None] = [None] * len(ids)
    cls_scores = (start_logits[:, :1] + end_logits[:, :1]).astype(np.float64).ravel().tolist()
    for ex, v in zip(ex_of_feat.tolist(), cls_scores):
        if null[ex] is None or v < null[ex]:
            null[ex] = v
    spans = _span_candidates((start_logits, end_logits), features["offset_mapping"], ex_of_feat, cfg)
    bounds, rows = _nbest_rows(spans, null, cfg)
    # each example's best span: its first row, or the next when the first is the null answer (one row at most)
    best = bounds[:-1] + rows["is_null"][bounds[:-1]]
    best[best >= bounds[1:]] = -1
    ex, a, b, start, end = (
        rows[name][best].tolist()
        for name in ("example", "char_start", "char_end", "start_logit", "end_logit")
    )
    answers = {}
    odds = {}
    for i, (qid, r, min_null) in enumerate(zip(ids, best.tolist(), null)):
        # The text is cut from the original context by character offsets, not decoded from tokens: spacing,
        # case and accents as written, which is what the gold answers are compared with
        text = contexts[ex[i]][a[i] : b[i]] if r >= 0 else ""
        if not cfg.version_2_with_negative:
            answers[qid] = text
        elif r >= 0 and min_null is not None:
            # v2: the best span is the answer unless "no answer" beats it by more than the threshold; the
            # difference goes to the null odds file, where score_squad.py finds the best threshold
            odds[qid] = min_null - start[i] - end[i]  # the loop's float operations
            answers[qid] = "" if odds[qid] > cfg.null_score_diff_threshold else text
        else:
            odds[qid] = 0.0 if min_null is None else min_null
            answers[qid] = ""
    nbest = NBestLists(ids, contexts, bounds, rows)
    return QAPredictions(answers, nbest, odds if cfg.version_2_with_negative else None)


def write_prediction_files(preds: QAPredictions, output_dir: str, prefix: str) -> list[str]:
    """Write {prefix}_predictions.json, _nbest_predictions.json and (v2) _null_odds.json atomically. The
    n-best file goes through orjson (json.dumps with an indent takes seconds for a dev set's 55 MB): NaN and
    infinities are written as null."""
    nbest_options = orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE
    nbest = orjson.dumps(dict(preds.nbest), option=nbest_options).decode("utf-8")
    # all serialized before anything is written, so a bad value leaves no file behind
    texts = {
        f"{prefix}_predictions.json": json_text(preds.answers),
        f"{prefix}_nbest_predictions.json": nbest,
    }
    if preds.null_odds is not None:
        texts[f"{prefix}_null_odds.json"] = json_text(preds.null_odds)
    written = [os.path.join(output_dir, name) for name in texts]
    for path, text in zip(written, texts.values()):
        write_text_atomic(path, text)
    odds = os.path.join(output_dir, f"{prefix}_null_odds.json")
    if preds.null_odds is None and os.path.exists(odds):  # an earlier v2 run's, of other questions
        os.unlink(odds)
        logger.info("removed %s (an earlier run's: this one is not SQuAD v2)", odds)
    logger.info("wrote %s", ", ".join(written))
    return written


def predictions_from_logits(
    examples: Any, features: Any, logits: Logits, cfg: PostprocessConfig
) -> QAPredictions:
    """Eval examples + features (datasets or dicts of columns) + logits as the Trainer hands them -> answers
    and n-best lists."""
    logits = mask_padding(logits, real_lengths(features))
    # whole Arrow columns: dataset["col"][i] reads a row, ~50 us an item
    if hasattr(examples, "with_format"):
        examples = {name: examples.with_format("arrow")[name].to_pylist() for name in ("id", "context")}
    if hasattr(features, "with_format"):
        arrow = features.with_format("arrow")
        features = {"example_id": arrow["example_id"].to_pylist(), "offset_mapping": arrow["offset_mapping"]}
    return postprocess_qa_predictions(examples, features, logits, cfg)


def make_postprocess(data_args: Any, output_dir: str) -> Callable[..., QAPredictions]:
    """Logits -> answers, prediction files written (on the main process)."""
    cfg = PostprocessConfig(
        data_args.version_2_with_negative,
        data_args.n_best_size,
        data_args.max_answer_length,
        data_args.null_score_diff_threshold,
    )

    def post_process(examples: Any, features: Any, logits: Logits, stage: str) -> QAPredictions:
        preds = predictions_from_logits(examples, features, logits, cfg)
        write_prediction_files(preds, output_dir, stage)
        return preds

    return post_process
