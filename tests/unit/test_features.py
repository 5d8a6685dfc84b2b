"""Features: dynamic padding and length-ordered evaluation change no answer; datasets' cache serves them again.

- train batches are padded to their own longest feature, a multiple of 8, so widths differ;
- with --pad_to_max_length every batch is max_seq_length wide (the HF behaviour);
- evaluating longest-first and restoring the order gives the same answers and logits as in dataset order;
- a second build with the same file, tokenizer and settings reuses the cached features; a change recomputes.
"""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
from transformers import DataCollatorWithPadding, default_data_collator

from qa_hpc.features import build_data
from qa_hpc.flags import DataTrainingArguments, ModelArguments, QATrainingArguments
from qa_hpc.metric.squad import make_score
from qa_hpc.model import load_config, load_model, load_tokenizer
from qa_hpc.postprocess import make_postprocess
from trainer_qa import QuestionAnsweringTrainer, length_order


def _args(tiny_bert, demo_files, tmp_path, pad: bool = False, strategy: str = "group_by_length", **data):
    model_args = ModelArguments(model_name_or_path=str(tiny_bert))
    data_args = DataTrainingArguments(**{
        "train_file": str(demo_files["train"]), "validation_file": str(demo_files["validation"]), "max_seq_length": 128,
        "doc_stride": 32, "pad_to_max_length": pad, "features_cache_dir": str(tmp_path / "cache"), **data})
    training_args = QATrainingArguments(
        output_dir=str(tmp_path / "out"), do_train=True, do_eval=True, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, report_to="none", train_sampling_strategy=strategy, use_cpu=True,
    )
    return model_args, data_args, training_args


def _setup(tiny_bert, demo_files, tmp_path, pad: bool, strategy: str = "group_by_length"):
    model_args, data_args, training_args = _args(tiny_bert, demo_files, tmp_path, pad, strategy)
    tokenizer = load_tokenizer(model_args)
    data = build_data(model_args, data_args, training_args, tokenizer)
    model = load_model(model_args, load_config(model_args))
    collator = default_data_collator if pad else DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    return model, tokenizer, data, data_args, training_args, collator


def _trainer(model, tokenizer, data, data_args, training_args, collator, sort_eval: bool):
    return QuestionAnsweringTrainer(
        model=model, args=training_args, train_dataset=data.train, eval_dataset=data.eval_features,
        eval_examples=data.eval_examples, processing_class=tokenizer, data_collator=collator,
        post_process_function=make_postprocess(data_args, training_args.output_dir),
        score_function=make_score(data_args.version_2_with_negative, data_args.null_score_diff_threshold),
        sort_eval_by_length=sort_eval,
    )


def test_train_batches_are_padded_per_batch_to_multiples_of_8(tiny_bert, demo_files, tmp_path):
    model, tok, data, data_args, training_args, collator = _setup(tiny_bert, demo_files, tmp_path, pad=False)
    trainer = _trainer(model, tok, data, data_args, training_args, collator, True)
    widths = []
    real = 0
    for batch in trainer.get_train_dataloader():
        width = batch["input_ids"].shape[1]
        widths.append(width)
        assert width % 8 == 0
        longest = int(batch["attention_mask"].sum(dim=1).max())
        assert longest <= width < longest + 8, "padded to the batch's own longest feature, rounded up to 8"
        real += int(batch["attention_mask"].sum())
    assert len(set(widths)) > 1, f"every batch had the same width {widths[0]}: padding is not dynamic"
    assert min(widths) < data_args.max_seq_length
    lengths = np.array([len(x) for x in data.train["input_ids"]])
    assert real == lengths.sum(), "every real token reaches the model exactly once per epoch"


def test_pad_to_max_length_gives_full_width_batches(tiny_bert, demo_files, tmp_path):
    model, tok, data, data_args, training_args, collator = _setup(
        tiny_bert, demo_files, tmp_path, pad=True, strategy="random"
    )
    trainer = _trainer(model, tok, data, data_args, training_args, collator, False)
    widths = {batch["input_ids"].shape[1] for batch in trainer.get_train_dataloader()}
    assert widths == {data_args.max_seq_length}


def test_length_sorted_eval_restores_order(tiny_bert, demo_files, tmp_path):
    import torch

    model, tok, data, data_args, training_args, collator = _setup(tiny_bert, demo_files, tmp_path, pad=False)
    # a random tiny BERT gives nearly equal logits everywhere, so rounding noise would pick answers;
    # a larger QA head spreads them so that answers are decided by the model, not by the noise
    torch.manual_seed(0)
    with torch.no_grad():
        model.qa_outputs.weight.normal_(0.0, 5.0)
    order = length_order(data.eval_features)
    assert order is not None and not np.array_equal(order, np.arange(len(order))), "eval data must need sorting"
    outputs = {}
    for sort in (True, False):
        trainer = _trainer(model, tok, data, data_args, training_args, collator, sort)
        logits, _, _ = trainer._gather_logits(data.eval_features, "Evaluation", None, "eval")
        preds = trainer.post_process_function(data.eval_examples, data.eval_features, logits, f"eval_sort{sort}")
        outputs[sort] = (logits, preds)
    (ls, ps), (lu, pu) = outputs[True], outputs[False]
    assert ps.answers == pu.answers
    assert [[e["text"] for e in v] for v in ps.nbest.values()] == [[e["text"] for e in v] for v in pu.nbest.values()]
    for a, b in zip(ls, lu):
        real = a > -100  # columns past a batch's width hold the Trainer's -100 padding, which differs by batch
        np.testing.assert_allclose(a[real & (b > -100)], b[real & (b > -100)], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("pad", [False, True])
def test_token_log_line(tiny_bert, demo_files, tmp_path, caplog, pad):
    with caplog.at_level(logging.INFO, logger="qa_hpc.features"):
        _, _, data, data_args, _, _ = _setup(tiny_bert, demo_files, tmp_path, pad=pad)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("TOKENS split=train")]
    assert lines, "TOKENS line logged"
    fields = dict(kv.split("=") for kv in lines[0].split()[1:])
    real = sum(sum(m) for m in data.train["attention_mask"])
    assert int(fields["real_tokens"]) == real
    assert int(fields["tokens_at_max_length"]) == len(data.train) * data_args.max_seq_length
    assert real < int(fields["tokens_at_max_length"])


def _cache_lines(tiny_bert, demo_files, tmp_path, caplog, padding_side="right", **data) -> dict[str, str]:
    """split -> reused|computed, from the FEATURES_CACHE lines of one build_data."""
    model_args, data_args, training_args = _args(tiny_bert, demo_files, tmp_path, **data)
    tokenizer = load_tokenizer(model_args)
    tokenizer.padding_side = padding_side  # "left": context first, so other features
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qa_hpc.features"):
        built = build_data(model_args, data_args, training_args, tokenizer)
    assert len(built.train) > 0 and len(built.eval_features) > 0
    lines = [r.getMessage().split() for r in caplog.records if r.getMessage().startswith("FEATURES_CACHE ")]
    return {words[1].removeprefix("split="): words[2] for words in lines}


def test_features_cache_reused_until_file_tokenizer_or_settings_change(tiny_bert, demo_files, tmp_path, caplog):
    files = {split: tmp_path / f"{split}.json" for split in ("train", "validation")}
    for split, path in files.items():
        shutil.copy(demo_files[split], path)
    computed, reused = {"train": "computed", "eval": "computed"}, {"train": "reused", "eval": "reused"}
    assert _cache_lines(tiny_bert, files, tmp_path, caplog) == computed
    assert _cache_lines(tiny_bert, files, tmp_path, caplog) == reused
    assert _cache_lines(tiny_bert, files, tmp_path, caplog, doc_stride=48) == computed
    assert _cache_lines(tiny_bert, files, tmp_path, caplog, padding_side="left") == computed
    assert _cache_lines(tiny_bert, files, tmp_path, caplog, overwrite_cache=True) == computed
    text = files["validation"].read_text(encoding="utf-8")
    files["validation"].write_text(text.replace("?", " ?", 1), encoding="utf-8")  # same size class, other bytes
    assert _cache_lines(tiny_bert, files, tmp_path, caplog) == {"train": "reused", "eval": "computed"}
    assert _cache_lines(tiny_bert, files, tmp_path, caplog, max_train_samples=5) == {"train": "computed",
                                                                                      "eval": "reused"}
