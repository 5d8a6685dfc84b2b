"""The training step of QuestionAnsweringTrainer, in this process: --logging_nan_inf_filter's rule kept on the
device gives the losses transformers' own check logs, and between logging steps nothing in the Trainer's
loop waits for the device (each wait would stall a GPU's queue every step); the one wait of the eager model
is gone from a compiled forward; the FLOP estimate is transformers'. A tiny fp32 BERT on features of
generated SQuAD data; one step's loss made NaN while its gradients stay finite."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers.masking_utils
from fixtures.features import demo_features
from transformers import AutoModelForQuestionAnswering, Trainer, TrainerCallback

from qa_hpc.flags import QATrainingArguments
from trainer_qa import QuestionAnsweringTrainer

STEPS = 8
LOGGING_STEPS = 4
NAN_STEP = 2  # the optimizer step (0-based) whose loss is NaN
# the tensor calls that copy a value to the host: on a GPU each waits for the queued work to finish
WAITS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")
# the eager model's one wait per forward, its check for a batch without padding (compiled graphs skip it)
MODEL_MASK_CHECK = str(Path(transformers.masking_utils.__file__))


class NanLossAt(QuestionAnsweringTrainer):
    """NAN_STEP's loss is NaN in value only: its gradients, and so every later step, are the plain run's."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step == NAN_STEP and not return_outputs:
            loss = loss + torch.tensor(float("nan"))
        return loss


class WaitsPerStep(TrainerCallback):
    """The waits from one optimizer step's end to the next's (the loop's logging and saving, the next batch,
    the step: the Trainer, its callbacks, QuestionAnsweringTrainer), but the eager model's mask check."""

    def __init__(self, waits: Counter) -> None:
        self.waits = waits
        self.per_step: list[int] = []
        self.at_last_end = 0

    def count(self) -> int:
        return sum(n for caller, n in self.waits.items() if caller != MODEL_MASK_CHECK)

    def on_train_begin(self, args, state, control, **kwargs):
        self.at_last_end = self.count()

    def on_step_end(self, args, state, control, **kwargs):
        now = self.count()
        self.per_step.append(now - self.at_last_end)
        self.at_last_end = now


@pytest.fixture(scope="module")
def qa(tiny_bert, demo_files, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("training_step")
    tokenizer, data, _ = demo_features(tiny_bert, {"train": demo_files["train"]}, tmp, 128)
    return tiny_bert, tokenizer, data.train, tmp


def counting_waits(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """From now on (until monkeypatch.undo()), each call of WAITS on a tensor, counted by the calling file."""
    waits: Counter = Counter()
    for name in WAITS:
        original = getattr(torch.Tensor, name)

        def counted(tensor, *args, _original=original, **kwargs):
            waits[sys._getframe(1).f_code.co_filename] += 1
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return waits


def train(qa, monkeypatch, host_filter: bool, device_filter: bool) -> tuple[list[float], list[int]]:
    """(the logged losses, the Trainer loop's waits in each step) of one run."""
    tiny_bert, tokenizer, train_set, tmp = qa
    per_step = WaitsPerStep(counting_waits(monkeypatch))
    args = QATrainingArguments(
        output_dir=str(tmp / f"out_{host_filter}_{device_filter}"),
        do_train=True,
        use_cpu=True,
        report_to="none",
        max_steps=STEPS,
        logging_steps=LOGGING_STEPS,
        per_device_train_batch_size=4,
        save_strategy="no",
        disable_tqdm=True,
        logging_nan_inf_filter=host_filter,
        seed=7,
    )
    trainer = NanLossAt(
        model=AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert)),
        args=args,
        train_dataset=train_set,
        processing_class=tokenizer,
        loss_filter=device_filter,
        callbacks=[per_step],
    )
    trainer.train()
    monkeypatch.undo()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, per_step.per_step


def test_the_device_filter_logs_the_losses_of_transformers_filter_without_a_wait_per_step(qa, monkeypatch):
    host_losses, host_waits = train(qa, monkeypatch, host_filter=True, device_filter=False)
    device_losses, device_waits = train(qa, monkeypatch, host_filter=False, device_filter=True)
    unfiltered_losses, _ = train(qa, monkeypatch, host_filter=False, device_filter=False)
    assert len(host_losses) == STEPS // LOGGING_STEPS
    assert all(math.isfinite(loss) for loss in host_losses), host_losses
    assert device_losses == host_losses
    # unfiltered, the NaN stays in the Trainer's sum (it resets the sum by subtracting it): every log is NaN
    assert len(unfiltered_losses) == len(host_losses)
    assert all(math.isnan(loss) for loss in unfiltered_losses), unfiltered_losses
    # transformers' check: isnan(loss) or isinf(loss) each step (isinf not asked when the loss is NaN). Not
    # counted: the first step, which also holds the epoch's start (its sampler and loader, host tensors), and
    # a step after a logging step, which holds the log's waits
    regular = [step for step in range(1, STEPS) if step % LOGGING_STEPS]
    assert [host_waits[step] for step in regular] == [1 if step == NAN_STEP else 2 for step in regular]
    assert [device_waits[step] for step in regular] == [0] * len(regular)


def test_flops_are_transformers_estimate_with_the_parameters_counted_once(qa, monkeypatch):
    tiny_bert, tokenizer, _, tmp = qa
    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert))
    args = QATrainingArguments(output_dir=str(tmp / "flops"), use_cpu=True, report_to="none")
    trainer = QuestionAnsweringTrainer(model=model, args=args, processing_class=tokenizer)
    batches = [{"input_ids": torch.ones(4, width, dtype=torch.long)} for width in (48, 128, 48)]
    counts = []
    count_parameters = type(model).num_parameters

    def counted(self, *args, **kwargs):
        counts.append(kwargs)
        return count_parameters(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "num_parameters", counted)
    ours = [trainer.floating_point_ops(batch) for batch in batches]
    assert counts == [{"exclude_embeddings": True}]
    assert ours == [Trainer.floating_point_ops(trainer, batch) for batch in batches]
    assert len(counts) == 1 + len(batches)  # the parent counts them every time


def test_the_model_checks_its_mask_on_the_host_only_when_run_eagerly(qa, monkeypatch):
    """The one wait left in an eager step, transformers' check for a batch without padding, is traced away in
    a compiled forward (dynamo's eager backend: the same graph capture as inductor's, without its compile)."""
    tiny_bert, tokenizer, train_set, _ = qa
    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert)).eval()
    batch = tokenizer.pad([{"input_ids": ids} for ids in train_set[:4]["input_ids"]], return_tensors="pt")
    compiled = torch.compile(model, backend="eager", dynamic=False)
    compiled(**batch)  # the capture runs the Python code once
    waits = counting_waits(monkeypatch)
    model(**batch)
    eager = waits.pop(MODEL_MASK_CHECK, 0)
    compiled(**batch)
    assert (eager, waits[MODEL_MASK_CHECK]) == (1, 0), waits
