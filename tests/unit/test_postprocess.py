"""Postprocessing: the loop picks the right spans, and qa_hpc.postprocess returns exactly what the loop returns.

Same answers, same n-best lists (order, texts, scores, logits, probabilities: exact float equality), same
v2 null odds; on randomized logits with ties, -100 padding, offsets None outside the context, short rows,
fp16/fp32/fp64; on real features of a real tokenizer; from Arrow offsets as run_qa.py hands them over.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qa_hpc.features import FeatureConfig, prepare_validation_features
from qa_hpc.postprocess import (
    NBestLists,
    QAPredictions,
    by_example_then_score,
    mask_padding,
    postprocess_qa_predictions,
    token_chars,
    top_k_with_values,
    write_prediction_files,
)
from qa_hpc.postprocess_loop import PostprocessConfig, features_by_example, postprocess_qa_predictions_loop

POSTPROCESSORS = [postprocess_qa_predictions_loop, postprocess_qa_predictions]


def _same(a: QAPredictions, b: QAPredictions) -> None:
    """a from the loop, b from the vectorized path: same results, in the same order."""
    assert a.answers == b.answers
    assert a.nbest == b.nbest  # dict/list equality: exact floats, same order
    assert a.null_odds == b.null_odds
    assert list(a.answers) == list(b.answers) and list(a.nbest) == list(b.nbest), "same example order"
    plain = b.nbest.as_dict() if isinstance(b.nbest, NBestLists) else b.nbest  # what the n-best file is written from
    assert plain == a.nbest and list(plain) == list(a.nbest)
    # the same JSON also where == cannot tell (0.0 is written "0.0", -0.0 "-0.0")
    assert orjson.dumps(a.nbest) == orjson.dumps(plain) and orjson.dumps(a.null_odds) == orjson.dumps(b.null_odds)


def _random_case(seed: int, n_examples: int, width: int, tie_step: float, dtype: str, pad_frac: float):
    """Examples with 0-3 features each; offsets None at random; logits rounded to make ties; -100 padding."""
    rng = np.random.default_rng(seed)
    ids = [f"q{i}" for i in range(n_examples)]
    contexts = ["".join(chr(97 + c) for c in rng.integers(0, 26, size=120)) for _ in ids]
    feature_ids, offsets = [], []
    for qid in ids:
        for _ in range(int(rng.integers(0, 4))):
            row = []
            for _ in range(int(rng.integers(1, width + 1))):
                a = int(rng.integers(0, 100))
                row.append(None if rng.random() < 0.3 else (a, a + int(rng.integers(0, 15))))
            feature_ids.append(qid)
            offsets.append(row)
    start, end = rng.normal(size=(len(feature_ids), width)), rng.normal(size=(len(feature_ids), width))
    if tie_step > 0:  # coarse values: many equal logits, like bf16 output
        start, end = np.round(start / tie_step) * tie_step, np.round(end / tie_step) * tie_step
    for f, row in enumerate(offsets):
        if rng.random() < pad_frac:  # the Trainer's -100 padding past a feature's batch width
            start[f, len(row):] = end[f, len(row):] = -100.0
    examples = {"id": ids, "context": contexts}
    return examples, {"example_id": feature_ids, "offset_mapping": offsets}, (start.astype(dtype), end.astype(dtype))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1), n_examples=st.integers(1, 6), width=st.integers(1, 48),
    tie_step=st.sampled_from([0.0, 0.25, 1.0]), dtype=st.sampled_from(["float32", "float64", "float16"]),
    pad_frac=st.sampled_from([0.0, 0.5, 1.0]), v2=st.booleans(), n_best=st.integers(1, 25),
    max_answer_length=st.integers(1, 12), threshold=st.floats(-2.0, 2.0),
)
def test_vectorized_equals_loop_on_random_logits(
    seed, n_examples, width, tie_step, dtype, pad_frac, v2, n_best, max_answer_length, threshold
):
    examples, features, logits = _random_case(seed, n_examples, width, tie_step, dtype, pad_frac)
    cfg = PostprocessConfig(v2, n_best, max_answer_length, threshold)
    ref = postprocess_qa_predictions_loop(examples, features, logits, cfg)
    _same(ref, postprocess_qa_predictions(examples, features, logits, cfg))
    arrow = {"example_id": features["example_id"], "offset_mapping": pa.array(features["offset_mapping"])}
    _same(ref, postprocess_qa_predictions(examples, arrow, logits, cfg))


@pytest.mark.parametrize("v2", [False, True])
def test_a_repeated_id_keeps_its_first_place_and_its_last_list(v2, tmp_path):
    examples = {"id": ["a", "b", "a"], "context": ["xyz abc", "pqr", "uvw def"]}
    features = {"example_id": ["a", "b", "a"], "offset_mapping": [[None, (0, 3), (4, 7)], [(0, 3)], [None, (4, 7)]]}
    logits = (np.array([[1.0, 2.0, 0.5], [0.0, 1.0, -1.0], [3.0, 1.0, -100]]),) * 2
    cfg = PostprocessConfig(version_2_with_negative=v2)
    ref = postprocess_qa_predictions_loop(examples, features, logits, cfg)
    assert list(ref.answers) == ["a", "b"]
    preds = postprocess_qa_predictions(examples, features, logits, cfg)
    _same(ref, preds)
    files = [write_prediction_files(p, str(tmp_path / name), "eval") for name, p in (("loop", ref), ("vec", preds))]
    assert [[json.loads(open(f, encoding="utf-8").read()) for f in fs] for fs in files] == [
        [ref.answers, ref.nbest] + ([ref.null_odds] if v2 else [])] * 2


@pytest.mark.parametrize("step", [0.0, 0.5, 2.0])
def test_top_k_ranks_like_argsort_even_with_ties(step):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(300, 40)).astype(np.float32)
    if step:
        logits = np.round(logits / step) * step
    logits[::7, 20:] = -100.0  # long runs of equal padding
    for k in (1, 5, 20, 40, 60):
        got, values = top_k_with_values(logits, k)
        want = np.stack([np.argsort(row)[-1 : -k - 1 : -1] for row in logits])
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(values, np.take_along_axis(logits, want, axis=1))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_candidate_order_equals_lexsort(dtype):
    """Candidates are ordered exactly as lexsort((-score, example)): ties, +-0.0, +-inf, NaN."""
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(0, 2000))
        ex = rng.integers(0, 30, n)
        if trial % 2:
            ex = np.sort(ex)
        score = (np.round(rng.normal(size=n) * 4) / 2).astype(dtype)  # many equal scores
        special = [np.inf, -np.inf, -0.0, 0.0] + ([np.nan] if trial % 5 == 0 else [])
        score[: min(n, len(special))] = special[: min(n, len(special))]
        want = np.lexsort((-score.astype(np.float64), ex))
        np.testing.assert_array_equal(by_example_then_score(ex, score.astype(np.float64)), want)


@pytest.mark.parametrize("rows", [[[(1, 2, 3)], [(4,)]], [[(1, 2, 3)], [(4, 5)]]])
def test_ragged_offset_pairs_are_refused(rows):
    for offsets in (rows, pa.array(rows)):
        with pytest.raises(ValueError, match="pairs"):
            token_chars(offsets)
    with pytest.raises(ValueError, match="pairs must not hold nulls"):
        token_chars(pa.array([[(0, 3), (4, None)]]))


def test_token_chars_from_arrow_and_lists_agree():
    rows = [[None, (0, 3), (4, 9), None], [], [(2, 2)], [None]]
    for offsets in (rows, pa.array(rows)):
        first, length, in_context, pair, chars = token_chars(offsets)
        assert first.tolist() == [0, 4, 4, 5] and length.tolist() == [4, 0, 1, 1]
        assert in_context.tolist() == [False, True, True, False, True, False, False]  # + one past the last token
        assert chars[pair[in_context]].tolist() == [[0, 3], [4, 9], [2, 2]]
    # a sliced/reordered Arrow column (dataset.select) is read with its own offsets
    first, length, in_context, pair, chars = token_chars(pa.chunked_array([pa.array(rows)]).take([2, 0]))
    assert length.tolist() == [1, 4] and chars[pair[in_context], 0].tolist() == [2, 0, 4]


def test_real_features_v1_and_v2(tokenizer, tmp_path):
    """Features of a real tokenizer (long contexts, several windows), random logits, both versions."""
    from qa_hpc.squad_io import load_qa_records
    from qa_hpc.tools.make_demo_data import generate_squad

    path = tmp_path / "dev.json"
    path.write_text(json.dumps(generate_squad(12, seed=7, with_impossible=True)), encoding="utf-8")
    records, _ = load_qa_records(str(path), split="validation", version_2_with_negative=True)
    batch = {k: [r[k] for r in records] for k in records[0]}
    feats = prepare_validation_features(batch, tokenizer, FeatureConfig(max_seq_length=96, doc_stride=24))
    n = len(feats["input_ids"])
    assert n > len(records), "several windows per example"
    width = max(len(x) for x in feats["input_ids"])
    rng = np.random.default_rng(0)
    start, end = np.full((n, width), -100.0, dtype=np.float32), np.full((n, width), -100.0, dtype=np.float32)
    for i, ids in enumerate(feats["input_ids"]):
        start[i, : len(ids)], end[i, : len(ids)] = rng.normal(size=len(ids)), rng.normal(size=len(ids))
    examples = {"id": batch["id"], "context": batch["context"]}
    features = {"example_id": feats["example_id"], "offset_mapping": feats["offset_mapping"]}
    for v2 in (False, True):
        cfg = PostprocessConfig(version_2_with_negative=v2)
        ref = postprocess_qa_predictions_loop(examples, features, (start, end), cfg)
        _same(ref, postprocess_qa_predictions(examples, features, (start, end), cfg))
        if v2:
            assert any(a == "" for a in ref.answers.values()) or ref.null_odds


@pytest.mark.parametrize("postprocess", POSTPROCESSORS)
def test_errors_name_the_feature_and_the_counts(postprocess):
    examples = {"id": ["a"], "context": ["abc"]}
    features = {"example_id": ["zzz"], "offset_mapping": [[(0, 1)]]}
    logits = (np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32))
    with pytest.raises(ValueError, match="feature 0 belongs to unknown example id 'zzz'"):
        postprocess(examples, features, logits, PostprocessConfig())
    features = {"example_id": ["a", "a"], "offset_mapping": [[(0, 1)], [(0, 1)]]}
    with pytest.raises(ValueError, match="got 1 logit rows for 2 features"):
        postprocess(examples, features, logits, PostprocessConfig())


def test_features_by_example():
    assert features_by_example(["a", "b"], ["a", "a", "b"]) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="unknown example id 'z'"):
        features_by_example(["a"], ["z"])


@pytest.mark.slow
def test_full_dev_set_real_eval_identical():
    """All 10,570 dev questions, logits of a real MiniLM forward pass (cached by bench/dev_logits.py)."""
    import argparse

    from bench.dev_logits import add_args, load_or_build
    from conftest import shared_squad_file

    parser = argparse.ArgumentParser()
    add_args(parser)
    dev, _, _ = load_or_build(parser.parse_args(["--validation_file", str(shared_squad_file("dev-v1.1.json"))]))
    assert len(dev.examples["id"]) == 10570
    logits = (dev.start_logits, dev.end_logits)
    arrow = {"example_id": dev.features["example_id"], "offset_mapping": pa.array(dev.features["offset_mapping"])}
    for v2 in (False, True):
        cfg = PostprocessConfig(version_2_with_negative=v2)
        ref = postprocess_qa_predictions_loop(dev.examples, dev.features, logits, cfg)
        _same(ref, postprocess_qa_predictions(dev.examples, arrow, logits, cfg))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_mask_padding_sets_padding_in_the_logits_dtype(dtype):
    """Logits past each row's length become -100 in the logits' dtype; read-only inputs too, without a warning."""
    rng = np.random.default_rng(3)
    start, end = (rng.normal(size=(5, 12)).astype(dtype) for _ in range(2))
    lengths = np.array([12, 0, 3, 7, 1])
    want = np.where(np.arange(12)[None, :] < lengths[:, None], start, np.asarray(-100.0, dtype=dtype))
    original = start.copy()
    got_s, got_e = mask_padding((start, end), lengths)
    frozen = start.copy()
    frozen.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it is handed a read-only array
        got_frozen, _ = mask_padding((frozen, end), lengths)
    for got in (got_s, got_frozen):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)
    assert got_e[2, 3:].tolist() == [-100.0] * 9 and got_e[0].tolist() == end[0].tolist()
    np.testing.assert_array_equal(start, original)  # inputs untouched


# ---- prediction files -----------------------------------------------------------------------------------

NBEST = {  # awkward ids and texts, a v2 null (logits None), a single entry
    "q-1": [{"text": "Zürich \"old\" town", "probability": 0.75, "score": 3.5, "start_logit": 1.25, "end_logit": 2.25},
            {"text": "line\nbreak\ttab", "probability": 0.25, "score": 2.4000000000000004, "start_logit": 1e-7,
             "end_logit": 2.4}],
    "é\"2": [{"text": "", "probability": 0.6, "score": -0.5, "start_logit": None, "end_logit": None},
             {"text": "日本", "probability": 0.4, "score": -1.0, "start_logit": -123456789.125, "end_logit": 5e20}],
    "q\\3": [{"text": "", "probability": 1.0, "score": 0.0, "start_logit": 0.0, "end_logit": 0.0}],
}


def test_prediction_files_hold_the_predictions(tmp_path):
    answers = {qid: lst[0]["text"] for qid, lst in NBEST.items()}
    null_odds = {"q-1": -0.5, "é\"2": 1.25, "q\\3": 0.0}
    written = write_prediction_files(QAPredictions(answers, NBEST, null_odds), str(tmp_path / "out"), "eval")
    names = ["eval_predictions.json", "eval_nbest_predictions.json", "eval_null_odds.json"]
    assert written == [str(tmp_path / "out" / name) for name in names]
    read = [json.loads((tmp_path / "out" / name).read_text("utf-8")) for name in names]
    assert read == [answers, NBEST, null_odds] and list(read[1]) == list(NBEST)
    text = (tmp_path / "out" / "eval_nbest_predictions.json").read_text("utf-8")
    assert text.endswith("}\n") and '\n  "q-1": [\n' in text, "indented, one trailing newline"
    assert "Zürich" in text and "日本" in text, "UTF-8 as is"
    write_prediction_files(QAPredictions({}, {}, None), str(tmp_path / "v1"), "predict")
    assert sorted(p.name for p in (tmp_path / "v1").iterdir()) == ["predict_nbest_predictions.json",
                                                                   "predict_predictions.json"]
    assert (tmp_path / "v1" / "predict_nbest_predictions.json").read_text("utf-8") == "{}\n"


def test_non_finite_values_are_written_as_null(tmp_path):
    """JSON has no NaN or Infinity: the n-best file holds null, so strict parsers read it too."""
    nbest = {"b": [{"text": "x", "probability": 1.0, "score": np.nan, "start_logit": np.inf, "end_logit": -np.inf}]}
    write_prediction_files(QAPredictions({"b": "x"}, nbest, None), str(tmp_path), "eval")
    assert json.loads((tmp_path / "eval_nbest_predictions.json").read_text("utf-8")) == {
        "b": [{"text": "x", "probability": 1.0, "score": None, "start_logit": None, "end_logit": None}]}


# ---- the loop on hand-built logits (and the vectorized path, which must agree) ---------------------------

CONTEXT = "alpha beta gamma delta epsilon zeta"
#          0     6    11    17    23      31
WORDS = [(0, 5), (6, 10), (11, 16), (17, 22), (23, 30), (31, 35)]
OFFSETS = [None] * 4 + list(WORDS) + [None]  # CLS, two question tokens, SEP, six context words, SEP


def _logits(start: dict[int, float], end: dict[int, float], pad_to: int | None = None):
    s, e = (np.full(pad_to or len(OFFSETS), -5.0, dtype=np.float32) for _ in range(2))
    s[len(OFFSETS):] = e[len(OFFSETS):] = -100.0
    for k, v in start.items():
        s[k] = v
    for k, v in end.items():
        e[k] = v
    return s, e


def _run(postprocess, rows: list[tuple[np.ndarray, np.ndarray]], ids=None, **cfg) -> QAPredictions:
    ids = ids or ["q"] * len(rows)
    examples = {"id": sorted(set(ids), key=ids.index), "context": [CONTEXT] * len(set(ids))}
    features = {"example_id": ids, "offset_mapping": [OFFSETS] * len(rows)}
    width = max(len(s) for s, _ in rows)
    pad = lambda r: np.stack([np.pad(x, (0, width - len(x)), constant_values=-100.0) for x in r])  # noqa: E731
    logits = (pad([s for s, _ in rows]), pad([e for _, e in rows]))
    preds = postprocess(examples, features, logits, PostprocessConfig(**cfg))
    _same(postprocess_qa_predictions_loop(examples, features, logits, PostprocessConfig(**cfg)), preds)
    return preds


@pytest.mark.parametrize("postprocess", POSTPROCESSORS)
def test_picks_best_valid_span(postprocess):
    preds = _run(postprocess, [_logits({5: 4.0, 6: 3.0}, {6: 4.5, 7: 1.0})])
    assert preds.answers["q"] == "beta gamma"  # tokens 5..6 = words 1..2 (context starts at token 4)
    best = preds.nbest["q"][0]
    assert best["score"] == pytest.approx(8.5) and best["text"] == "beta gamma"
    assert sum(p["probability"] for p in preds.nbest["q"]) == pytest.approx(1.0)


@pytest.mark.parametrize("postprocess", POSTPROCESSORS)
def test_ignores_spans_outside_context_and_backwards_and_too_long(postprocess):
    # context tokens: 4 alpha, 5 beta, 6 gamma, 7 delta, 8 epsilon, 9 zeta; others score -5.
    # (1,0)=18 is question/CLS, (9,8)=16 runs backwards, (4,8)=15 is 5 tokens (max 3):
    # the best valid pair is (6,8) = 2 + 8 = 10.
    preds = _run(postprocess, [_logits({1: 9.0, 9: 8.0, 4: 7.0, 6: 2.0}, {0: 9.0, 8: 8.0, 7: 2.0})],
                 max_answer_length=3)
    assert preds.answers["q"] == "gamma delta epsilon"
    assert preds.nbest["q"][0]["score"] == pytest.approx(10.0)
    assert all(p["text"] and p["text"] in CONTEXT for p in preds.nbest["q"])


@pytest.mark.parametrize("postprocess", POSTPROCESSORS)
def test_n_best_limits_candidates(postprocess):
    # the only valid pair among the top candidates uses the 3rd best start and 3rd best end
    row = _logits({9: 9.0, 8: 8.0, 4: 7.0}, {4: 8.0, 1: 9.0, 0: 8.5})
    assert _run(postprocess, [row], n_best_size=3).answers["q"] == "alpha"
    assert _run(postprocess, [row], n_best_size=2).answers["q"] == ""


@pytest.mark.parametrize("postprocess", POSTPROCESSORS)
def test_padding_logits_are_never_chosen(postprocess):
    s, e = _logits({5: 1.0}, {5: 1.0}, pad_to=len(OFFSETS) + 6)
    s[len(OFFSETS) + 2] = e[len(OFFSETS) + 3] = 50.0  # would be chosen if padded positions were not excluded
    assert _run(postprocess, [(s, e)]).answers["q"] == "beta"


@pytest.mark.parametrize("postprocess", POSTPROCESSORS)
def test_windows_of_one_example_compete_and_examples_keep_their_own(postprocess):
    rows = [_logits({4: 2.0}, {4: 2.0}), _logits({8: 3.0}, {9: 3.0})]
    assert _run(postprocess, rows, ids=["q", "q"]).answers["q"] == "epsilon zeta"
    rows = [_logits({4: 2.0}, {4: 2.0}), _logits({9: 3.0}, {9: 3.0})]
    assert _run(postprocess, rows, ids=["a", "b"]).answers == {"a": "alpha", "b": "zeta"}


@pytest.mark.parametrize("postprocess", POSTPROCESSORS)
def test_v2_null_answer_threshold_and_minimum_over_windows(postprocess):
    row = _logits({0: 3.0, 5: 2.0}, {0: 3.0, 5: 2.0})  # null = s[0]+e[0] = 6; best span 5..5 = 4; diff 2
    preds = _run(postprocess, [row], version_2_with_negative=True)
    assert preds.answers["q"] == "" and preds.null_odds["q"] == pytest.approx(2.0)
    assert any(p["text"] == "" for p in preds.nbest["q"])
    assert _run(postprocess, [row], version_2_with_negative=True, null_score_diff_threshold=2.5).answers["q"] == "beta"
    rows = [_logits({0: 5.0, 5: 1.0}, {0: 5.0, 5: 1.0}), _logits({0: 1.0, 6: 3.0}, {0: 1.0, 6: 3.0})]  # nulls 10, 2
    preds = _run(postprocess, rows, ids=["q", "q"], version_2_with_negative=True)
    assert preds.null_odds["q"] == pytest.approx(2.0 - 6.0) and preds.answers["q"] == "gamma"
