"""SQuAD v1.1 and v2.0 scoring, numerically identical to the official scripts.

Why our own scorer: the training loop, the CLI and the benchmarks must all report
exactly the numbers that ``evaluate-v1.1.py`` / ``evaluate-v2.0.py`` would, without
depending on a downloaded metric at run time. Every quirk of the official scripts
that changes a number is reproduced on purpose and called out in a comment; the
only deliberate departure is that questions without a prediction score 0 and stay
in every denominator (v1 does this officially; v2 officially crashes instead).

Standard library only.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any, Mapping, Sequence

__all__ = [
    "SquadFormatError",
    "normalize_answer",
    "exact_match_v1",
    "f1_v1",
    "score_v1",
    "exact_match_v2",
    "f1_v2",
    "gold_answers_v2",
    "score_v2",
    "missing_ids",
    "unknown_ids",
    "load_official_references",
    "json_type_name",
    "answers_by_id",
]

# Only ASCII punctuation: the official scripts use string.punctuation, so unicode
# quotes and dashes (“ ” — …) survive normalization and break token matches.
_PUNCTUATION_TABLE = str.maketrans("", "", string.punctuation)
# Applied after punctuation removal, exactly as the official order: "the-end" ->
# "theend" keeps its article, "the." -> "the" loses it.
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


class SquadFormatError(ValueError):
    """A dataset JSON that does not follow the official nested SQuAD layout."""


# --------------------------------------------------------------------------- text


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop articles, collapse whitespace.

    Same order as the official scripts (the order changes results, see
    ``_ARTICLES``). ``str.split()`` also splits on non-breaking and other
    unicode spaces, so those become ordinary token separators.
    """
    text = s.lower().translate(_PUNCTUATION_TABLE)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _token_f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    """Bag-of-tokens F1 with the official operation order (bitwise-equal floats)."""
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


# --------------------------------------------------------------------------- v1.1


def exact_match_v1(prediction: str, ground_truth: str) -> bool:
    """Official v1.1 exact match: equal after normalization (empty == empty)."""
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_v1(prediction: str, ground_truth: str) -> float:
    """Official v1.1 token F1.

    No overlap means 0 -- including when both sides normalize to nothing, so
    ("", "the") has exact match True but F1 0.0, as in the official script.
    """
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def score_v1(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> dict[str, float]:
    """Official v1.1 corpus score: ``{"exact_match": %, "f1": %}``.

    Each question takes the max over its gold answers. The denominator is every
    reference id; ids absent from ``predictions`` add 0 (see ``missing_ids``).
    Prediction ids not in ``references`` are ignored (see ``unknown_ids``).
    Raises ValueError for an empty reference set or a question with no gold
    answers (the official script would crash on ``max([])``; such data is
    SQuAD 2.0 and belongs to ``score_v2``).
    """
    _require_questions(references)
    _require_gold_answers(references)
    # Accumulate in reference order starting from int 0, like the official loop,
    # so that the float sums are bitwise identical.
    exact_total: float = 0
    f1_total: float = 0
    for qid, golds in references.items():
        if qid not in predictions:
            continue
        # Normalize each string once; same values as exact_match_v1 / f1_v1.
        pred_norm = normalize_answer(_prediction_text(qid, predictions[qid]))
        pred_tokens = pred_norm.split()
        gold_norms = [normalize_answer(gold) for gold in golds]
        exact_total += max(pred_norm == gold_norm for gold_norm in gold_norms)
        f1_total += max(_token_f1(pred_tokens, gold_norm.split()) for gold_norm in gold_norms)
    count = len(references)
    return {"exact_match": 100.0 * exact_total / count, "f1": 100.0 * f1_total / count}


# --------------------------------------------------------------------------- v2.0


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
    return _token_f1(pred_tokens, gold_tokens)


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
        prediction = _prediction_text(qid, predictions[qid])
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
    _require_questions(references)
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


# --------------------------------------------------------------------------- ids


def missing_ids(references: Mapping[str, Any], predictions: Mapping[str, Any]) -> list[str]:
    """Reference ids without a prediction (they score 0), in reference order."""
    return [qid for qid in references if qid not in predictions]


def unknown_ids(references: Mapping[str, Any], predictions: Mapping[str, Any]) -> list[str]:
    """Prediction ids that are not questions of the dataset, in prediction order.

    The scores ignore them, but they usually mean the wrong dataset file.
    """
    return [qid for qid in predictions if qid not in references]


# --------------------------------------------------------------------------- dataset


def answers_by_id(examples: Mapping[str, Sequence]) -> dict[str, list[str]]:
    """Gold answer texts per id, from columns "id" and "answers" ({"text": [...], ...} per row)."""
    return {qid: list(ans["text"]) for qid, ans in zip(examples["id"], examples["answers"])}



def load_official_references(dataset_json: Mapping[str, Any]) -> dict[str, list[str]]:
    """id -> gold answer texts from the official nested SQuAD JSON, in file order.

    Unanswerable v2 questions (``is_impossible`` true, or no answers) map to
    ``[]``. Duplicate answer texts are kept (they do not change a max). Raises
    SquadFormatError naming the JSON location (``data[0].paragraphs[2].qas[1]``)
    and field of the first structural problem, or of a duplicated question id.
    """
    references: dict[str, list[str]] = {}
    where_defined: dict[str, str] = {}
    articles = _field(dataset_json, "data", list, "top level")
    for i, article in enumerate(articles):
        paragraphs = _field(article, "paragraphs", list, f"data[{i}]")
        for j, paragraph in enumerate(paragraphs):
            qas = _field(paragraph, "qas", list, f"data[{i}].paragraphs[{j}]")
            for k, qa in enumerate(qas):
                where = f"data[{i}].paragraphs[{j}].qas[{k}]"
                qid, golds = _question(qa, where)
                if qid in references:
                    raise SquadFormatError(
                        f"{where}: duplicate question id {qid!r} (first at {where_defined[qid]})"
                    )
                references[qid] = golds
                where_defined[qid] = where
    return references


def _question(qa: Any, where: str) -> tuple[str, list[str]]:
    """(id, gold texts) of one ``qas`` entry, validated."""
    qid = _field(qa, "id", str, where)
    where = f"{where} (id {qid!r})"
    answers = _field(qa, "answers", list, where)
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise SquadFormatError(
            f"{where}: field 'is_impossible' must be a boolean, got {json_type_name(impossible)}"
        )
    texts = [
        _field(answer, "text", str, f"{where}.answers[{n}]") for n, answer in enumerate(answers)
    ]
    return qid, ([] if impossible else texts)


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    """``obj[key]`` checked to be of JSON type ``kind``; SquadFormatError otherwise."""
    if not isinstance(obj, dict):
        raise SquadFormatError(f"{where}: expected a JSON object, got {json_type_name(obj)}")
    if key not in obj:
        raise SquadFormatError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        raise SquadFormatError(
            f"{where}: field {key!r} must be {_JSON_NAMES[kind]}, got {json_type_name(value)}"
        )
    return value


_JSON_NAMES = {dict: "an object", list: "an array", str: "a string"}


def json_type_name(value: Any) -> str:
    """JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return _JSON_NAMES.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- checks


def _require_questions(references: Mapping[str, Any]) -> None:
    """Percentages over zero questions are undefined (official: ZeroDivisionError)."""
    if not references:
        raise ValueError("no questions to score: the reference set is empty")


def _require_gold_answers(references: Mapping[str, Sequence[str]]) -> None:
    """v1.1 needs a gold answer per question (official: ``max([])`` crashes)."""
    empty = [qid for qid, golds in references.items() if not golds]
    if empty:
        raise ValueError(
            f"{len(empty)} question(s) have no gold answers (first: {empty[0]!r}); "
            "SQuAD v1.1 scoring needs at least one -- use score_v2 for SQuAD 2.0 data"
        )


def _prediction_text(qid: str, prediction: Any) -> str:
    """The prediction, which must be a string (the official scripts crash otherwise)."""
    if not isinstance(prediction, str):
        raise TypeError(
            f"prediction for id {qid!r} must be a string, got {json_type_name(prediction)}"
        )
    return prediction


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
