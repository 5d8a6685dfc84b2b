"""Postprocessing: the loop (the oracle, tests/fixtures/postprocess_loop.py) picks the right spans
(hand-built logits); qa_hpc.postprocess returns exactly what the loop returns (answers, n-best lists as exact
floats, null odds, order) on generated logits with ties and padding, real features, Arrow offsets and
datasets as run_qa.py hands them over; the prediction files hold the predictions.
"""

from __future__ import annotations

import json
import warnings

import datasets
import numpy as np
import orjson
import pyarrow as pa
import pytest
from fixtures.postprocess_loop import postprocess_qa_predictions_loop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qa_hpc.features import FeatureConfig, prepare_validation_features
from qa_hpc.postprocess import (
    DivergedModel,
    PostprocessConfig,
    QAPredictions,
    by_example_then_score,
    mask_padding,
    postprocess_qa_predictions,
    predictions_from_logits,
    write_prediction_files,
)
from qa_hpc.squad_io import load_qa_records


def assert_same(ref: QAPredictions, got: QAPredictions) -> None:
    """ref from the loop, got from the array path: the same values in the same order, the same JSON."""
    plain = dict(got.nbest)  # what the n-best file holds
    assert (ref.answers, ref.null_odds) == (got.answers, got.null_odds) and ref.nbest == got.nbest == plain
    assert list(ref.answers) == list(got.answers) == list(got.nbest) == list(plain)
    # orjson also tells what == cannot: 0.0 is written "0.0", -0.0 "-0.0"
    expected = orjson.dumps([ref.answers, ref.nbest, ref.null_odds])
    assert orjson.dumps([got.answers, plain, got.null_odds]) == expected


def both(examples: dict, features: dict, logits, cfg: PostprocessConfig) -> QAPredictions:
    """The array path's results, checked equal to the loop's, from lists and from a sliced Arrow column."""
    ref = postprocess_qa_predictions_loop(examples, features, logits, cfg)
    got = postprocess_qa_predictions(examples, features, logits, cfg)
    assert_same(ref, got)
    # an Arrow column that starts at a nonzero offset
    sliced = pa.chunked_array([pa.array([[(7, 9)]] + list(features["offset_mapping"])).slice(1)])
    from_arrow = postprocess_qa_predictions(examples, {**features, "offset_mapping": sliced}, logits, cfg)
    assert_same(ref, from_arrow)
    return got


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n_examples=st.integers(1, 6),
    width=st.integers(1, 48),
    tie_step=st.sampled_from([0.0, 0.25, 1.0]),
    dtype=st.sampled_from(["float32", "float64", "float16"]),
    pad_frac=st.sampled_from([0.0, 0.5, 1.0]),
    v2=st.booleans(),
    n_best=st.integers(1, 25),
    max_answer_length=st.integers(1, 12),
    threshold=st.floats(-2.0, 2.0),
)
def test_array_path_equals_loop_on_generated_logits(
    seed, n_examples, width, tie_step, dtype, pad_frac, v2, n_best, max_answer_length, threshold
):
    """0-3 features per example, offsets None at random, logits rounded into ties (as bf16), -100 padding."""
    rng = np.random.default_rng(seed)
    ids = [f"q{i}" for i in range(n_examples)]
    contexts = ["".join(chr(97 + c) for c in rng.integers(0, 26, size=120)) for _ in ids]
    feature_ids = [qid for qid in ids for _ in range(int(rng.integers(0, 4)))]
    offsets = [
        [
            None if rng.random() < 0.3 else (a, a + int(rng.integers(0, 15)))
            for a in rng.integers(0, 100, size=int(rng.integers(1, width + 1))).tolist()
        ]
        for _ in feature_ids
    ]
    start, end = rng.normal(size=(2, len(feature_ids), width))
    if tie_step > 0:
        start, end = np.round(start / tie_step) * tie_step, np.round(end / tie_step) * tie_step
    for f, row in enumerate(offsets):
        if rng.random() < pad_frac:
            start[f, len(row) :] = end[f, len(row) :] = -100.0
    both(
        {"id": ids, "context": contexts},
        {"example_id": feature_ids, "offset_mapping": offsets},
        (start.astype(dtype), end.astype(dtype)),
        PostprocessConfig(v2, n_best, max_answer_length, threshold),
    )


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_candidate_order_equals_lexsort_with_ties_zeros_and_infinities(dtype):
    """Infinities: a sum of two finite float16 logits can overflow (NaN never comes: it is refused)."""
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(0, 2000))
        ex = np.sort(rng.integers(0, 30, n)) if trial % 2 else rng.integers(0, 30, n)
        score = (np.round(rng.normal(size=n) * 4) / 2).astype(dtype)
        special = [np.inf, -np.inf, -0.0, 0.0]
        score[: min(n, len(special))] = special[: min(n, len(special))]
        score = score.astype(np.float64)
        np.testing.assert_array_equal(by_example_then_score(ex, score), np.lexsort((-score, ex)))


def test_real_tokenizer_features_v1_and_v2(tokenizer, demo_files_v2):
    """Long contexts in several windows, random logits padded with -100, both versions."""
    records, _ = load_qa_records(
        demo_files_v2["validation"], split="validation", version_2_with_negative=True
    )
    examples = {k: [r[k] for r in records] for k in records[0]}
    feats = prepare_validation_features(examples, tokenizer, FeatureConfig(max_seq_length=96, doc_stride=24))
    assert len(feats["input_ids"]) > len(records), "several windows per example"
    lengths = np.array([len(ids) for ids in feats["input_ids"]])
    logits = mask_padding(
        np.random.default_rng(0).normal(size=(2, len(lengths), lengths.max())).astype(np.float32), lengths
    )
    for v2 in (False, True):
        both(examples, feats, logits, PostprocessConfig(version_2_with_negative=v2))


@pytest.mark.parametrize("v2", [False, True])
def test_datasets_as_run_qa_hands_them_over_give_the_loops_answers(tokenizer, demo_files_v2, v2):
    """Examples and features as datasets, logits as wide as their batch (pad-token outputs past a feature's
    real length, even NaN: no answer reads them; -100 past the batch): predictions_from_logits, what an eval
    calls, equals the loop on the real part."""
    examples = datasets.Dataset.from_list(
        load_qa_records(demo_files_v2["validation"], split="validation", version_2_with_negative=True)[0]
    )
    features = examples.map(
        prepare_validation_features,
        batched=True,
        remove_columns=examples.column_names,
        fn_kwargs={"tokenizer": tokenizer, "cfg": FeatureConfig(max_seq_length=96, doc_stride=24)},
    )
    lengths = np.array([sum(mask) for mask in features["attention_mask"]])
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, len(features), lengths.max() + 8)).astype(np.float32)
    logits[:, len(features) // 2 :, lengths.max() :] = -100.0  # the later batches were narrower
    logits[:, : len(features) // 2, lengths.max() :] = np.nan
    cfg = PostprocessConfig(version_2_with_negative=v2)
    ref = postprocess_qa_predictions_loop(
        {"id": examples["id"], "context": examples["context"]},
        {"example_id": features["example_id"], "offset_mapping": features["offset_mapping"]},
        mask_padding(logits, lengths),
        cfg,
    )
    assert_same(ref, predictions_from_logits(examples, features, (logits[0], logits[1]), cfg))


@pytest.mark.parametrize("v2", [False, True])
def test_a_repeated_id_keeps_its_first_place_and_its_last_list(v2, tmp_path):
    examples = {"id": ["a", "b", "a"], "context": ["xyz abc", "pqr", "uvw def"]}
    features = {
        "example_id": ["a", "b", "a"],
        "offset_mapping": [[None, (0, 3), (4, 7)], [(0, 3)], [None, (4, 7)]],
    }
    logits = (np.array([[1.0, 2.0, 0.5], [0.0, 1.0, -1.0], [3.0, 1.0, -100]]),) * 2
    preds = both(examples, features, logits, PostprocessConfig(version_2_with_negative=v2))
    assert list(preds.answers) == ["a", "b"] and preds.answers["a"] == "uvw"  # the last context


@pytest.mark.parametrize(
    ("bad", "counts"),
    [(np.nan, "2 NaN values and 0 infinite values"), (np.inf, "0 NaN values and 2 infinite values")],
)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_diverged_models_logits_are_refused_with_their_count(bad, counts, sign):
    """NaN or +-inf (a diverged model) would give answers that follow no rule: one clear error instead, here
    for one value in a start row and one in an end row (of 3 features, 2 touched)."""
    start, end = np.random.default_rng(2).normal(size=(2, 3, len(OFFSETS))).astype(np.float32)
    start[0, 5] = sign * bad
    end[2, 6] = sign * bad
    with pytest.raises(
        DivergedModel, match=f"start/end logits have {counts}, in 2 of 3 features: the model "
    ):
        postprocess_qa_predictions(
            {"id": ["a"], "context": [CONTEXT]},
            {"example_id": ["a"] * 3, "offset_mapping": [OFFSETS] * 3},
            (start, end),
            PostprocessConfig(),
        )


@pytest.mark.parametrize(
    ("feature_ids", "offsets", "rows", "message"),
    [
        (["zzz"], [[(0, 1)]], 1, "feature 0 belongs to unknown example id 'zzz'"),
        (["a", "a"], [[(0, 1)]] * 2, 1, "got 1 logit rows for 2 features"),
        # offsets that are not pairs
        *[
            (["a"] * len(o), o, len(o), "pairs")
            for o in ([[(1, 2, 3)], [(4,)]], [[(1, 2, 3)], [(4, 5)]], [[(0, 3), (4, None)]])
        ],
    ],
)
def test_bad_features_are_named(feature_ids, offsets, rows, message):
    with pytest.raises(ValueError, match=message):
        postprocess_qa_predictions(
            {"id": ["a"], "context": ["abcdef"]},
            {"example_id": feature_ids, "offset_mapping": offsets},
            (np.zeros((rows, 2), np.float32),) * 2,
            PostprocessConfig(),
        )


@pytest.mark.slow
def test_full_dev_set_real_logits_identical():
    """All 10,570 dev questions, logits of a real MiniLM forward pass (cached by bench/dev_logits.py)."""
    import argparse

    from conftest import shared_squad_file

    from bench.dev_logits import add_args, load_or_build

    parser = argparse.ArgumentParser()
    add_args(parser)
    dev, _, _ = load_or_build(
        parser.parse_args(["--validation_file", str(shared_squad_file("dev-v1.1.json"))])
    )
    assert len(dev.examples["id"]) == 10570
    arrow = {
        "example_id": dev.features["example_id"],
        "offset_mapping": pa.array(dev.features["offset_mapping"]),
    }
    for v2 in (False, True):
        cfg = PostprocessConfig(version_2_with_negative=v2)
        ref = postprocess_qa_predictions_loop(
            dev.examples, dev.features, (dev.start_logits, dev.end_logits), cfg
        )
        assert_same(
            ref, postprocess_qa_predictions(dev.examples, arrow, (dev.start_logits, dev.end_logits), cfg)
        )


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_mask_padding_sets_padding_in_the_logits_dtype_on_new_arrays(dtype):
    start = np.random.default_rng(3).normal(size=(5, 12)).astype(dtype)
    start.setflags(write=False)  # read-only inputs are taken too
    lengths = np.array([12, 0, 3, 7, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when handed a read-only array
        got_start, got_end = mask_padding((start, start[::-1]), lengths)
    for got, raw in ((got_start, start), (got_end, start[::-1])):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(
            got, np.where(np.arange(12) < lengths[:, None], raw, np.float16(-100.0))
        )


def test_prediction_files_hold_the_predictions(tmp_path):
    # awkward ids and texts, a v2 null (logits None), non-finite values (JSON has none: written as null)
    nbest = {
        "q-1": [
            {
                "text": 'Zürich "old" town',
                "probability": 0.75,
                "score": 3.5,
                "start_logit": 1.25,
                "end_logit": 2.25,
            },
            {
                "text": "line\nbreak\ttab",
                "probability": 0.25,
                "score": 2.4000000000000004,
                "start_logit": 1e-7,
                "end_logit": 2.4,
            },
        ],
        'é"2': [{"text": "", "probability": 0.6, "score": -0.5, "start_logit": None, "end_logit": None}],
        "q\\3": [
            {"text": "日本", "probability": 1.0, "score": np.nan, "start_logit": np.inf, "end_logit": -np.inf}
        ],
    }
    answers = {qid: lst[0]["text"] for qid, lst in nbest.items()}
    null_odds = {"q-1": -0.5, 'é"2': 1.25, "q\\3": 0.0}
    written = write_prediction_files(QAPredictions(answers, nbest, null_odds), str(tmp_path / "out"), "eval")
    names = ["eval_predictions.json", "eval_nbest_predictions.json", "eval_null_odds.json"]
    assert written == [str(tmp_path / "out" / name) for name in names]
    read = [json.loads((tmp_path / "out" / name).read_text("utf-8")) for name in names]
    nbest["q\\3"][0].update(score=None, start_logit=None, end_logit=None)
    assert read == [answers, nbest, null_odds] and list(read[1]) == list(nbest)
    text = (tmp_path / "out" / "eval_nbest_predictions.json").read_text("utf-8")
    assert text.endswith("}\n") and '\n  "q-1": [\n' in text and "Zürich" in text, "indented, UTF-8 as is"
    # v1: no null odds file
    write_prediction_files(QAPredictions({}, {}, None), str(tmp_path / "v1"), "predict")
    assert sorted(p.name for p in (tmp_path / "v1").iterdir()) == [
        "predict_nbest_predictions.json",
        "predict_predictions.json",
    ]
    # a v1 evaluation into the v2 run's folder: the v2 run's null odds, of other questions, are not left
    # beside its predictions
    write_prediction_files(QAPredictions({}, {}, None), str(tmp_path / "out"), "eval")
    assert not (tmp_path / "out" / "eval_null_odds.json").exists()


# ---- hand-built logits: the loop's rules (and the array path, which must agree) -------------------------

CONTEXT = "alpha beta gamma delta epsilon zeta"
# CLS, question, SEP, ...
OFFSETS = [None] * 4 + [(0, 5), (6, 10), (11, 16), (17, 22), (23, 30), (31, 35)] + [None]


def row(start: dict[int, float], end: dict[int, float], width: int = len(OFFSETS)):
    """Logits of one feature: -5 on its tokens, -100 past them, the given values at the given positions."""
    s, e = (np.where(np.arange(width) < len(OFFSETS), -5.0, -100.0).astype(np.float32) for _ in range(2))
    s[list(start)], e[list(end)] = list(start.values()), list(end.values())
    return s, e


def run(rows: list, ids: list[str] | None = None, **cfg) -> QAPredictions:
    ids = ids or ["q"] * len(rows)
    examples = {"id": sorted(set(ids), key=ids.index), "context": [CONTEXT] * len(set(ids))}
    features = {"example_id": ids, "offset_mapping": [OFFSETS] * len(rows)}
    return both(
        examples,
        features,
        (np.stack([s for s, _ in rows]), np.stack([e for _, e in rows])),
        PostprocessConfig(**cfg),
    )


V2 = {"version_2_with_negative": True}
NULL_ROW = row({0: 3.0, 5: 2.0}, {0: 3.0, 5: 2.0})  # null = s[0]+e[0] = 6; best span 5..5 = 4; diff 2


@pytest.mark.parametrize(
    ("rows", "ids", "cfg", "answers", "null_odds"),
    [
        # tokens 5..6 = words 1..2
        ([row({5: 4.0, 6: 3.0}, {6: 4.5, 7: 1.0})], None, {}, {"q": "beta gamma"}, None),
        # (1,0)=18 is question/CLS, (9,8)=16 runs backwards, (4,8)=15 is 5 tokens (max 3): the best valid
        # is (6,8)=10
        (
            [row({1: 9.0, 9: 8.0, 4: 7.0, 6: 2.0}, {0: 9.0, 8: 8.0, 7: 2.0})],
            None,
            {"max_answer_length": 3},
            {"q": "gamma delta epsilon"},
            None,
        ),
        # n_best limits candidates: the only valid pair uses the 3rd best start and 3rd best end
        (
            [row({9: 9.0, 8: 8.0, 4: 7.0}, {4: 8.0, 1: 9.0, 0: 8.5})],
            None,
            {"n_best_size": 3},
            {"q": "alpha"},
            None,
        ),
        (
            [row({9: 9.0, 8: 8.0, 4: 7.0}, {4: 8.0, 1: 9.0, 0: 8.5})],
            None,
            {"n_best_size": 2},
            {"q": ""},
            None,
        ),
        # padding never chosen
        ([row({5: 1.0, 13: 50.0}, {5: 1.0, 14: 50.0}, width=17)], None, {}, {"q": "beta"}, None),
        # windows
        ([row({4: 2.0}, {4: 2.0}), row({8: 3.0}, {9: 3.0})], ["q", "q"], {}, {"q": "epsilon zeta"}, None),
        (
            [row({4: 2.0}, {4: 2.0}), row({9: 3.0}, {9: 3.0})],
            ["a", "b"],
            {},
            {"a": "alpha", "b": "zeta"},
            None,
        ),
        # v2: null wins by 2 ...
        ([NULL_ROW], None, V2, {"q": ""}, {"q": 2.0}),
        # ... unless threshold
        ([NULL_ROW], None, {**V2, "null_score_diff_threshold": 2.5}, {"q": "beta"}, {"q": 2.0}),
        # the null score is the minimum over windows: 10 and 2; best span 6..6 = 6: 2 - 6
        (
            [row({0: 5.0, 5: 1.0}, {0: 5.0, 5: 1.0}), row({0: 1.0, 6: 3.0}, {0: 1.0, 6: 3.0})],
            ["q", "q"],
            V2,
            {"q": "gamma"},
            {"q": -4.0},
        ),
        # equal null scores 0.0 and -0.0 (written differently): the first window's, as the loop keeps it
        (
            [row({0: 0.0}, {0: 0.0}), row({0: -0.0}, {0: -0.0})],
            ["q", "q"],
            V2,
            {"q": ""},
            {"q": 10.0},
        ),
    ],
)
def test_hand_built_logits(rows, ids, cfg, answers, null_odds):
    preds = run(rows, ids, **cfg)
    assert (preds.answers, preds.null_odds) == (answers, null_odds)
    for nbest in preds.nbest.values():
        assert sum(p["probability"] for p in nbest) == pytest.approx(1.0)
        assert all(p["text"] in CONTEXT for p in nbest)
        assert nbest == sorted(nbest, key=lambda p: -p["score"])
        assert nbest[0]["text"] != "beta gamma" or nbest[0]["score"] == 8.5
