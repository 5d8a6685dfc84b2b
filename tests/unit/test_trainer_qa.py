"""QuestionAnsweringTrainer: every feature's answer comes from that feature's own logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForQuestionAnswering, DataCollatorWithPadding

from qa_hpc.features import FeatureConfig, prepare_validation_features
from qa_hpc.flags import QATrainingArguments
from trainer_qa import QuestionAnsweringTrainer, length_order


@pytest.fixture(scope="module")
def eval_setup(tiny_bert, tokenizer, demo_files):
    import datasets

    from qa_hpc.squad_io import load_qa_records

    examples = datasets.Dataset.from_list(load_qa_records(demo_files["validation"], split="validation")[0])
    features = examples.map(prepare_validation_features, batched=True, remove_columns=examples.column_names,
                            fn_kwargs={"tokenizer": tokenizer, "cfg": FeatureConfig(128, 32)})
    return features, AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert)).eval()


# group_by_length: transformers hands eval a shuffled sampler unless the trainer keeps it sequential;
# sort_eval: the longest-first order must be undone after the gather
@pytest.mark.parametrize(("strategy", "sort_eval"), [("group_by_length", False), ("random", True)])
def test_gathered_logits_belong_to_their_feature(eval_setup, tokenizer, tmp_path, strategy, sort_eval):
    features, model = eval_setup
    args = QATrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=7, report_to="none",
                               train_sampling_strategy=strategy)
    trainer = QuestionAnsweringTrainer(model=model, args=args, eval_dataset=features, processing_class=tokenizer,
                                       sort_eval_by_length=sort_eval,
                                       data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8))
    (start, end), _, n = trainer._gather_logits(features, "Evaluation", None, "eval")
    assert n == len(features) == len(start)
    with torch.no_grad():  # one feature at a time, no padding, no Trainer: the ground truth
        for i, (ids, mask, types) in enumerate(zip(features["input_ids"], features["attention_mask"],
                                                   features["token_type_ids"])):
            out = model(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([mask]),
                        token_type_ids=torch.tensor([types]))
            np.testing.assert_allclose(start[i][: len(ids)], out.start_logits[0], atol=1e-4, err_msg=f"feature {i}")
            np.testing.assert_allclose(end[i][: len(ids)], out.end_logits[0], atol=1e-4, err_msg=f"feature {i}")


def test_length_order_is_longest_first_and_none_when_uniform():
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [[1] * 3, [1] * 9, [1] * 5, [1] * 9]})
    assert length_order(ds).tolist() == [1, 3, 2, 0]
    assert length_order(datasets.Dataset.from_dict({"input_ids": [[1] * 4, [1] * 4]})) is None
