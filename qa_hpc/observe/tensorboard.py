"""TensorBoard: transformers' TensorBoardCallback plus speed, padding, GPU memory and the run's totals
(README lists the tags). Whole-run figures go under train_total/ and predict/, not into the train/ curves.
One event file per launch: the writer stays open after training, and the run's totals close it. Real tokens
are summed on the device (no host sync per step) and reduced across ranks once per logging step, where the
Trainer syncs anyway.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

import torch
from accelerate.utils import reduce
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summary
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback

from qa_hpc.observe.memory import MB

logger = logging.getLogger(__name__)

# whole-run logs the parent would mix into the train/ curves: (key that marks them, tag folder, key prefix)
OWN_LOGS = (("train_runtime", "train_total/", "train_"), ("predict_runtime", "predict/", "predict_"))
GPU_MEMORY = {
    "allocated": torch.cuda.memory_allocated,
    "reserved": torch.cuda.memory_reserved,
    "peak_allocated": torch.cuda.max_memory_allocated,
}


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TensorBoard(TensorBoardCallback):
    """Rank 0 writes; every rank counts the samples, fed tokens (host ints: shapes need no sync) and real
    tokens (on the device) of training, and joins their reduction at each logging step."""

    def __init__(self, log_dir: str, on_gpu: bool) -> None:
        """on_gpu: the run's device is a GPU (not merely one the node has: --use_cpu), whose memory each
        interval logs."""
        super().__init__()
        self.on_gpu = on_gpu
        # set here also for an evaluation-only run, which never calls on_train_begin
        self.logging_dir = log_dir
        logger.info("TENSORBOARD_DIR=%s", log_dir)
        self.samples = 0
        self.tokens = 0
        self.real: int | torch.Tensor = 0
        self._restart(0)

    def count_batch(self, inputs: Mapping[str, object]) -> None:
        """One training micro-batch, counted by the Trainer's training step, outside the model: a hook on the
        model would be traced into a compiled model's graphs, its counts baked in (a recompile per step) and
        its running sum an output of one CUDA graph fed to the next."""
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        self.samples += ids.shape[0]
        self.tokens += ids.numel()
        self.real = self.real + (mask.sum() if isinstance(mask, torch.Tensor) else ids.numel())

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        **kwargs: object,
    ) -> None:
        self._restart(state.global_step)
        super().on_train_begin(args, state, control, model=model, **kwargs)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.last_step_end = time.perf_counter()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, object] | None = None,
        **kwargs: object,
    ) -> None:
        logs = dict(logs or {})
        if "loss" in logs and "learning_rate" in logs:
            # a collective: every rank gets here
            logs.update(self._interval(args, state))
        else:
            # the Trainer adds it to every log; it is a train/ curve already
            logs.pop("epoch", None)
        if not state.is_world_process_zero:
            return
        own = next(((folder, prefix) for marker, folder, prefix in OWN_LOGS if marker in logs), None)
        if own is None:
            # as train/<key>, eval/<key>
            return super().on_log(args, state, control, logs=logs, **kwargs)
        self.write_scalars(
            {own[0] + key.removeprefix(own[1]): value for key, value in logs.items()}, state.global_step
        )
        self.tb_writer.flush()

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        # evaluation is not step time: it ran after the last step ended (and after the logging step, if any)
        now = time.perf_counter()
        self.left_out += now - self.last_step_end
        self.last_step_end = now

    # nor is checkpointing
    on_save = on_evaluate

    def _restart(self, step: int) -> None:
        """A new interval from now, at this global step."""
        self.interval_start = time.perf_counter()
        self.interval_step = step
        # when the last training step (or logging step) ended, and the seconds evaluations and checkpoints
        # took since the interval began: left out of its time, wherever in the interval they came
        self.last_step_end = self.interval_start
        self.left_out = 0.0

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        """Nothing: the writer stays open for the evaluation after training (the parent closes it here)."""

    def _interval(self, args: TrainingArguments, state: TrainerState) -> dict[str, float]:
        """This interval's speed, padding and memory, under keys the parent files as train/<key>."""
        counts = torch.stack(
            [torch.as_tensor(n, device=args.device) for n in (self.samples, self.tokens, self.real)]
        )
        self.samples = self.tokens = self.real = 0
        # a collective under DDP
        samples, tokens, real = (int(x) for x in reduce(counts, reduction="sum").tolist())
        elapsed = time.perf_counter() - self.interval_start - self.left_out
        steps = state.global_step - self.interval_step
        self._restart(state.global_step)
        values: dict[str, float] = {}
        if steps > 0 and elapsed > 0:
            values.update(
                step_time_seconds=elapsed / steps,
                samples_per_second=samples / elapsed,
                tokens_per_second=real / elapsed,
            )
        if tokens:
            values["real_token_fraction"] = real / tokens
        if self.on_gpu:
            index = torch.cuda.current_device()
            values.update({f"gpu_memory_{name}_mb": read(index) / MB for name, read in GPU_MEMORY.items()})
        return values

    def write_scalars(self, scalars: Mapping[str, object], step: int) -> None:
        # the writer TensorBoardCallback would open at its first log
        if self.tb_writer is None:
            self.tb_writer = SummaryWriter(log_dir=self.logging_dir)
        for tag, value in scalars.items():
            if _finite(value):
                self.tb_writer.add_scalar(tag, value, step)

    def write_totals(
        self, hparams: Mapping[str, float | str], metrics: Mapping[str, object], step: int
    ) -> None:
        """The run's totals: the HPARAMS tab (metrics as hparam/* scalars) and a run_summary text; closes.
        Rank 0."""
        numbers = {f"hparam/{k}": float(v) for k, v in metrics.items() if _finite(v)}
        self.write_scalars(numbers, step)
        # into this event file, not add_hparams' subfolder: SummaryWriter has no public call for that
        # (qa_hpc/private_api.py lists file_writer)
        for summary in hparams_summary(dict(hparams), numbers):
            self.tb_writer.file_writer.add_summary(summary)
        rows = "\n".join(f"| {k} | {v} |" for k, v in {**hparams, **metrics}.items())
        self.tb_writer.add_text("run_summary", "| run total | value |\n|---|---|\n" + rows, step)
        self.tb_writer.close()
        self.tb_writer = None
