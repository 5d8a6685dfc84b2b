"""--pad_to_buckets: the widths it gives and refuses, the shapes one pass makes, and that a bucket changes
neither the loss nor the logits of real tokens nor the answers (a tiny fp32 BERT, features of generated
SQuAD data)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from fixtures.features import demo_features
from transformers import AutoModelForQuestionAnswering

from qa_hpc.batching import (
    BucketCollator,
    default_buckets,
    make_collator,
    parse_buckets,
    smallest_bucket,
    span_loss,
)
from qa_hpc.flags import DataTrainingArguments, QATrainingArguments
from qa_hpc.postprocess import make_postprocess
from trainer_qa import QuestionAnsweringTrainer

MAX_SEQ_LENGTH = 128
BUCKETS = default_buckets(MAX_SEQ_LENGTH)


@pytest.mark.parametrize(
    "text, max_seq_length, widths",
    [
        ("off", 384, ()),
        ("on", 384, (128, 192, 256, 320, 384)),
        ("on", 128, (48, 64, 88, 112, 128)),
        ("on", 512, (176, 256, 344, 432, 512)),
        ("128,256,384", 384, (128, 256, 384)),
        ("384", 384, (384,)),
        # a --max_seq_length that is no multiple of 8: the widest width, no width wider (30 gave 16,24,30,32)
        ("on", 30, (16, 24, 30)),
        ("on", 100, (40, 56, 72, 88, 100)),
        ("40,100", 100, (40, 100)),
    ],
)
def test_bucket_widths(text, max_seq_length, widths):
    assert parse_buckets(text, max_seq_length) == widths


@pytest.mark.parametrize(
    "text", ["100,384", "256,128,384", "128,128,384", "128,256", "128,,384", "0,384", "big"]
)
def test_a_bad_bucket_list_is_refused_saying_what_a_list_must_be(text):
    with pytest.raises(ValueError) as err:
        parse_buckets(text, 384)
    assert str(err.value) == (
        f"--pad_to_buckets {text}: give auto, off, on, or comma-separated widths, each a multiple of 8 but "
        "the largest, ascending, the largest equal to --max_seq_length (384)"
    )


def test_the_smallest_bucket_that_holds_the_longest_feature():
    assert [smallest_bucket(BUCKETS, n) for n in (1, 48, 49, 113, 128)] == [48, 48, 64, 128, 128]
    with pytest.raises(ValueError, match="longer than the widest bucket"):
        smallest_bucket(BUCKETS, 129)


@pytest.fixture(scope="module")
def qa(tiny_bert, demo_files, tmp_path_factory):
    """Real features of generated SQuAD files at 128/32, the tiny BERT in eval mode (no dropout), in fp32."""
    tmp = tmp_path_factory.mktemp("batching")
    files = {split: demo_files[split] for split in ("train", "validation")}
    tokenizer, data, args = demo_features(
        tiny_bert,
        files,
        tmp,
        MAX_SEQ_LENGTH,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=7,
        seed=3,
    )
    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert)).eval()
    return tokenizer, data, args, model, tmp


def _trainer(qa, buckets: tuple[int, ...], output_dir) -> QuestionAnsweringTrainer:
    tokenizer, data, args, model, _ = qa
    return QuestionAnsweringTrainer(
        model=model,
        args=QATrainingArguments(**{**args.to_dict(), "output_dir": str(output_dir)}),
        train_dataset=data.train,
        eval_dataset=data.eval_features,
        eval_examples=data.eval_examples,
        processing_class=tokenizer,
        data_collator=make_collator(tokenizer, buckets, pad_to_max_length=False),
        post_process_function=make_postprocess(DataTrainingArguments(), str(output_dir)),
    )


def test_one_pass_has_at_most_one_shape_per_bucket_plus_the_short_last_batch(qa, tmp_path):
    """Training's length-grouped loader: every width a bucket, the batch size fixed but for the last batch,
    every real token seen once, and no row all padding (each keeps its own real tokens; none is added)."""
    _, data, args, _, _ = qa
    trainer = _trainer(qa, BUCKETS, tmp_path)
    shapes, seen = [], 0
    for batch in trainer.get_train_dataloader():
        shapes.append(tuple(batch["input_ids"].shape))
        rows_real = batch["attention_mask"].sum(dim=1)
        assert int(rows_real.min()) > 0, "a row of the batch is all padding"
        assert smallest_bucket(BUCKETS, int(rows_real.max())) == shapes[-1][1], "not the smallest bucket"
        seen += int(rows_real.sum())
    assert seen == sum(sum(mask) for mask in data.train["attention_mask"])
    assert {rows for rows, _ in shapes[:-1]} == {args.per_device_train_batch_size}
    assert {width for _, width in shapes} <= set(BUCKETS)
    assert len(set(shapes)) <= len(BUCKETS) + 1
    assert len({width for _, width in shapes}) > 1, "the data must span several buckets"


def _loss_and_real_logits(trainer: QuestionAnsweringTrainer, batch: dict) -> tuple[torch.Tensor, list]:
    """The loss as the Trainer computes it in training, and each row's start and end logits on its real
    tokens."""
    real = batch["attention_mask"].sum(dim=1).tolist()
    with torch.no_grad():
        loss, outputs = trainer.compute_loss(trainer.model, dict(batch), return_outputs=True)
    rows = [(outputs.start_logits[i, :n], outputs.end_logits[i, :n]) for i, n in enumerate(real)]
    return loss, rows


def test_a_bucket_gives_the_pad_to_8_loss_and_real_token_logits(qa, tmp_path):
    """Train batches collated both ways (the same features): to 1e-5 the same loss and logits of real
    tokens, and nothing NaN, in batches a bucket pads past dynamic padding's width."""
    tokenizer, data, _, _, _ = qa
    trainer = _trainer(qa, BUCKETS, tmp_path)
    features = [data.train[i] for i in range(len(data.train))]
    # sorted: the short batches are padded to a bucket much wider than their longest feature
    features.sort(key=lambda feature: len(feature["input_ids"]))
    groups = [features[i : i + 8] for i in range(0, len(features), 8)]
    bucket = BucketCollator(tokenizer, BUCKETS)
    eight = make_collator(tokenizer, (), pad_to_max_length=False)
    wider = [
        group for group in groups if bucket(group)["input_ids"].shape[1] > eight(group)["input_ids"].shape[1]
    ]
    assert len(wider) >= 2, "batches padded wider than dynamic padding pads them are the case"
    for group in [*wider, groups[-1]]:  # and a batch of full windows, as wide either way
        bucket_loss, bucket_rows = _loss_and_real_logits(trainer, bucket(group))
        loss, rows = _loss_and_real_logits(trainer, eight(group))
        assert torch.isfinite(bucket_loss)
        torch.testing.assert_close(bucket_loss, loss, atol=1e-5, rtol=0)
        for (bucket_start, bucket_end), (start, end) in zip(bucket_rows, rows):
            torch.testing.assert_close(bucket_start, start, atol=1e-5, rtol=0)
            torch.testing.assert_close(bucket_end, end, atol=1e-5, rtol=0)


def test_evaluation_in_buckets_gives_the_same_answers(qa, tmp_path):
    """The Trainer's evaluation (longest first, then restored to dataset order) with buckets and with pad
    to 8: the same answers and n-best lists, scores to 1e-5."""
    files = {}
    for name, buckets in (("buckets", BUCKETS), ("pad8", ())):
        _trainer(qa, buckets, tmp_path / name).evaluate()
        files[name] = {
            kind: json.loads((tmp_path / name / f"eval_{kind}.json").read_text())
            for kind in ("predictions", "nbest_predictions")
        }
    assert files["buckets"]["predictions"] == files["pad8"]["predictions"]
    for qid, candidates in files["pad8"]["nbest_predictions"].items():
        got = files["buckets"]["nbest_predictions"][qid]
        assert [c["text"] for c in got] == [c["text"] for c in candidates]
        np.testing.assert_allclose([c["score"] for c in got], [c["score"] for c in candidates], atol=1e-5)


def test_a_tokenizer_that_pads_on_the_left_gets_every_row_padded_last(tokenizer):
    """Postprocessing masks each row's padding at its end (mask_padding), and the bucket loss cuts it there
    (span_loss): a tokenizer that pads on the left (XLNet) puts its context first, and its rows are padded
    last all the same, in the features (--pad_to_max_length) and in every collator; the tokenizer itself is
    left as it was."""
    from qa_hpc.features import FeatureConfig, prepare_validation_features

    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"
    examples = {
        "id": ["a", "b"],
        "question": ["Who?", "Where was the treaty of the two kingdoms signed?"],
        "context": ["Ann wrote it.", "The treaty was signed in Paris in 1783 by both kingdoms."],
    }

    def padded_last(masks) -> bool:
        return all(list(row) == sorted(row, reverse=True) for row in masks)

    features = prepare_validation_features(examples, left, FeatureConfig(64, 16, pad_to_max_length=True))
    assert padded_last(features["attention_mask"]) and 0 in features["attention_mask"][0]
    context = left("Ann wrote it.", add_special_tokens=False)["input_ids"]
    assert features["input_ids"][0][1 : 1 + len(context)] == context  # the context first
    unpadded = prepare_validation_features(examples, left, FeatureConfig(64, 16))
    rows = [{k: unpadded[k][i] for k in ("input_ids", "attention_mask", "token_type_ids")} for i in range(2)]
    for buckets in ((), (16, 32, 64)):
        batch = make_collator(left, buckets, pad_to_max_length=False)(rows)
        assert padded_last(batch["attention_mask"].tolist()) and 0 in batch["attention_mask"][0], buckets
    assert left.padding_side == "left"


def test_the_span_loss_ignores_an_answer_past_the_width_and_counts_the_last_position():
    """As BertForQuestionAnswering's loss: a start or end at or past the row's width is ignored in its own
    cross-entropy (the mean of the others), one at the last position counts; the logits past `width` (a
    bucket's extra padding) take no share of the softmax."""
    torch.manual_seed(0)
    start, end = torch.randn(3, 12), torch.randn(3, 12)
    width = 8
    starts, ends = torch.tensor([2, 7, 30]), torch.tensor([7, 9, 3])  # row 2's start, row 1's end: past 8
    log_start, log_end = start[:, :width].log_softmax(-1), end[:, :width].log_softmax(-1)
    start_loss = -(log_start[0, 2] + log_start[1, 7]) / 2
    end_loss = -(log_end[0, 7] + log_end[2, 3]) / 2
    loss = span_loss(start, end, starts, ends, width)
    assert torch.allclose(loss, (start_loss + end_loss) / 2, atol=1e-6)
