"""TensorBoard: transformers' TensorBoardCallback plus speed, padding, GPU memory and the run's totals.

The parent writes the Trainer's logs on rank 0 (train/loss, train/learning_rate, train/grad_norm,
train/epoch, eval/*). At every logging step this subclass adds train/step_time_seconds (wall time per
optimizer step, data loading included, evaluation and checkpoints left out), train/samples_per_second
and train/tokens_per_second (real tokens; all ranks together), train/real_token_fraction (real / fed:
the padding) and, on CUDA, train/gpu_memory_{allocated,reserved,peak_allocated}_mb of rank 0. It files
trainer.train()'s whole-run figures under train_total/ and predict's under predict/ (the parent would
mix them into the train/ curves), keeps one event file per launch (the parent closes its writer when
training ends and would open a second one for the evaluation), and writes the run's totals at the end.

Real tokens are counted from attention_mask in a forward pre-hook, summed on the device (no host
sync per step) and reduced across ranks once per logging step, where the Trainer already syncs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

import torch
from accelerate.utils import reduce
from torch.utils.hooks import RemovableHandle
from torch.utils.tensorboard.summary import hparams as hparams_summary
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback

from qa_hpc.observe.memory import MB

logger = logging.getLogger(__name__)

# whole-run logs the parent would mix into the train/ curves: (key that marks them, tag folder, key prefix)
OWN_LOGS = (("train_runtime", "train_total/", "train_"), ("predict_runtime", "predict/", "predict_"))
Scalar = int | float


class TokenCounter:
    """Counts samples, fed tokens and real tokens of training forwards."""

    def __init__(self) -> None:
        self.samples = self.tokens = 0  # host ints: shapes are known without a sync
        self.real: torch.Tensor | int = 0  # summed on the model's device: no host sync per step
        self.handle: RemovableHandle | None = None

    def attach(self, model: torch.nn.Module) -> None:
        if self.handle is None:
            self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not module.training or not isinstance(ids, torch.Tensor):
            return  # evaluation forwards are not training throughput
        mask = kwargs.get("attention_mask")
        self.samples += ids.shape[0]
        self.tokens += ids.numel()
        self.real = self.real + (mask.sum() if isinstance(mask, torch.Tensor) else ids.numel())

    def take(self, device: torch.device) -> tuple[int, int, int]:
        """(samples, tokens, real tokens) since the last call, summed over ranks (a collective under DDP)."""
        counts = torch.tensor([self.samples, self.tokens, 0], dtype=torch.int64, device=device)
        counts[2] += self.real.to(device) if isinstance(self.real, torch.Tensor) else self.real
        self.samples = self.tokens = self.real = 0
        samples, tokens, real = (int(x) for x in reduce(counts, reduction="sum").tolist())
        return samples, tokens, real


class TensorBoard(TensorBoardCallback):
    """Rank 0 writes; every rank counts tokens and joins the reduction at each logging step."""

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self.logging_dir = log_dir  # also for an evaluation-only run, which never calls on_train_begin
        self.counter = TokenCounter()
        self.interval_start, self.interval_step = time.perf_counter(), 0

    def _init_summary_writer(self, args: TrainingArguments | None) -> None:
        super()._init_summary_writer(args)
        logger.info("TENSORBOARD_DIR=%s", self.logging_dir)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, **kwargs: object) -> None:
        if model is not None:
            self.counter.attach(model)
        self._restart_interval(state)
        super().on_train_begin(args, state, control, model=model, **kwargs)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Mapping[str, object] | None = None, **kwargs: object) -> None:
        logs = dict(logs or {})
        if "loss" in logs and "learning_rate" in logs:
            logs.update(self._interval(args, state))  # a collective: every rank gets here
        else:
            logs.pop("epoch", None)  # the Trainer adds it to every log; it is a train/ curve already
        if not state.is_world_process_zero:
            return
        for marker, folder, prefix in OWN_LOGS:
            if marker in logs:
                for key, value in logs.items():
                    self._scalar(folder + key.removeprefix(prefix), value, state.global_step)
                self.tb_writer.flush()
                return
        super().on_log(args, state, control, logs=logs, **kwargs)  # train/<key>, eval/<key>

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: object) -> None:
        self._restart_interval(state)  # evaluation time is not training step time

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object) -> None:
        self._restart_interval(state)  # nor is checkpointing

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: object) -> None:
        self.counter.detach()  # the writer stays open for the evaluation after training: one event file

    def _restart_interval(self, state: TrainerState) -> None:
        self.interval_start, self.interval_step = time.perf_counter(), state.global_step

    def _interval(self, args: TrainingArguments, state: TrainerState) -> dict[str, Scalar]:
        """This interval's speed, padding and memory, under keys the parent files as train/<key>."""
        samples, tokens, real = self.counter.take(args.device)
        elapsed, steps = time.perf_counter() - self.interval_start, state.global_step - self.interval_step
        self._restart_interval(state)
        values: dict[str, Scalar] = {}
        if steps > 0 and elapsed > 0:
            values.update(step_time_seconds=elapsed / steps, samples_per_second=samples / elapsed,
                          tokens_per_second=real / elapsed)
        if tokens:
            values["real_token_fraction"] = real / tokens
        if torch.cuda.is_available():
            index = torch.cuda.current_device()
            values.update(gpu_memory_allocated_mb=torch.cuda.memory_allocated(index) / MB,
                          gpu_memory_reserved_mb=torch.cuda.memory_reserved(index) / MB,
                          gpu_memory_peak_allocated_mb=torch.cuda.max_memory_allocated(index) / MB)
        return values

    def _scalar(self, tag: str, value: object, step: int) -> None:
        if self.tb_writer is None:
            self._init_summary_writer(None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            self.tb_writer.add_scalar(tag, value, step)

    def write_totals(self, hparams: Mapping[str, Scalar | str], metrics: Mapping[str, object], step: int) -> None:
        """The run's totals: the HPARAMS tab (metrics as hparam/* scalars) and a run_summary text; closes. Rank 0."""
        numbers = {f"hparam/{k}": float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        for tag, value in numbers.items():
            self._scalar(tag, value, step)
        for summary in hparams_summary(dict(hparams), numbers):  # into this event file: not add_hparams' subfolder
            self.tb_writer._get_file_writer().add_summary(summary)
        rows = "\n".join(f"| {k} | {v} |" for k, v in {**hparams, **metrics}.items())
        self.tb_writer.add_text("run_summary", "| run total | value |\n|---|---|\n" + rows, step)
        self.tb_writer.close()
        self.tb_writer = None
