"""Features: dynamic padding and length-ordered evaluation change no answer; datasets' cache serves them again.

- train batches are padded to their own longest feature, a multiple of 8, so widths differ; with
  --pad_to_max_length every batch is max_seq_length wide (the HF behaviour); the TOKENS line counts both;
- evaluating longest-first and restoring the order gives the same answers and logits as in dataset order;
- a second build with the same file, tokenizer and settings reuses the cached features; a change recomputes.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import DataCollatorWithPadding, default_data_collator

from qa_hpc.features import build_data
from qa_hpc.flags import DataTrainingArguments, ModelArguments, QATrainingArguments
from qa_hpc.metric.squad import make_score
from qa_hpc.model import load_config, load_model, load_tokenizer
from qa_hpc.postprocess import make_postprocess
from trainer_qa import QuestionAnsweringTrainer, length_order


def _build(tiny_bert, files, tmp_path, caplog, padding_side: str = "right", strategy: str = "random", **data):
    """build_data on ``files`` with a tiny BERT; the log lines it wrote, keyed by their first word."""
    model_args = ModelArguments(model_name_or_path=str(tiny_bert))
    data_args = DataTrainingArguments(**{"train_file": str(files["train"]), "validation_file": str(files["validation"]),
                                         "max_seq_length": 128, "doc_stride": 32,
                                         "features_cache_dir": str(tmp_path / "cache"), **data})
    training_args = QATrainingArguments(output_dir=str(tmp_path / "out"), do_train=True, do_eval=True, use_cpu=True,
                                        per_device_train_batch_size=8, per_device_eval_batch_size=8, report_to="none",
                                        train_sampling_strategy=strategy)
    tokenizer = load_tokenizer(model_args)
    tokenizer.padding_side = padding_side  # "left": context first, so other features
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qa_hpc.features"):
        data = build_data(model_args, data_args, training_args, tokenizer)
    lines: dict[str, list[list[str]]] = {}
    for record in caplog.records:
        words = record.getMessage().split() or [""]
        lines.setdefault(words[0], []).append(words[1:])
    return SimpleNamespace(model_args=model_args, data_args=data_args, training_args=training_args,
                           tokenizer=tokenizer, data=data, lines=lines)


def _trainer(b: SimpleNamespace, sort_eval: bool, model=None) -> QuestionAnsweringTrainer:
    pad = b.data_args.pad_to_max_length
    return QuestionAnsweringTrainer(
        model=model or load_model(b.model_args, load_config(b.model_args)), args=b.training_args,
        train_dataset=b.data.train, eval_dataset=b.data.eval_features, eval_examples=b.data.eval_examples,
        processing_class=b.tokenizer, sort_eval_by_length=sort_eval,
        data_collator=default_data_collator if pad else DataCollatorWithPadding(b.tokenizer, pad_to_multiple_of=8),
        post_process_function=make_postprocess(b.data_args, b.training_args.output_dir),
        score_function=make_score(b.data_args.version_2_with_negative, b.data_args.null_score_diff_threshold))


@pytest.mark.parametrize("pad", [False, True], ids=["dynamic", "pad_to_max_length"])
def test_batch_widths_and_token_counts(tiny_bert, demo_files, tmp_path, caplog, pad):
    b = _build(tiny_bert, demo_files, tmp_path, caplog, pad_to_max_length=pad,
               strategy="random" if pad else "group_by_length")
    fields = dict(kv.split("=") for kv in next(w for w in b.lines["TOKENS"] if w[0] == "split=train"))
    real, at_max = sum(sum(m) for m in b.data.train["attention_mask"]), len(b.data.train) * 128
    assert (int(fields["real_tokens"]), int(fields["tokens_at_max_length"])) == (real, at_max) and real < at_max
    widths, seen = [], 0
    for batch in _trainer(b, not pad).get_train_dataloader():
        widths.append(batch["input_ids"].shape[1])
        longest = int(batch["attention_mask"].sum(dim=1).max())
        assert pad or longest <= widths[-1] < longest + 8, "padded to the batch's own longest feature"
        seen += int(batch["attention_mask"].sum())
    assert seen == real, "every real token reaches the model exactly once per epoch"
    if pad:
        assert set(widths) == {128}
    else:  # multiples of 8, and not all alike: padding is dynamic
        assert all(w % 8 == 0 for w in widths) and len(set(widths)) > 1 and max(widths) <= 128


def test_length_sorted_eval_restores_order(tiny_bert, demo_files, tmp_path, caplog):
    import torch

    b = _build(tiny_bert, demo_files, tmp_path, caplog, strategy="group_by_length")
    model = load_model(b.model_args, load_config(b.model_args))
    # a random tiny BERT gives nearly equal logits everywhere, so rounding noise would pick answers;
    # a larger QA head spreads them so that answers are decided by the model, not by the noise
    torch.manual_seed(0)
    with torch.no_grad():
        model.qa_outputs.weight.normal_(0.0, 5.0)
    order = length_order(b.data.eval_features)
    assert order is not None and not np.array_equal(order, np.arange(len(order))), "eval data must need sorting"
    outputs = {}
    for sort in (True, False):
        trainer = _trainer(b, sort, model)
        logits, _, _ = trainer._gather_logits(b.data.eval_features, "Evaluation", None, "eval")
        outputs[sort] = logits, trainer.post_process_function(b.data.eval_examples, b.data.eval_features, logits,
                                                              f"eval_sort{sort}")
    (ls, ps), (lu, pu) = outputs[True], outputs[False]
    assert ps.answers == pu.answers
    assert [[e["text"] for e in v] for v in ps.nbest.values()] == [[e["text"] for e in v] for v in pu.nbest.values()]
    for a, c in zip(ls, lu):
        real = (a > -100) & (c > -100)  # columns past a batch's width hold the Trainer's -100 padding
        np.testing.assert_allclose(a[real], c[real], rtol=1e-5, atol=1e-4)


def test_features_cache_reused_until_file_tokenizer_or_settings_change(tiny_bert, demo_files, tmp_path, caplog):
    files = {split: Path(shutil.copy(demo_files[split], tmp_path)) for split in ("train", "validation")}

    written: dict[str, int] = {}  # cache folder -> when its features file was written

    def cache(**changed) -> dict[str, str]:  # split -> reused|computed; features said reused are not written again
        b = _build(tiny_bert, files, tmp_path, caplog, **changed)
        assert len(b.data.train) > 0 and len(b.data.eval_features) > 0
        said = {}
        for words in b.lines["FEATURES_CACHE"]:
            split, how, folder = words[0].removeprefix("split="), words[1], words[-1].removeprefix("path=")
            stamp = (Path(folder) / "features.arrow").stat().st_mtime_ns
            assert how == "computed" or written[folder] == stamp, f"{split} features said reused but were written"
            written[folder], said[split] = stamp, how
        return said

    computed, reused = {"train": "computed", "eval": "computed"}, {"train": "reused", "eval": "reused"}
    assert (cache(), cache(), cache(doc_stride=48)) == (computed, reused, computed)
    assert (cache(padding_side="left"), cache(overwrite_cache=True)) == (computed, computed)
    text = files["validation"].read_text(encoding="utf-8")
    files["validation"].write_text(text.replace("?", " ?", 1), encoding="utf-8")  # same size class, other bytes
    assert cache() == {"train": "reused", "eval": "computed"}
    assert cache(max_train_samples=5) == {"train": "computed", "eval": "reused"}
