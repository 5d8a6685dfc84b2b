"""What both SQuAD versions share: answer normalization, token F1, and the input checks.

Every quirk of the official scripts that changes a number is reproduced on purpose
and called out in a comment (see qa_hpc/metric/squad.py). Standard library only.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

# Only ASCII punctuation: the official scripts use string.punctuation, so unicode
# quotes and dashes (“ ” — …) survive normalization and break token matches.
_PUNCTUATION_TABLE = str.maketrans("", "", string.punctuation)
# Applied after punctuation removal, exactly as the official order: "the-end" ->
# "theend" keeps its article, "the." -> "the" loses it.
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop articles, collapse whitespace.

    Same order as the official scripts (the order changes results, see
    ``_ARTICLES``). ``str.split()`` also splits on non-breaking and other
    unicode spaces, so those become ordinary token separators.
    """
    text = s.lower().translate(_PUNCTUATION_TABLE)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    """Bag-of-tokens F1 with the official operation order (bitwise-equal floats)."""
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


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


def require_questions(references: Mapping[str, Any]) -> None:
    """Percentages over zero questions are undefined (official: ZeroDivisionError)."""
    if not references:
        raise ValueError("no questions to score: the reference set is empty")


def prediction_text(qid: str, prediction: Any) -> str:
    """The prediction, which must be a string (the official scripts crash otherwise)."""
    if not isinstance(prediction, str):
        raise TypeError(
            f"prediction for id {qid!r} must be a string, got {json_type_name(prediction)}"
        )
    return prediction

