"""QuestionAnsweringTrainer: a Trainer whose evaluate() and predict() return answers and EM/F1.

The Trainer's loop gathers every feature's logits exactly once onto every rank; postprocessing and scoring run
on the main process alone and the metrics are broadcast, so every rank returns the same numbers."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from accelerate.utils import broadcast_object_list
from transformers import Trainer
from transformers.trainer_utils import PredictionOutput, speed_metrics

from qa_hpc.batching import LOSS_WIDTH, span_loss
from qa_hpc.compile import CompiledSteps
from qa_hpc.features import POSTPROCESS_COLUMNS, real_lengths
from qa_hpc.metric.squad import ScoreFunction
from qa_hpc.postprocess import QAPredictions, mask_padding, refuse_non_finite

# (examples, features, (start_logits, end_logits), stage) -> answers; writes prediction files
PostProcessFunction = Callable[[Any, Any, tuple[np.ndarray, np.ndarray], str], QAPredictions]


def length_order(dataset: Any) -> np.ndarray | None:
    """Indices that sort features longest first (a too-large eval batch fails at once, and batches of similar
    length waste little padding), or None when all have one length. The lengths from the attention masks'
    Arrow column, as the logits are masked: the input ids as Python lists took 111 ms against 8 for 10,784
    features of 60 to 384 tokens on the 2-core EPYC (AMD family 25 model 17)."""
    if "attention_mask" not in dataset.column_names or len(dataset) == 0:
        return None
    lengths = real_lengths(dataset)
    return None if lengths.min() == lengths.max() else longest_first(lengths)


def longest_first(lengths: np.ndarray) -> np.ndarray:
    """The indices of `lengths` longest first, ties in their order (the evaluation batches' order)."""
    return np.argsort(-lengths, kind="stable")


class QuestionAnsweringTrainer(Trainer):
    """Trainer for extractive QA: logits -> answers -> EM/F1, safe under DDP."""

    def __init__(
        self,
        *args: Any,
        eval_examples: Any = None,
        post_process_function: PostProcessFunction | None = None,
        score_function: ScoreFunction | None = None,
        sort_eval_by_length: bool = True,
        compiled_steps: CompiledSteps | None = None,
        loss_filter: bool = False,
        **kwargs: Any,
    ) -> None:
        """loss_filter: --logging_nan_inf_filter's rule, applied on the device (give the Trainer's args
        logging_nan_inf_filter=False, as the plan does, so that its own check does not also run)."""
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_process_function = post_process_function
        # in place of compute_metrics, which stays None: the loop never scores
        self.score_function = score_function
        self.sort_eval_by_length = sort_eval_by_length
        self.compiled_steps = compiled_steps or CompiledSteps(torch_compile=False, cuda_graphs=False)
        self.loss_filter = loss_filter
        self.counted_parameters: int | None = None  # floating_point_ops' count, made once
        # the callbacks that count training batches (TensorBoard's speed and padding figures)
        self.batch_counters = [cb for cb in self.callback_handler.callbacks if hasattr(cb, "count_batch")]

    def training_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        self.compiled_steps.begin(model, inputs, training=True)
        for counter in self.batch_counters:
            counter.count_batch(inputs)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not self.loss_filter:
            return loss
        # transformers' rule for --logging_nan_inf_filter: a non-finite step loss counts as the mean of the
        # logging interval so far. Its own check bool()s the loss, so on a GPU the host would wait for every
        # step to finish before queueing the next; torch.where keeps the same rule on the device.
        steps = 1 + self.state.global_step - self._globalstep_last_logged
        return torch.where(torch.isfinite(loss), loss, self._tr_loss / steps)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """transformers' estimate, 6 x fed tokens x non-embedding parameters, the parameters counted once: the
        parent counts them at every step, a walk over the model's modules (~0.5 ms of host time for
        bert-base)."""
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        if self.counted_parameters is None:
            self.counted_parameters = self.model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main_input].numel() * self.counted_parameters

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        self.compiled_steps.begin(model, inputs, training=False)
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        return self.compiled_steps.own(model, loss), self.compiled_steps.own(model, logits), labels

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """The model's own loss; for a batch padded to a bucket (it carries LOSS_WIDTH), the same loss over
        the positions dynamic padding would have given it (qa_hpc.batching.span_loss)."""
        width = inputs.pop(LOSS_WIDTH, None)
        if width is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        start_positions = inputs.pop("start_positions")
        end_positions = inputs.pop("end_positions")
        outputs = model(**inputs)
        loss = span_loss(outputs.start_logits, outputs.end_logits, start_positions, end_positions, width)
        return (loss, outputs) if return_outputs else loss

    def _get_eval_sampler(self, eval_dataset: Any) -> torch.utils.data.Sampler | None:
        """Keep evaluation in dataset order: transformers 5.23 hands evaluation a shuffled
        LengthGroupedSampler with group_by_length, and every answer would be read from another feature's
        logits (length_order sorts instead, in a known order). In DDP, None lets accelerate shard the
        sequential order and gather_for_metrics restore it."""
        if eval_dataset is None or self.args.world_size > 1:
            return None
        return torch.utils.data.SequentialSampler(eval_dataset)

    def _gather_logits(
        self, dataset: Any, description: str, ignore_keys: list[str] | None, prefix: str
    ) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, float], int]:
        """Run the model over `dataset` (length-sorted if asked) and return logits in dataset order."""
        order = length_order(dataset) if self.sort_eval_by_length else None
        inputs = dataset.select(order) if order is not None else dataset
        # the model's inputs alone: the Trainer leaves the postprocessing columns in with
        # --remove_unused_columns false, and the collator cannot batch them
        inputs = inputs.remove_columns([c for c in POSTPROCESS_COLUMNS if c in inputs.column_names])
        # the test loader, never cached: with persistent workers the Trainer keeps one evaluation loader and
        # hands it out again whatever dataset is asked for (prediction would read the eval split)
        dataloader = self.get_test_dataloader(inputs)
        output = self.evaluation_loop(
            dataloader,
            description=description,
            prediction_loss_only=False,
            ignore_keys=ignore_keys,
            metric_key_prefix=prefix,
        )
        start_logits, end_logits = output.predictions[:2]
        if len(start_logits) != len(dataset):
            raise RuntimeError(
                f"{description}: gathered {len(start_logits)} logit rows for {len(dataset)} features; "
                "a feature was lost or duplicated across ranks"
            )
        if order is not None:
            inverse = np.argsort(order)  # the sorted rows back in dataset order
            start_logits, end_logits = start_logits[inverse], end_logits[inverse]
        return (start_logits, end_logits), dict(output.metrics), output.num_samples

    def _answer(
        self, dataset: Any, examples: Any, ignore_keys: list[str] | None, prefix: str, stage: str
    ) -> tuple[QAPredictions | None, dict[str, float]]:
        """The body of evaluate() and predict(): logits -> answers and EM/F1 on the main process, the metrics
        every rank returns; logged, with the callbacks' on_evaluate or on_predict and the Trainer's memory
        metrics."""
        self._memory_tracker.start()
        start = time.time()
        description = "Evaluation" if stage == "eval" else "Prediction"
        logits, loop_metrics, num_samples = self._gather_logits(dataset, description, ignore_keys, prefix)
        # Every rank holds every logit, so each refuses a diverged model's at once (none is left waiting for
        # the main process in the broadcast below); only the positions postprocessing reads count.
        refuse_non_finite(mask_padding(logits, real_lengths(dataset)), f"{stage} logits")
        metrics: dict[str, float] = {}
        preds: QAPredictions | None = None
        if self.is_world_process_zero() and self.post_process_function is not None:
            t0 = time.perf_counter()
            preds = self.post_process_function(examples, dataset, logits, stage)
            metrics[f"{prefix}_postprocess_seconds"] = round(time.perf_counter() - t0, 4)
            # a test set may have no answers to score against
            if self.score_function is not None and "answers" in examples.column_names:
                scores = self.score_function(preds, examples)
                metrics.update({f"{prefix}_{k}": v for k, v in scores.items()})
        metrics = broadcast_object_list([metrics])[0]  # the main process's, on every rank
        # speed over the whole evaluation, postprocessing included (what users wait for), with the loop's
        # model preparation time and loss (when not NaN)
        total_batch = self.args.eval_batch_size * self.args.world_size
        num_steps = math.ceil(num_samples / total_batch)
        metrics.update(speed_metrics(prefix, start, num_samples=num_samples, num_steps=num_steps))
        passed_on = (f"{prefix}_model_preparation_time", f"{prefix}_loss")
        metrics.update({k: v for k, v in loop_metrics.items() if k in passed_on and not math.isnan(v)})
        metrics[f"{prefix}_examples"] = len(examples)
        self.log(metrics)
        callback = self.callback_handler.on_evaluate if stage == "eval" else self.callback_handler.on_predict
        self.control = callback(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return preds, metrics

    def evaluate(
        self,
        eval_dataset: Any = None,
        eval_examples: Any = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        """Logits over the eval features -> answers -> EM/F1, logged with the `eval_` prefix."""
        return self._answer(
            self.eval_dataset if eval_dataset is None else eval_dataset,
            self.eval_examples if eval_examples is None else eval_examples,
            ignore_keys,
            metric_key_prefix,
            "eval",
        )[1]

    def predict(
        self,
        predict_dataset: Any,
        predict_examples: Any,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "predict",
    ) -> PredictionOutput:
        """Answers for a test set; scored too when the examples carry answers."""
        preds, metrics = self._answer(
            predict_dataset, predict_examples, ignore_keys, metric_key_prefix, "predict"
        )
        return PredictionOutput(predictions=preds.answers if preds else None, label_ids=None, metrics=metrics)
