"""The vectorized postprocessor returns exactly what the reference loop returns.

Same answers, same n-best lists (order, texts, scores, logits, probabilities: exact
float equality), same v2 null odds; on randomized logits with ties, -100 padding,
offsets None outside the context, short rows, fp16/fp32/fp64; on real features of
a real tokenizer; and from Arrow offsets as run_qa.py hands them over.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qa_hpc.features import FeatureConfig, prepare_validation_features
from qa_hpc.postprocess.files import nbest_json
from qa_hpc.postprocess.nbest_lists import by_example_then_score
from qa_hpc.postprocess.offsets import flat_offsets
from qa_hpc.postprocess.ranking import top_k_with_values
from qa_hpc.postprocess.reference import (
    PostprocessConfig,
    postprocess_qa_predictions_loop,
)
from qa_hpc.postprocess.vectorized import postprocess_qa_predictions_vectorized


def _same(a, b) -> None:
    """a from the loop, b from the vectorized path: same results, and n-best files of the same JSON values."""
    assert a.answers == b.answers
    assert a.nbest == b.nbest  # dict/list equality: exact floats, same order
    assert a.null_odds == b.null_odds
    assert list(a.answers) == list(b.answers), "same example order"
    assert list(a.nbest) == list(b.nbest)
    assert json.loads(nbest_json(b.nbest)) == a.nbest
    # one writer for both: the same text also where == cannot tell (0.0 is written "0.0", -0.0 "-0.0")
    assert nbest_json(b.nbest) == nbest_json(a.nbest)


def _random_case(seed: int, n_examples: int, width: int, tie_step: float, dtype: str, pad_frac: float):
    """Examples with 0-3 features each; offsets None at random; logits rounded to make ties; -100 padding."""
    rng = np.random.default_rng(seed)
    ids = [f"q{i}" for i in range(n_examples)]
    contexts = ["".join(chr(97 + c) for c in rng.integers(0, 26, size=120)) for _ in ids]
    feature_ids, offsets = [], []
    for qid in ids:
        for _ in range(int(rng.integers(0, 4))):
            length = int(rng.integers(1, width + 1))
            row = []
            for _ in range(length):
                if rng.random() < 0.3:
                    row.append(None)
                else:
                    a = int(rng.integers(0, 100))
                    row.append((a, a + int(rng.integers(0, 15))))
            feature_ids.append(qid)
            offsets.append(row)
    n = len(feature_ids)
    start = rng.normal(size=(n, width))
    end = rng.normal(size=(n, width))
    if tie_step > 0:  # coarse values: many equal logits, like bf16 output
        start, end = np.round(start / tie_step) * tie_step, np.round(end / tie_step) * tie_step
    for f, row in enumerate(offsets):
        if rng.random() < pad_frac:  # the Trainer's -100 padding past a feature's batch width
            start[f, len(row):] = -100.0
            end[f, len(row):] = -100.0
    examples = {"id": ids, "context": contexts}
    features = {"example_id": feature_ids, "offset_mapping": offsets}
    return examples, features, (start.astype(dtype), end.astype(dtype))


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
def test_vectorized_equals_loop_on_random_logits(
    seed, n_examples, width, tie_step, dtype, pad_frac, v2, n_best, max_answer_length, threshold
):
    examples, features, logits = _random_case(seed, n_examples, width, tie_step, dtype, pad_frac)
    cfg = PostprocessConfig(v2, n_best, max_answer_length, threshold)
    ref = postprocess_qa_predictions_loop(examples, features, logits, cfg)
    _same(ref, postprocess_qa_predictions_vectorized(examples, features, logits, cfg))
    arrow = {"example_id": features["example_id"], "offset_mapping": pa.array(features["offset_mapping"])}
    _same(ref, postprocess_qa_predictions_vectorized(examples, arrow, logits, cfg))


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


def test_ragged_offset_pairs_are_refused():
    for rows in ([[(1, 2, 3)], [(4,)]], [[(1, 2, 3)], [(4, 5)]]):
        with pytest.raises(ValueError, match="pairs"):
            flat_offsets(rows)
        with pytest.raises(ValueError, match="pairs"):
            flat_offsets(pa.array(rows))


def test_offset_pairs_holding_nulls_are_refused():
    with pytest.raises(ValueError, match="pairs must not hold nulls"):
        flat_offsets(pa.array([[(0, 3), (4, None)]]))


def _context_starts_ends(offs) -> tuple[list[int], list[int]]:
    """Start and end characters of every context token, in flat order."""
    tokens = np.flatnonzero(offs.valid)
    return offs.start_at(tokens).tolist(), offs.end_at(tokens).tolist()


def test_flat_offsets_from_arrow_and_lists_agree():
    rows = [[None, (0, 3), (4, 9), None], [], [(2, 2)], [None]]
    a, b = flat_offsets(rows), flat_offsets(pa.array(rows))
    for name in ("row_start", "length", "valid"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert _context_starts_ends(a) == _context_starts_ends(b) == ([0, 4, 2], [3, 9, 2])
    assert a.length.tolist() == [4, 0, 1, 1]
    assert a.valid.tolist() == [False, True, True, False, True, False]
    # a sliced/reordered Arrow column (dataset.select) is read with its own offsets
    sliced = pa.chunked_array([pa.array(rows)]).take([2, 0])
    c = flat_offsets(sliced)
    assert c.length.tolist() == [1, 4] and _context_starts_ends(c)[0] == [2, 0, 4]


def test_context_tokens_past_a_row_or_outside_the_context_are_refused():
    offs = flat_offsets([[None, (0, 3), (4, 9)], [], [(2, 2)]])
    ok, flat = offs.context_tokens(np.array([[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]))
    assert ok.tolist() == [[False, True, True, False], [False] * 4, [True, False, False, False]]
    assert offs.start_at(flat[ok]).tolist() == [0, 4, 2]


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
    start = np.full((n, width), -100.0, dtype=np.float32)
    end = np.full((n, width), -100.0, dtype=np.float32)
    for i, ids in enumerate(feats["input_ids"]):
        start[i, : len(ids)] = rng.normal(size=len(ids))
        end[i, : len(ids)] = rng.normal(size=len(ids))
    examples = {"id": batch["id"], "context": batch["context"]}
    features = {"example_id": feats["example_id"], "offset_mapping": feats["offset_mapping"]}
    for v2 in (False, True):
        cfg = PostprocessConfig(version_2_with_negative=v2)
        ref = postprocess_qa_predictions_loop(examples, features, (start, end), cfg)
        _same(ref, postprocess_qa_predictions_vectorized(examples, features, (start, end), cfg))
        if v2:
            assert any(a == "" for a in ref.answers.values()) or ref.null_odds


def test_errors_match_the_loop():
    examples = {"id": ["a"], "context": ["abc"]}
    features = {"example_id": ["zzz"], "offset_mapping": [[(0, 1)]]}
    logits = (np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32))
    with pytest.raises(ValueError, match="unknown example id 'zzz'"):
        postprocess_qa_predictions_vectorized(examples, features, logits, PostprocessConfig())
    features = {"example_id": ["a", "a"], "offset_mapping": [[(0, 1)], [(0, 1)]]}
    with pytest.raises(ValueError, match="got 1 logit rows for 2 features"):
        postprocess_qa_predictions_vectorized(examples, features, logits, PostprocessConfig())


@pytest.mark.slow
def test_full_dev_set_real_eval_identical():
    """All 10,570 dev questions, logits of a real MiniLM forward pass (cached by bench/dev_logits.py)."""
    import argparse

    from conftest import shared_squad_file

    dev_file = shared_squad_file("dev-v1.1.json")
    from bench.dev_logits import add_args, load_or_build

    parser = argparse.ArgumentParser()
    add_args(parser)
    dev, _, _ = load_or_build(parser.parse_args(["--validation_file", str(dev_file)]))
    assert len(dev.examples["id"]) == 10570
    logits = (dev.start_logits, dev.end_logits)
    arrow = {"example_id": dev.features["example_id"], "offset_mapping": pa.array(dev.features["offset_mapping"])}
    for v2 in (False, True):
        cfg = PostprocessConfig(version_2_with_negative=v2)
        ref = postprocess_qa_predictions_loop(dev.examples, dev.features, logits, cfg)
        _same(ref, postprocess_qa_predictions_vectorized(dev.examples, arrow, logits, cfg))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_mask_padding_sets_padding_in_the_logits_dtype(dtype):
    """Logits past each row's length become -100 in the logits' dtype; read-only inputs too, without a warning."""
    from qa_hpc.postprocess.vectorized import mask_padding

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
