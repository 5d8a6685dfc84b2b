"""Features (window labels, offsets) of utils_qa."""

from __future__ import annotations

import pytest

from qa_hpc.features import FeatureConfig, FeatureError, prepare_train_features, prepare_validation_features

QUESTION = "What is the capital of the region?"


def long_example(qid: str, answer: str, position: str) -> dict:
    """A context of ~600 tokens with the answer early, in the middle or late."""
    filler = " ".join(f"sentence number {i} talks about nothing in particular." for i in range(80))
    cut = {"early": 0, "middle": filler.index(" ", len(filler) // 2), "late": len(filler)}[position]
    context = f"{filler[:cut]} The capital of the region is {answer}. {filler[cut:]}".strip()
    return {"id": qid, "question": QUESTION, "context": context,
            "answers": {"text": [answer], "answer_start": [context.index(answer)]}}


def batch(examples: list[dict]) -> dict[str, list]:
    return {k: [e[k] for e in examples] for k in examples[0]}


@pytest.mark.parametrize("pad", [False, True])
def test_train_labels_recover_gold_span_in_every_window_that_holds_it(tokenizer, pad):
    examples = batch([long_example("a", "Velmora Tusk", "early"), long_example("b", "Quillen Bay", "middle"),
                      long_example("c", "Ardent Hollow", "late")])
    feats = prepare_train_features(examples, tokenizer, FeatureConfig(max_seq_length=128, doc_stride=32,
                                                                     pad_to_max_length=pad))
    # the tokenizer's own windows and offsets, to map the labels back to characters independently
    enc = tokenizer(examples["question"], examples["context"], truncation="only_second", max_length=128, stride=32,
                    return_overflowing_tokens=True, return_offsets_mapping=True,
                    padding="max_length" if pad else False)
    windows: dict[int, list[bool]] = {0: [], 1: [], 2: []}  # per example: does each window hold the answer?
    for i, (s, e) in enumerate(zip(feats["start_positions"], feats["end_positions"])):
        ex, offsets = enc["overflow_to_sample_mapping"][i], enc["offset_mapping"][i]
        context_tokens = [k for k, sid in enumerate(enc.sequence_ids(i)) if sid == 1]
        a_start = examples["answers"][ex]["answer_start"][0]
        a_end = a_start + len(examples["answers"][ex]["text"][0])
        windows[ex].append(offsets[context_tokens[0]][0] <= a_start and offsets[context_tokens[-1]][1] >= a_end)
        if windows[ex][-1]:
            assert examples["context"][ex][offsets[s][0]:offsets[e][1]] == examples["answers"][ex]["text"][0]
        else:
            assert s == 0 and e == 0, "windows without the whole answer point at CLS"
        assert not pad or len(feats["input_ids"][i]) == 128
    assert all(len(w) >= 4 for w in windows.values()), windows
    first = [w.index(True) for w in windows.values()]  # the early answer in the first window, the late in a third+
    assert first[0] == 0 and first[1] >= 1 and first[2] >= 2, windows


@pytest.mark.parametrize(("answers", "decoded"), [({"text": ["Bob"], "answer_start": [8]}, "bob"),
                                                  ({"text": [], "answer_start": []}, "[CLS]")])  # unanswerable
def test_short_features_are_not_padded_and_point_at_the_answer(tokenizer, answers, decoded):
    ex = {"id": "x", "question": "Who?", "context": "Ann met Bob.", "answers": answers}
    feats = prepare_train_features(batch([ex]), tokenizer, FeatureConfig(max_seq_length=64, doc_stride=16))
    s, e = feats["start_positions"][0], feats["end_positions"][0]
    assert len(feats["input_ids"][0]) < 64 and tokenizer.decode(feats["input_ids"][0][s:e + 1]) == decoded


def test_validation_features_keep_offsets_only_in_context(tokenizer):
    feats = prepare_validation_features(batch([long_example("a", "Velmora Tusk", "late")]), tokenizer,
                                        FeatureConfig(max_seq_length=128, doc_stride=32))
    assert set(feats["example_id"]) == {"a"} and len(feats["example_id"]) >= 4
    q_len = len(tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
    for ids, offsets in zip(feats["input_ids"], feats["offset_mapping"]):
        assert all(o is None for o in offsets[: q_len + 2]) and offsets[-1] is None  # CLS, question, SEP; last SEP
        assert all(o is not None for o in offsets[q_len + 2 : len(ids) - 1])


def test_question_too_long_names_record_and_field(tokenizer):
    ex = {"id": "q-long", "question": "why " * 120, "context": "Ann met Bob.",
          "answers": {"text": ["Bob"], "answer_start": [8]}}
    with pytest.raises(FeatureError, match=r"train.json: record id='q-long': field 'question' has 120 tokens"):
        prepare_train_features(batch([ex]), tokenizer,
                               FeatureConfig(max_seq_length=128, doc_stride=32, source="train.json"))
