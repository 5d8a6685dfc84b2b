"""Features (window labels, offsets) and the reference postprocessing of utils_qa."""

from __future__ import annotations

import numpy as np
import pytest

from qa_hpc.features import FeatureConfig, FeatureError, prepare_train_features, prepare_validation_features
from qa_hpc.postprocess.reference import PostprocessConfig, features_by_example, postprocess_qa_predictions_loop


def _long_example(qid: str, answer: str, position: str) -> dict:
    """A context of ~600 tokens with the answer placed early, in the middle or at the end."""
    filler = " ".join(f"sentence number {i} talks about nothing in particular." for i in range(80))
    sentence = f"The capital of the region is {answer}."
    if position == "early":
        context = sentence + " " + filler
    elif position == "middle":
        half = len(filler) // 2
        cut = filler.index(" ", half)
        context = filler[:cut] + " " + sentence + filler[cut:]
    else:
        context = filler + " " + sentence
    start = context.index(answer)
    return {"id": qid, "question": "What is the capital of the region?", "context": context,
            "answers": {"text": [answer], "answer_start": [start]}}


def _batch(examples: list[dict]) -> dict[str, list]:
    return {k: [e[k] for e in examples] for k in examples[0]}


@pytest.mark.parametrize("pad", [False, True])
def test_train_labels_recover_gold_span_in_every_window_that_holds_it(tokenizer, pad):
    examples = [_long_example("a", "Velmora Tusk", "early"), _long_example("b", "Quillen Bay", "middle"),
                _long_example("c", "Ardent Hollow", "late")]
    cfg = FeatureConfig(max_seq_length=128, doc_stride=32, pad_to_max_length=pad)
    batch = _batch(examples)
    feats = prepare_train_features(batch, tokenizer, cfg)
    # recompute offsets independently to map labels back to characters
    enc = tokenizer(batch["question"], batch["context"], truncation="only_second", max_length=128, stride=32,
                    return_overflowing_tokens=True, return_offsets_mapping=True,
                    padding="max_length" if pad else False)
    windows_per_example = {0: 0, 1: 0, 2: 0}
    labelled_window_index = {0: [], 1: [], 2: []}
    for i, (s, e) in enumerate(zip(feats["start_positions"], feats["end_positions"])):
        ex = enc["overflow_to_sample_mapping"][i]
        windows_per_example[ex] += 1
        offsets = enc["offset_mapping"][i]
        seq = enc.sequence_ids(i)
        ctx = [k for k, sid in enumerate(seq) if sid == 1]
        a_start = batch["answers"][ex]["answer_start"][0]
        a_end = a_start + len(batch["answers"][ex]["text"][0])
        holds = offsets[ctx[0]][0] <= a_start and offsets[ctx[-1]][1] >= a_end
        if holds:
            assert batch["context"][ex][offsets[s][0]:offsets[e][1]] == batch["answers"][ex]["text"][0]
            labelled_window_index[ex].append(windows_per_example[ex] - 1)
        else:
            assert s == 0 and e == 0, "windows without the whole answer point at CLS"
        if pad:
            assert len(feats["input_ids"][i]) == 128
    assert all(n >= 4 for n in windows_per_example.values()), windows_per_example
    assert labelled_window_index[0][0] == 0
    assert min(labelled_window_index[1]) >= 1, "middle answer sits in a second or later window"
    assert min(labelled_window_index[2]) >= 2, "late answer sits in a third or later window"


def test_dynamic_features_are_not_padded(tokenizer):
    ex = {"id": "x", "question": "Who?", "context": "Ann met Bob.", "answers": {"text": ["Bob"], "answer_start": [8]}}
    feats = prepare_train_features(_batch([ex]), tokenizer, FeatureConfig(max_seq_length=64, doc_stride=16))
    assert len(feats["input_ids"][0]) < 64
    s, e = feats["start_positions"][0], feats["end_positions"][0]
    assert tokenizer.decode(feats["input_ids"][0][s:e + 1]) == "bob"


def test_unanswerable_train_example_points_at_cls(tokenizer):
    ex = {"id": "x", "question": "Who?", "context": "Ann met Bob.", "answers": {"text": [], "answer_start": []}}
    feats = prepare_train_features(_batch([ex]), tokenizer, FeatureConfig(max_seq_length=64, doc_stride=16))
    assert (feats["start_positions"][0], feats["end_positions"][0]) == (0, 0)


def test_validation_features_keep_offsets_only_in_context(tokenizer):
    examples = [_long_example("a", "Velmora Tusk", "late")]
    feats = prepare_validation_features(_batch(examples), tokenizer, FeatureConfig(max_seq_length=128, doc_stride=32))
    assert set(feats["example_id"]) == {"a"} and len(feats["example_id"]) >= 4
    for ids, offsets in zip(feats["input_ids"], feats["offset_mapping"]):
        assert offsets[0] is None and offsets[-1] is None  # CLS and final SEP
        q_len = len(tokenizer("What is the capital of the region?", add_special_tokens=False)["input_ids"])
        assert all(o is None for o in offsets[: q_len + 2])
        assert all(o is not None for o in offsets[q_len + 2 : len(ids) - 1])


def test_question_too_long_names_record_and_field(tokenizer):
    ex = {"id": "q-long", "question": "why " * 120, "context": "Ann met Bob.",
          "answers": {"text": ["Bob"], "answer_start": [8]}}
    with pytest.raises(FeatureError, match=r"train.json: record id='q-long': field 'question' has 120 tokens"):
        prepare_train_features(_batch([ex]), tokenizer,
                               FeatureConfig(max_seq_length=128, doc_stride=32, source="train.json"))


# ---- postprocessing from hand-built logits ----------------------------------------------------------

CONTEXT = "alpha beta gamma delta epsilon zeta"
#          0     6    11    17    23      31
WORDS = [(0, 5), (6, 10), (11, 16), (17, 22), (23, 30), (31, 35)]


def _feature(n_question: int = 2) -> list:
    """Offsets: CLS, question tokens, SEP, six context words, SEP."""
    return [None] + [None] * n_question + [None] + list(WORDS) + [None]


def _logits(length: int, start: dict[int, float], end: dict[int, float], pad_to: int | None = None):
    s = np.full(pad_to or length, -5.0, dtype=np.float32)
    e = np.full(pad_to or length, -5.0, dtype=np.float32)
    if pad_to:
        s[length:] = -100.0
        e[length:] = -100.0
    for k, v in start.items():
        s[k] = v
    for k, v in end.items():
        e[k] = v
    return s, e


def _run(start_rows, end_rows, offsets_rows, ids=None, context=CONTEXT, **cfg):
    ids = ids or ["q"] * len(offsets_rows)
    examples = {"id": sorted(set(ids), key=ids.index), "context": [context] * len(set(ids))}
    features = {"example_id": ids, "offset_mapping": offsets_rows}
    width = max(len(r) for r in start_rows)
    pad = lambda rows: np.stack([np.pad(r, (0, width - len(r)), constant_values=-100.0) for r in rows])  # noqa: E731
    return postprocess_qa_predictions_loop(examples, features, (pad(start_rows), pad(end_rows)),
                                           PostprocessConfig(**cfg))


def test_picks_best_valid_span():
    off = _feature()
    s, e = _logits(len(off), {5: 4.0, 6: 3.0}, {6: 4.5, 7: 1.0})
    preds = _run([s], [e], [off])
    assert preds.answers["q"] == "beta gamma"  # tokens 5..6 = words 1..2 (context starts at token 4)
    best = preds.nbest["q"][0]
    assert best["score"] == pytest.approx(8.5) and best["text"] == "beta gamma"
    assert sum(p["probability"] for p in preds.nbest["q"]) == pytest.approx(1.0)


def test_ignores_spans_outside_context_and_backwards_and_too_long():
    off = _feature()
    # context tokens: 4 alpha, 5 beta, 6 gamma, 7 delta, 8 epsilon, 9 zeta; others score -5.
    # (1,0)=18 is question/CLS, (9,8)=16 runs backwards, (4,8)=15 is 5 tokens (max 3):
    # the best valid pair is (6,8) = 2 + 8 = 10.
    s, e = _logits(len(off), {1: 9.0, 9: 8.0, 4: 7.0, 6: 2.0}, {0: 9.0, 8: 8.0, 7: 2.0})
    preds = _run([s], [e], [off], max_answer_length=3)
    assert preds.answers["q"] == "gamma delta epsilon"
    assert preds.nbest["q"][0]["score"] == pytest.approx(10.0)
    for p in preds.nbest["q"]:
        assert p["text"] in CONTEXT and p["text"]


def test_n_best_limits_candidates():
    off = _feature()
    # the only valid pair among the top candidates uses the 3rd best start and 3rd best end
    s, e = _logits(len(off), {9: 9.0, 8: 8.0, 4: 7.0}, {4: 8.0, 1: 9.0, 0: 8.5})
    assert _run([s], [e], [off], n_best_size=3).answers["q"] == "alpha"
    assert _run([s], [e], [off], n_best_size=2).answers["q"] == ""


def test_padding_logits_are_never_chosen():
    off = _feature()
    s, e = _logits(len(off), {5: 1.0}, {5: 1.0}, pad_to=len(off) + 6)
    s[len(off) + 2] = 50.0  # would be chosen if padded positions were not excluded
    e[len(off) + 3] = 50.0
    assert _run([s], [e], [off]).answers["q"] == "beta"


def test_best_span_across_windows_of_one_example():
    off = _feature()
    s1, e1 = _logits(len(off), {4: 2.0}, {4: 2.0})
    s2, e2 = _logits(len(off), {8: 3.0}, {9: 3.0})
    preds = _run([s1, s2], [e1, e2], [off, off], ids=["q", "q"])
    assert preds.answers["q"] == "epsilon zeta"


def test_examples_get_their_own_features():
    off = _feature()
    s1, e1 = _logits(len(off), {4: 2.0}, {4: 2.0})
    s2, e2 = _logits(len(off), {9: 3.0}, {9: 3.0})
    preds = _run([s1, s2], [e1, e2], [off, off], ids=["a", "b"])
    assert preds.answers == {"a": "alpha", "b": "zeta"}


def test_v2_null_answer_and_threshold():
    off = _feature()
    # null score = s[0]+e[0] = 6; best span 5..5 = 2+2 = 4; diff = 6 - 4 = 2
    s, e = _logits(len(off), {0: 3.0, 5: 2.0}, {0: 3.0, 5: 2.0})
    preds = _run([s], [e], [off], version_2_with_negative=True)
    assert preds.answers["q"] == "" and preds.null_odds["q"] == pytest.approx(2.0)
    assert any(p["text"] == "" for p in preds.nbest["q"])
    preds = _run([s], [e], [off], version_2_with_negative=True, null_score_diff_threshold=2.5)
    assert preds.answers["q"] == "beta"


def test_v2_null_uses_minimum_over_windows():
    off = _feature()
    s1, e1 = _logits(len(off), {0: 5.0, 5: 1.0}, {0: 5.0, 5: 1.0})  # null 10
    s2, e2 = _logits(len(off), {0: 1.0, 6: 3.0}, {0: 1.0, 6: 3.0})  # null 2, span 6
    preds = _run([s1, s2], [e1, e2], [off, off], ids=["q", "q"], version_2_with_negative=True)
    assert preds.null_odds["q"] == pytest.approx(2.0 - 6.0)
    assert preds.answers["q"] == "gamma"


def test_wrong_number_of_logit_rows_is_an_error():
    off = _feature()
    s, e = _logits(len(off), {}, {})
    with pytest.raises(ValueError, match="2 logit rows for 1 features"):
        postprocess_qa_predictions_loop({"id": ["q"], "context": [CONTEXT]},
                                        {"example_id": ["q"], "offset_mapping": [off]},
                                        (np.stack([s, s]), np.stack([e, e])), PostprocessConfig())


def test_features_by_example():
    assert features_by_example(["a", "b"], ["a", "a", "b"]) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="unknown example id 'z'"):
        features_by_example(["a"], ["z"])
