"""SQuAD v2.0 scoring, numerically identical to the official ``evaluate-v2.0.py``.

Unanswerable questions have no gold answer; the empty prediction is the right answer
to them. With per-question no-answer probabilities, a threshold turns predictions into
"no answer" and the best threshold is searched as the official script does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from qa_hpc.metric.squad_common import (
    normalize_answer,
    prediction_text,
    require_questions,
    token_f1,
)


def _tokens_v2(s: str) -> list[str]:
    """Official v2.0 tokens: ``[]`` for a falsy string, else normalized split."""
    if not s:
        return []
    return normalize_answer(s).split()


def exact_match_v2(prediction: str, ground_truth: str) -> int:
    """Official v2.0 exact match as 0/1 (same comparison as v1.1)."""
    return int(normalize_answer(ground_truth) == normalize_answer(prediction))


def f1_v2(prediction: str, ground_truth: str) -> float:
    """Official v2.0 token F1.

    Unlike v1.1, when either side has no tokens the score is 1 if both are
    empty and 0 otherwise -- this is how "no answer" is rewarded.
    """
    return _f1_v2_tokens(_tokens_v2(prediction), _tokens_v2(ground_truth))


def _f1_v2_tokens(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    """v2.0 F1 on token lists: an empty side scores 1 only against another empty side."""
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    return token_f1(pred_tokens, gold_tokens)


def gold_answers_v2(golds: Sequence[str]) -> list[str]:
    """Gold answers as v2.0 scores them: those that normalize to something, else ``[""]``.

    Note the official quirk: a question whose only gold is e.g. "The" still
    counts as HasAns (that is decided on the raw list) but is scored against "".
    """
    kept = [gold for gold in golds if normalize_answer(gold)]
    return kept if kept else [""]


def _raw_scores_v2(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per-question exact and F1 for predicted questions, in reference order."""
    exact: dict[str, float] = {}
    f1: dict[str, float] = {}
    for qid, golds in references.items():
        if qid not in predictions:
            continue
        prediction = prediction_text(qid, predictions[qid])
        pred_norm = normalize_answer(prediction)
        pred_tokens = pred_norm.split() if prediction else []
        # Normalize each gold once; same values as exact_match_v2 / f1_v2.
        gold_norms = [norm for norm in map(normalize_answer, golds) if norm] or [""]
        exact[qid] = max(int(gold_norm == pred_norm) for gold_norm in gold_norms)
        f1[qid] = max(_f1_v2_tokens(pred_tokens, gold_norm.split()) for gold_norm in gold_norms)
    return exact, f1


def _apply_no_answer_threshold(
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
    threshold: float,
) -> dict[str, float]:
    """Official rule: if P(no answer) > threshold the prediction counts as "no answer".

    The predicted text is then ignored entirely: the question scores 1.0 when
    it is unanswerable and 0.0 when it has an answer.
    """
    return {
        qid: float(not has_answer[qid]) if na_probs[qid] > threshold else score
        for qid, score in scores.items()
    }


def _summary(
    scores_exact: Mapping[str, float], scores_f1: Mapping[str, float], qids: Sequence[str]
) -> dict[str, float | int]:
    """exact/f1 percentages and count over ``qids``; unscored (missing) ids add 0."""
    total = len(qids)
    exact_sum = sum(scores_exact[qid] for qid in qids if qid in scores_exact)
    f1_sum = sum(scores_f1[qid] for qid in qids if qid in scores_f1)
    return {"exact": 100.0 * exact_sum / total, "f1": 100.0 * f1_sum / total, "total": total}


def _best_threshold(
    predictions: Mapping[str, str],
    raw_scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
    total: int,
) -> tuple[float, float]:
    """Official ``find_best_thresh``: the na_prob cut that maximizes the score.

    Starts from "abstain on everything" (each unanswerable question right,
    threshold 0.0), then un-abstains questions in ascending na_prob order:
    an answerable one adds its raw score, an unanswerable one loses 1 if its
    predicted text is non-empty *as a raw string* (so " " costs a point even
    though it scores as empty). The sort is stable over ``na_probs`` order and
    ties are not grouped, so with tied probabilities the reported best may not
    be reachable with any real threshold -- reproduced as is.
    """
    # Officially counted over all questions; only predicted ones here so that a
    # missing prediction never earns credit (identical when none is missing).
    current = float(sum(1 for qid in raw_scores if not has_answer[qid]))
    best, best_thresh = current, 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in raw_scores:
            continue
        if has_answer[qid]:
            current += raw_scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_thresh = current, float(na_probs[qid])
    return 100.0 * best / total, best_thresh


def score_v2(
    references: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float | int]:
    """Official v2.0 corpus score (keys and values as ``evaluate-v2.0.py``).

    ``references`` maps id -> raw gold texts; an empty list means unanswerable.
    Returns exact/f1/total, then HasAns_* and NoAns_* when such questions exist,
    then best_exact/best_exact_thresh/best_f1/best_f1_thresh when ``na_probs``
    is given. Ids missing from ``predictions`` score 0 and are counted (the
    official script prints "Missing prediction" and then crashes). Raises
    ValueError if ``na_probs`` lacks a predicted id (officially a KeyError).
    """
    require_questions(references)
    has_answer = {qid: bool(golds) for qid, golds in references.items()}
    exact_raw, f1_raw = _raw_scores_v2(references, predictions)
    probs = _checked_na_probs(na_probs, exact_raw) if na_probs is not None else None
    # Officially the default is 0.0 for every predicted id, so a negative
    # threshold without na_probs turns every prediction into "no answer".
    effective = probs if probs is not None else {qid: 0.0 for qid in exact_raw}
    exact = _apply_no_answer_threshold(exact_raw, effective, has_answer, na_prob_thresh)
    f1 = _apply_no_answer_threshold(f1_raw, effective, has_answer, na_prob_thresh)

    result = _summary(exact, f1, list(references))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has is wanted]
        if qids:
            result.update({f"{prefix}_{k}": v for k, v in _summary(exact, f1, qids).items()})
    if probs is not None:
        total = len(references)
        best_exact, exact_thresh = _best_threshold(predictions, exact_raw, probs, has_answer, total)
        best_f1, f1_thresh = _best_threshold(predictions, f1_raw, probs, has_answer, total)
        result.update(
            best_exact=best_exact,
            best_exact_thresh=exact_thresh,
            best_f1=best_f1,
            best_f1_thresh=f1_thresh,
        )
    return result


def _checked_na_probs(
    na_probs: Mapping[str, float], scored: Mapping[str, float]
) -> Mapping[str, float]:
    """na_probs must cover every predicted question (official: KeyError)."""
    absent = [qid for qid in scored if qid not in na_probs]
    if absent:
        raise ValueError(
            f"na_probs has no probability for {len(absent)} predicted question(s) "
            f"(first: {absent[0]!r})"
        )
    return na_probs
