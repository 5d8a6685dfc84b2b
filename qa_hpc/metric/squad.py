"""SQuAD v1.1 / v2.0 scores equal to the official evaluate-v1.1.py / evaluate-v2.0.py (every quirk that
changes a number kept), for score_squad.py and for the `evaluate` modules beside this file that the trainer
scores with. Departures: a question without a prediction scores 0 (v2 officially crashes); no questions, or v1
questions without gold answers, raise ValueError (officially a crash). score_squad.py checks its files.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qa_hpc.errors import check_writable_dir

if TYPE_CHECKING:
    import datasets
    import evaluate

    from qa_hpc.postprocess import QAPredictions

Scores = dict[str, float]  # v2's *_total values are ints
# (answers, examples) -> metrics without prefix, e.g. {"exact_match": .., "f1": ..}: what the trainer calls
ScoreFunction = Callable[["QAPredictions", "datasets.Dataset"], Scores]

LOCAL_MODULES = {
    False: Path(__file__).with_name("evaluate_squad_v1"),
    True: Path(__file__).with_name("evaluate_squad_v2"),
}

# Only ASCII punctuation: the official scripts use string.punctuation, so unicode quotes and
# dashes survive normalization and break token matches.
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# Removed after the punctuation, as officially: "the-end" -> "theend" keeps it, "the." loses it.
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower case, drop ASCII punctuation, then articles, collapse whitespace (unicode spaces split too)."""
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCTUATION)).split())


def _f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str], v2: bool) -> float:
    """Bag-of-tokens F1 in the official operation order (bitwise-equal floats), and of its type: the int 0
    or 1 where the official scripts return one (v2's sum() of ints and floats adds them otherwise)."""
    if v2 and not (pred_tokens and gold_tokens):
        return int(pred_tokens == gold_tokens)  # v2: "no answer" scores 1 against "no answer" only
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:  # v1: 0 even when both sides are empty ("" vs "the": EM 1, F1 0)
        return 0
    precision, recall = num_same / len(pred_tokens), num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def _raw_scores(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, str], v2: bool
) -> tuple[dict[str, float], dict[str, float]]:
    if not references:
        raise ValueError("no questions to score: the reference set is empty")
    # the official types: exact an int, F1 an int 0/1 or a float (the first best over the golds, as max())
    exact: dict[str, float] = {}
    f1: dict[str, float] = {}  # per-question best over the golds
    for qid, golds in references.items():
        if qid not in predictions:
            continue
        pred_norm = normalize_answer(predictions[qid])
        gold_norms = [normalize_answer(gold) for gold in golds]
        if v2:  # golds that normalize to nothing are dropped, yet the question stays HasAns (official quirk)
            gold_norms = [norm for norm in gold_norms if norm] or [""]
        exact[qid] = int(max(pred_norm == norm for norm in gold_norms))
        f1[qid] = max(_f1(pred_norm.split(), norm.split(), v2) for norm in gold_norms)
    return exact, f1


def score_v1(references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> Scores:
    """Official v1.1 ``{"exact_match": %, "f1": %}``; references: id -> gold texts (unknown ids ignored)."""
    empty = [qid for qid, golds in references.items() if not golds]
    if empty:
        raise ValueError(
            f"{len(empty)} question(s) have no gold answers (field 'answers' empty or 'is_impossible' "
            f"true): {first_ids(empty)}; pass --version_2_with_negative to score SQuAD 2.0 data"
        )
    exact, f1 = _raw_scores(references, predictions, v2=False)
    exact_total = f1_total = 0.0
    for qid in exact:  # += as the official script: sum() of floats may add otherwise (Python >= 3.12)
        exact_total, f1_total = exact_total + exact[qid], f1_total + f1[qid]
    return {"exact_match": 100.0 * exact_total / len(references), "f1": 100.0 * f1_total / len(references)}


def score_v2(
    references: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> Scores:
    """Official v2.0 with --na-prob-file / --na-prob-thresh, keys in its order; golds ``[]``: no answer."""
    has_answer = {qid: bool(golds) for qid, golds in references.items()}
    exact_raw, f1_raw = _raw_scores(references, predictions, v2=True)
    # Officially P(no answer) is 0.0 without na_probs, so a negative threshold abstains on everything.
    probs = na_probs if na_probs is not None else {qid: 0.0 for qid in exact_raw}

    def thresholded(raw: Mapping[str, float]) -> dict[str, float]:
        # above the threshold the prediction is "no answer", whatever its text: 1 if unanswerable, else 0
        return {
            qid: float(not has_answer[qid]) if probs[qid] > na_prob_thresh else score
            for qid, score in raw.items()
        }

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    result = _summary(exact, f1, list(references))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has is wanted]
        if qids:
            result.update({f"{prefix}_{key}": value for key, value in _summary(exact, f1, qids).items()})
    if na_probs is not None:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            best, thresh = _best_threshold(predictions, raw, na_probs, has_answer, len(references))
            result.update({f"best_{name}": best, f"best_{name}_thresh": thresh})
    return result


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str]) -> Scores:
    """Percentages over ``qids`` (sum() as the official script, of its ints and floats: from Python 3.12 sum()
    compensates float additions, not int ones, so the types matter to the last bit; missing ids add 0)."""
    n = len(qids)
    return {
        "exact": 100.0 * sum(exact[q] for q in qids if q in exact) / n,
        "f1": 100.0 * sum(f1[q] for q in qids if q in f1) / n,
        "total": n,
    }


def _best_threshold(
    predictions: Mapping[str, str],
    raw: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
    total: int,
) -> tuple[float, float]:
    """Official ``find_best_thresh``: abstain on everything, then un-abstain by ascending na_prob (ties one by
    one in na_probs order); an unanswerable question costs 1 if its *raw* text is non-empty (" " too)."""
    current = float(sum(1 for qid in raw if not has_answer[qid]))
    best, best_thresh = current, 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in raw:
            continue
        if has_answer[qid]:
            current += raw[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_thresh = current, float(na_probs[qid])
    return 100.0 * best / total, best_thresh


def first_ids(ids: Sequence[str], shown: int = 5) -> str:
    rest = len(ids) - shown
    return ", ".join(map(repr, ids[:shown])) + (f", ... ({rest} more)" if rest > 0 else "")


# --------------------------------------------------------------------------- the `evaluate` metric


PAPERS = {
    False: 'Rajpurkar, Zhang, Lopyrev, Liang: "SQuAD: 100,000+ Questions for Machine Comprehension of Text", '
    "EMNLP 2016",
    True: 'Rajpurkar, Jia, Liang: "Know What You Don\'t Know: Unanswerable Questions for SQuAD", ACL 2018',
}


def metric_info(v2: bool, inputs_description: str = "") -> evaluate.MetricInfo:
    """What both `evaluate` modules beside this file say of themselves. Their inputs are the hub's `squad` /
    `squad_v2` ones, but float64 "no_answer_probability": as float32 the null-score differences would move
    threshold decisions away from score_squad.py's on eval_null_odds.json."""
    import evaluate  # only where a metric is built: score_squad.py needs none
    from datasets import Features, List, Value

    version = "2.0" if v2 else "1.1"
    predictions = {"id": Value("string"), "prediction_text": Value("string")}
    if v2:
        predictions["no_answer_probability"] = Value("float64")
    answers = {"text": List(Value("string")), "answer_start": List(Value("int32"))}
    return evaluate.MetricInfo(
        description=(
            f"SQuAD v{version} exact match and F1, equal to the official evaluate-v{version}.py (qa-hpc)."
        ),
        citation=PAPERS[v2],
        inputs_description=inputs_description,
        reference_urls=["https://rajpurkar.github.io/SQuAD-explorer/"],
        features=Features(
            {"predictions": predictions, "references": {"id": Value("string"), "answers": answers}}
        ),
    )


def score_rows(
    predictions: Sequence[Mapping], references: Sequence[Mapping], no_answer_threshold: float | None = None
) -> Scores:
    """The `evaluate` rows scored; a threshold (even 1.0) means v2. A repeated id is an error, not dropped."""
    for source, rows in (("references", references), ("predictions", predictions)):
        repeated = [qid for qid, n in collections.Counter(row["id"] for row in rows).items() if n > 1]
        if repeated:
            raise ValueError(f"{source}: id {repeated[0]!r} appears more than once")
    golds = {ref["id"]: list(ref["answers"]["text"]) for ref in references}
    texts = {row["id"]: row["prediction_text"] for row in predictions}
    if no_answer_threshold is None:
        return score_v1(golds, texts)
    return score_v2(
        golds, texts, {row["id"]: row["no_answer_probability"] for row in predictions}, no_answer_threshold
    )


def make_score(version_2_with_negative: bool, null_score_diff_threshold: float) -> ScoreFunction:
    """Load the `evaluate` module beside this file for the SQuAD version now (before training, as HF's example
    loads its metric); return what scores answers."""
    metric = load_metric(version_2_with_negative)
    v2 = version_2_with_negative
    # v2: thresholding the null odds at the postprocessing's threshold keeps exact/f1 unchanged and
    # makes best_f1_thresh a usable threshold
    options = {"no_answer_threshold": null_score_diff_threshold} if v2 else {}

    def score(preds: QAPredictions, examples: datasets.Dataset) -> Scores:
        # rows in the answers' order: v2's best-threshold search breaks ties by it, as score_squad.py
        # does by the order of eval_null_odds.json
        predictions = [{"id": qid, "prediction_text": text} for qid, text in preds.answers.items()]
        if v2:
            for row in predictions:
                row["no_answer_probability"] = float(preds.null_odds[row["id"]])
        references = [
            {"id": qid, "answers": {"text": list(gold["text"]), "answer_start": list(gold["answer_start"])}}
            for qid, gold in zip(examples["id"], examples["answers"])
        ]
        return metric.compute(predictions=predictions, references=references, **options)

    return score


def load_metric(version_2_with_negative: bool) -> evaluate.EvaluationModule:
    """This package's `evaluate` module for the SQuAD version (evaluate copies it into HF_HOME's modules)."""
    import evaluate  # slow to import (it pulls in transformers.pipelines): only once a run is set up
    from evaluate.config import HF_MODULES_CACHE

    # where evaluate copies the module and takes a lock, on every rank, every run: a read-only shared
    # HF_HOME is exit 74 naming it, not a traceback (an empty probe file: nothing of a quota is spent)
    where = "evaluate's module cache (HF_MODULES_CACHE, else HF_HOME/modules)"
    check_writable_dir(str(HF_MODULES_CACHE), where, megabytes=0)
    # scores on the main process only: no cache files
    return evaluate.load(str(LOCAL_MODULES[version_2_with_negative]), keep_in_memory=True)
