"""Dynamic padding and length-ordered evaluation really happen, and change no answer.

- train batches are padded to their own longest feature, a multiple of 8, so widths differ;
- with --pad_to_max_length every batch is max_seq_length wide (the HF behaviour);
- evaluating longest-first and restoring the order gives the same answers and logits as
  evaluating in dataset order.
"""

from __future__ import annotations

import numpy as np
import pytest
from transformers import DataCollatorWithPadding, default_data_collator

from qa_hpc.data.loading import build_data
from qa_hpc.metric.squad import make_score
from qa_hpc.model import load_config, load_model, load_tokenizer
from qa_hpc.postprocess import make_postprocess
from qa_hpc.flags import DataTrainingArguments, ModelArguments, QATrainingArguments
from trainer_qa import QuestionAnsweringTrainer, length_order


def _setup(tiny_bert, demo_files, tmp_path, pad: bool, strategy: str = "group_by_length"):
    model_args = ModelArguments(model_name_or_path=str(tiny_bert))
    data_args = DataTrainingArguments(
        train_file=str(demo_files["train"]), validation_file=str(demo_files["validation"]), max_seq_length=128,
        doc_stride=32, pad_to_max_length=pad, features_cache_dir=str(tmp_path / "cache"),
    )
    training_args = QATrainingArguments(
        output_dir=str(tmp_path / "out"), do_train=True, do_eval=True, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, report_to="none", train_sampling_strategy=strategy, use_cpu=True,
    )
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
    import logging

    with caplog.at_level(logging.INFO, logger="qa_hpc.data.loading"):
        _, _, data, data_args, _, _ = _setup(tiny_bert, demo_files, tmp_path, pad=pad)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("TOKENS split=train")]
    assert lines, "TOKENS line logged"
    fields = dict(kv.split("=") for kv in lines[0].split()[1:])
    real = sum(sum(m) for m in data.train["attention_mask"])
    assert int(fields["real_tokens"]) == real
    assert int(fields["tokens_at_max_length"]) == len(data.train) * data_args.max_seq_length
    assert real < int(fields["tokens_at_max_length"])
