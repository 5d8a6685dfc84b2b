"""Features, checked against HF's recipe and direct forward passes: window labels and offsets, dynamic padding
(and --pad_to_max_length), evaluation order with each feature keeping its own logits, and the features cache.
"""

from __future__ import annotations

import copy
import json
import logging
import pickle
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForQuestionAnswering,
    DataCollatorWithPadding,
    TrainerCallback,
    default_data_collator,
)

import qa_hpc.features as features_module
from qa_hpc.errors import UsageError
from qa_hpc.features import (
    FeatureConfig,
    FeatureError,
    _read_splits,
    build_data,
    prepare_train_features,
    prepare_validation_features,
    real_lengths,
)
from qa_hpc.flags import DataTrainingArguments, ModelArguments, QATrainingArguments
from qa_hpc.model import load_config, load_model, load_tokenizer
from qa_hpc.postprocess import DivergedModel
from qa_hpc.squad_io import DataError, load_qa_records
from trainer_qa import QuestionAnsweringTrainer, length_order

QUESTION = "What is the capital of the region?"


def long_example(qid: str, answer: str, position: str) -> dict:
    """A context of ~600 tokens with the answer early, in the middle or late."""
    filler = " ".join(f"sentence number {i} talks about nothing in particular." for i in range(80))
    cut = {"early": 0, "middle": filler.index(" ", len(filler) // 2), "late": len(filler)}[position]
    context = f"{filler[:cut]} The capital of the region is {answer}. {filler[cut:]}".strip()
    return {
        "id": qid,
        "question": QUESTION,
        "context": context,
        "answers": {"text": [answer], "answer_start": [context.index(answer)]},
    }


def batch(examples: list[dict]) -> dict[str, list]:
    return {k: [e[k] for e in examples] for k in examples[0]}


@pytest.mark.parametrize("pad", [False, True])
def test_train_labels_recover_gold_span_in_every_window_that_holds_it(tokenizer, pad):
    examples = batch(
        [
            long_example("a", "Velmora Tusk", "early"),
            long_example("b", "Quillen Bay", "middle"),
            long_example("c", "Ardent Hollow", "late"),
        ]
    )
    feats = prepare_train_features(
        examples, tokenizer, FeatureConfig(max_seq_length=128, doc_stride=32, pad_to_max_length=pad)
    )
    # the tokenizer's own windows and offsets, to map the labels back to characters independently
    enc = tokenizer(
        examples["question"],
        examples["context"],
        truncation="only_second",
        max_length=128,
        stride=32,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if pad else False,
    )
    windows: dict[int, list[bool]] = {0: [], 1: [], 2: []}  # per example: does each window hold the answer?
    for i, (s, e) in enumerate(zip(feats["start_positions"], feats["end_positions"])):
        ex = enc["overflow_to_sample_mapping"][i]
        offsets = enc["offset_mapping"][i]
        context_tokens = [k for k, sid in enumerate(enc.sequence_ids(i)) if sid == 1]
        a_start = examples["answers"][ex]["answer_start"][0]
        a_end = a_start + len(examples["answers"][ex]["text"][0])
        windows[ex].append(
            offsets[context_tokens[0]][0] <= a_start and offsets[context_tokens[-1]][1] >= a_end
        )
        if windows[ex][-1]:
            assert (
                examples["context"][ex][offsets[s][0] : offsets[e][1]] == examples["answers"][ex]["text"][0]
            )
        else:
            assert s == 0 and e == 0, "windows without the whole answer point at CLS"
        assert not pad or len(feats["input_ids"][i]) == 128
    assert all(len(w) >= 4 for w in windows.values()), windows
    # the early answer in the first window, the late in a third+
    first = [w.index(True) for w in windows.values()]
    assert first[0] == 0 and first[1] >= 1 and first[2] >= 2, windows


def test_an_unanswerable_example_points_at_cls(tokenizer):
    ex = {
        "id": "x",
        "question": "Who?",
        "context": "Ann met Bob.",
        "answers": {"text": [], "answer_start": []},
    }
    feats = prepare_train_features(batch([ex]), tokenizer, FeatureConfig(max_seq_length=64, doc_stride=16))
    assert (feats["start_positions"], feats["end_positions"]) == ([0], [0])


def test_validation_features_keep_offsets_only_in_context(tokenizer):
    feats = prepare_validation_features(
        batch([long_example("a", "Velmora Tusk", "late")]),
        tokenizer,
        FeatureConfig(max_seq_length=128, doc_stride=32),
    )
    assert set(feats["example_id"]) == {"a"} and len(feats["example_id"]) >= 4
    q_len = len(tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
    for ids, offsets in zip(feats["input_ids"], feats["offset_mapping"]):
        # CLS, question, SEP; last SEP
        assert all(o is None for o in offsets[: q_len + 2]) and offsets[-1] is None
        assert all(o is not None for o in offsets[q_len + 2 : len(ids) - 1])


def test_question_too_long_names_record_and_field(tokenizer):
    ex = {
        "id": "q-long",
        "question": "why " * 120,
        "context": "Ann met Bob.",
        "answers": {"text": ["Bob"], "answer_start": [8]},
    }
    with pytest.raises(FeatureError, match=r"record id='q-long': field 'question' has 120 tokens") as raised:
        prepare_train_features(batch([ex]), tokenizer, FeatureConfig(max_seq_length=128, doc_stride=32))
    # as a --preprocessing_num_workers process hands it back
    again = pickle.loads(pickle.dumps(raised.value))
    assert (again.record_id, again.field, str(again)) == ("q-long", "question", str(raised.value))


def test_a_split_comes_from_its_file_or_a_dataset_that_has_it(tmp_path):
    """Neither --validation_file nor --dataset_name, or a dataset (here a local folder) without that split:
    one UsageError naming what to give, before anything is tokenized."""
    with pytest.raises(
        UsageError, match="^no --validation_file and no --dataset_name to read the validation split"
    ):
        _read_splits(DataTrainingArguments(dataset_name=None), ModelArguments(), ["validation"])
    (tmp_path / "train.json").write_text('{"id": "q0", "question": "?", "context": "c"}\n')
    with pytest.raises(UsageError, match=r"^dataset \S+ has no 'validation' split \(has \['train'\]\)$"):
        _read_splits(
            DataTrainingArguments(dataset_name=str(tmp_path)),
            ModelArguments(cache_dir=str(tmp_path / "c")),
            ["train", "validation"],
        )


def test_a_dataset_split_is_checked_as_its_file_would_be(tiny_bert, demo_files_v2, tmp_path, caplog):
    """--dataset_name rows (here a local folder in the hub's layout: one JSON Lines file per split) go
    through the same record checks as --train_file: the same examples, a DATA_LOADED line, and unanswerable
    rows without --version_2_with_negative stop the run before anything is tokenized, naming split and row."""
    hub = tmp_path / "hub"
    hub.mkdir()
    records = {}
    for split in ("train", "validation"):
        records[split] = load_qa_records(demo_files_v2[split], version_2_with_negative=True)[0]
        lines = "".join(json.dumps(r) + "\n" for r in records[split])
        (hub / f"{split}.jsonl").write_text(lines)
    # a test split without answers: load_dataset gives its rows the column, null
    unlabelled = [{k: v for k, v in r.items() if k != "answers"} for r in records["validation"][:5]]
    (hub / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in unlabelled))
    built = _build(
        tiny_bert,
        demo_files_v2,
        tmp_path,
        caplog,
        train_file=None,
        validation_file=None,
        dataset_name=str(hub),
        version_2_with_negative=True,
    )
    assert built.data.eval_examples.to_list() == records["validation"]
    impossible = sum(not r["answers"]["text"] for r in records["validation"])
    line = f"DATA_LOADED dataset={hub} format=dataset records={len(records['validation'])} "
    assert f"{line}impossible={impossible} skipped=0 fixed=0 split=validation" in built.log
    args = (ModelArguments(cache_dir=str(tmp_path / "c")), ["train", "validation"])
    (test,) = _read_splits(DataTrainingArguments(dataset_name=str(hub)), args[0], ["test"]).values()
    assert not test.scorable and test.summary().endswith("impossible=0 skipped=0 fixed=0 unlabelled=5")
    first = next(i for i, r in enumerate(records["train"]) if not r["answers"]["text"])
    with pytest.raises(DataError) as err:
        _read_splits(DataTrainingArguments(dataset_name=str(hub)), *args)
    assert str(err.value).startswith(
        f"dataset {hub} split train: row {first} (id '{records['train'][first]['id']}'): field 'answers': "
        "record has no answer (no answers given) but version_2_with_negative is off; pass "
        "--version_2_with_negative"
    ), err.value
    # a folder of official nested files: load_dataset reads each as one row of ('version', 'data')
    nested = tmp_path / "nested"
    nested.mkdir()
    for split in ("train", "validation"):
        shutil.copy(demo_files_v2[split], nested / f"{split}.json")
    with pytest.raises(DataError) as err:
        _read_splits(DataTrainingArguments(dataset_name=str(nested)), *args)
    assert str(err.value) == (
        f"dataset {nested} split train: has columns ['version', 'data'], not question records: no 'id', "
        "'question', 'context' (the official nested SQuAD layout, one row per file: give such files as "
        "--train_file, --validation_file or --test_file)"
    )


@pytest.fixture(scope="module")
def eval_setup(tiny_bert, tokenizer, demo_files):
    examples = datasets.Dataset.from_list(
        load_qa_records(demo_files["validation"], split="validation")[0][:4]
    )
    features = examples.map(
        prepare_validation_features,
        batched=True,
        remove_columns=examples.column_names,
        fn_kwargs={"tokenizer": tokenizer, "cfg": FeatureConfig(128, 32)},
    )
    order = length_order(features)  # several windows per example, the last one shorter
    assert order is not None and (order != np.arange(len(order))).any(), "eval data must need sorting"
    return features, AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert)).eval()


# group_by_length: transformers hands eval a shuffled sampler unless the trainer keeps it sequential;
# sort_eval: the longest-first order must be undone after the gather; remove_unused_columns false: the
# Trainer leaves the postprocessing columns in, which the model does not take
@pytest.mark.parametrize(
    ("strategy", "sort_eval", "remove_unused"),
    [("group_by_length", False, True), ("random", True, True), ("random", True, False)],
)
def test_gathered_logits_belong_to_their_feature(
    eval_setup, tokenizer, tmp_path, strategy, sort_eval, remove_unused
):
    features, model = eval_setup
    args = QATrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=7,
        report_to="none",
        train_sampling_strategy=strategy,
        remove_unused_columns=remove_unused,
    )
    trainer = QuestionAnsweringTrainer(
        model=model,
        args=args,
        eval_dataset=features,
        processing_class=tokenizer,
        sort_eval_by_length=sort_eval,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8),
    )
    (start, end), _, n = trainer._gather_logits(features, "Evaluation", None, "eval")
    assert n == len(features) == len(start)
    with torch.no_grad():  # one feature at a time, no padding, no Trainer: the ground truth
        for i, (ids, mask, types) in enumerate(
            zip(features["input_ids"], features["attention_mask"], features["token_type_ids"])
        ):
            out = model(
                input_ids=torch.tensor([ids]),
                attention_mask=torch.tensor([mask]),
                token_type_ids=torch.tensor([types]),
            )
            np.testing.assert_allclose(
                start[i][: len(ids)], out.start_logits[0], atol=1e-4, err_msg=f"feature {i}"
            )
            np.testing.assert_allclose(
                end[i][: len(ids)], out.end_logits[0], atol=1e-4, err_msg=f"feature {i}"
            )


class _Stages(TrainerCallback):  # which callback event each stage raised, with its metrics' prefixes
    def __init__(self) -> None:
        self.seen: list[tuple[str, set[str]]] = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs) -> None:
        self.seen.append(("on_evaluate", {key.split("_")[0] for key in metrics if key != "epoch"}))

    def on_predict(self, args, state, control, metrics=None, **kwargs) -> None:
        self.seen.append(("on_predict", {key.split("_")[0] for key in metrics if key != "epoch"}))


def test_evaluate_and_predict_raise_their_own_callback_event(eval_setup, tokenizer, tmp_path):
    """Callbacks that act on evaluation (early stopping, best-model tracking) must not see prediction
    metrics."""
    features, model = eval_setup
    stages = _Stages()
    args = QATrainingArguments(output_dir=str(tmp_path), report_to="none")
    trainer = QuestionAnsweringTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        callbacks=[stages],
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8),
    )
    trainer.evaluate(features, features)
    trainer.predict(features, features)
    assert stages.seen == [("on_evaluate", {"eval"}), ("on_predict", {"predict"})]


def test_eval_loss_is_the_models_loss_on_labelled_features(tokenizer, demo_files, eval_setup, tmp_path):
    """Features with labels: the evaluation loop's loss reaches the metrics as eval_loss, equal to the loss of
    one direct forward pass over the same batch."""
    _, model = eval_setup
    examples = datasets.Dataset.from_list(
        load_qa_records(demo_files["validation"], split="validation")[0][:4]
    )
    labelled = examples.map(
        prepare_train_features,
        batched=True,
        remove_columns=examples.column_names,
        fn_kwargs={"tokenizer": tokenizer, "cfg": FeatureConfig(128, 32)},
    )
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    # one batch: the loop's loss is then that batch's mean, the same as the model's own
    args = QATrainingArguments(
        output_dir=str(tmp_path), report_to="none", per_device_eval_batch_size=len(labelled)
    )
    trainer = QuestionAnsweringTrainer(
        model=model, args=args, processing_class=tokenizer, data_collator=collator
    )
    metrics = trainer.evaluate(labelled, examples)
    with torch.no_grad():
        expected = model(**collator(labelled.to_list())).loss.item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_a_diverged_model_stops_evaluation_before_postprocessing(eval_setup, tokenizer, tmp_path):
    """NaN logits (a NaN bias of the start head) fail evaluate() where they are gathered, on every rank,
    before the main process alone postprocesses; only the positions an answer can come from are counted."""
    features, model = eval_setup
    diverged = copy.deepcopy(model)
    with torch.no_grad():
        diverged.qa_outputs.bias[0] = float("nan")
    postprocessed = []
    trainer = QuestionAnsweringTrainer(
        model=diverged,
        args=QATrainingArguments(output_dir=str(tmp_path), report_to="none"),
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8),
        post_process_function=lambda *call: postprocessed.append(call),
    )
    n = len(features)
    nan = int(real_lengths(features).sum())
    with pytest.raises(
        DivergedModel,
        match=rf"^eval logits have {nan} NaN values and 0 infinite values, in {n} of {n} features: the model",
    ):
        trainer.evaluate(features, features)
    assert postprocessed == []


def test_real_lengths_from_arrow_and_lists_count_mask_ones():  # the real tokens of the efficiency figures
    masks = [[1] * 5 + [0] * 3, [1] * 8, [1, 1], [1] * 3 + [0] * 5]
    ds = datasets.Dataset.from_dict({"attention_mask": masks})
    assert real_lengths(ds).tolist() == real_lengths({"attention_mask": masks}).tolist() == [5, 8, 2, 3]
    assert real_lengths(ds.select([3, 0])).tolist() == [3, 5]


def test_length_order_is_longest_first_and_none_when_uniform():
    ds = datasets.Dataset.from_dict({"attention_mask": [[1] * 3, [1] * 9, [1] * 5, [1] * 9]})
    assert length_order(ds).tolist() == [1, 3, 2, 0]
    assert length_order(ds.select([2, 0])).tolist() == [0, 1]  # a selection's own rows
    assert length_order(datasets.Dataset.from_dict({"attention_mask": [[1] * 4, [1] * 4]})) is None


def _build(tiny_bert, files, tmp_path, caplog, padding_side: str = "right", strategy: str = "random", **data):
    """build_data on ``files`` with a tiny BERT, and the log it wrote."""
    model_args = ModelArguments(model_name_or_path=str(tiny_bert))
    data_args = DataTrainingArguments(
        **{
            "train_file": str(files["train"]),
            "validation_file": str(files["validation"]),
            "max_seq_length": 128,
            "doc_stride": 32,
            "features_cache_dir": str(tmp_path / "cache"),
            **data,
        }
    )
    training_args = QATrainingArguments(
        output_dir=str(tmp_path / "out"),
        do_train=True,
        do_eval=True,
        use_cpu=True,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        report_to="none",
        train_sampling_strategy=strategy,
    )
    tokenizer = load_tokenizer(model_args)
    tokenizer.padding_side = padding_side  # "left": context first, so other features
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qa_hpc.features"):
        data = build_data(model_args, data_args, training_args, tokenizer)
    return SimpleNamespace(
        model_args=model_args, training_args=training_args, tokenizer=tokenizer, data=data, log=caplog.text
    )


@pytest.mark.parametrize("pad", [False, True], ids=["dynamic", "pad_to_max_length"])
def test_batch_widths_and_token_counts(tiny_bert, demo_files, tmp_path, caplog, pad):
    b = _build(
        tiny_bert,
        demo_files,
        tmp_path,
        caplog,
        pad_to_max_length=pad,
        strategy="random" if pad else "group_by_length",
    )
    logged = re.search(r"TOKENS split=train features=\d+ real_tokens=(\d+) tokens_at_max_length=(\d+)", b.log)
    real = sum(sum(m) for m in b.data.train["attention_mask"])
    at_max = len(b.data.train) * 128
    assert tuple(map(int, logged.groups())) == (real, at_max) and real < at_max
    trainer = QuestionAnsweringTrainer(  # as run_qa.py builds it (its collator)
        model=load_model(b.model_args, load_config(b.model_args)),
        args=b.training_args,
        train_dataset=b.data.train,
        processing_class=b.tokenizer,
        data_collator=default_data_collator
        if pad
        else DataCollatorWithPadding(b.tokenizer, pad_to_multiple_of=8),
    )
    widths: list[int] = []
    seen = 0
    for batch in trainer.get_train_dataloader():
        widths.append(batch["input_ids"].shape[1])
        longest = int(batch["attention_mask"].sum(dim=1).max())
        assert pad or longest <= widths[-1] < longest + 8, "padded to the batch's own longest feature"
        seen += int(batch["attention_mask"].sum())
    assert seen == real, "every real token reaches the model exactly once per epoch"
    if pad:
        assert set(widths) == {128}
    else:  # multiples of 8, and not all alike: padding is dynamic
        assert all(w % 8 == 0 for w in widths) and len(set(widths)) > 1 and max(widths) <= 128


def test_features_cache_reused_until_file_tokenizer_settings_or_code_change(
    tiny_bert, demo_files, tmp_path, caplog, monkeypatch
):
    files = {split: Path(shutil.copy(demo_files[split], tmp_path)) for split in ("train", "validation")}

    written: dict[str, int] = {}  # cache folder -> when its features file was written

    def cache(**changed) -> dict[str, str]:
        """split -> reused|computed; features said reused are not written again."""
        b = _build(tiny_bert, files, tmp_path, caplog, **changed)
        assert len(b.data.train) > 0 and len(b.data.eval_features) > 0
        said = {}
        for split, how, folder in re.findall(r"FEATURES_CACHE split=(\w+) (\w+) .* path=(\S+)", b.log):
            stamp = (Path(folder) / "features.arrow").stat().st_mtime_ns
            assert how == "computed" or written[folder] == stamp, (
                f"{split} features said reused but were written"
            )
            written[folder] = stamp
            said[split] = how
        return said

    computed = {"train": "computed", "eval": "computed"}
    reused = {"train": "reused", "eval": "reused"}
    assert (cache(), cache(), cache(doc_stride=48)) == (computed, reused, computed)
    assert (cache(padding_side="left"), cache(overwrite_cache=True)) == (computed, computed)
    with monkeypatch.context() as another_rank:  # --overwrite_cache: rank 0 recomputes, the others read it
        another_rank.setenv("RANK", "1")
        assert cache(padding_side="left", overwrite_cache=True) == reused
    text = files["validation"].read_text(encoding="utf-8")
    # same size class, other bytes
    files["validation"].write_text(text.replace("?", " ?", 1), encoding="utf-8")
    assert cache() == {"train": "reused", "eval": "computed"}
    assert cache(max_train_samples=5) == {"train": "computed", "eval": "reused"}
    # another version of the code that reads records or cuts windows (here: one more function among it)
    # reaches cached files too
    for code in ("RECORDS_CODE", "FEATURES_CODE"):
        with monkeypatch.context() as patched:
            patched.setattr(
                features_module,
                code,
                (
                    *getattr(features_module, code),
                    test_features_cache_reused_until_file_tokenizer_settings_or_code_change,
                ),
            )
            assert cache(max_train_samples=5) == computed, code
        assert cache(max_train_samples=5) == reused, code
