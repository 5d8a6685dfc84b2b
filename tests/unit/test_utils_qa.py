"""Features (window labels, offsets) of utils_qa."""

from __future__ import annotations

import pytest

from qa_hpc.features import FeatureConfig, FeatureError, prepare_train_features, prepare_validation_features


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
