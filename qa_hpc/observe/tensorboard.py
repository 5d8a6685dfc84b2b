"""TensorBoard event files for a run: training curves, speed, memory, eval scores, run totals.

One writer per run, on rank 0 only, in <output_dir>/runs/<time>_<host>/ (the layout HF
uses), replacing HF's own TensorBoardCallback so nothing is logged twice. At every
logging step it writes

  train/loss, train/learning_rate, train/grad_norm, train/epoch
  train/step_time_seconds       wall time per optimizer step over the interval (evaluation and
                                checkpoint time left out), data loading included
  train/samples_per_second      features per second, all ranks together
  train/tokens_per_second       real (non-padding) tokens per second, all ranks together
  train/real_token_fraction     real tokens / tokens fed (how much of each batch is padding)
  train/gpu_memory_{allocated,reserved,peak_allocated}_mb   rank 0's device, on CUDA only

and after each evaluation eval/exact_match, eval/f1 (v2: eval/exact, ...) and the other
eval_ numbers; train_total/* holds trainer.train()'s whole-run figures (runtime, samples/s). At the end of the run `finish()` writes the run's totals as hparams (the
HPARAMS tab) and as a text summary.

Real tokens are counted from attention_mask in a forward pre-hook, summed on the device
(no host sync per step) and reduced across ranks once per logging step, where the
Trainer already synchronises to log the loss.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import torch
from transformers import TrainerCallback

from qa_hpc.dist import all_reduce_sum
from qa_hpc.observe.memory import MB

logger = logging.getLogger(__name__)



def default_tensorboard_dir(output_dir: str) -> str:
    """<output_dir>/runs/<Mon01_12-00-00>_<host>, as HF names it: one folder per launch (resumes included)."""
    stamp = _dt.datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join(output_dir, "runs", f"{stamp}_{socket.gethostname()}")


class TokenCounter:
    """Counts samples, fed tokens and real tokens of training forwards, on the model's device."""

    def __init__(self) -> None:
        self.samples: torch.Tensor | int = 0
        self.tokens: torch.Tensor | int = 0
        self.real_tokens: torch.Tensor | int = 0
        self.handle: Any = None

    def attach(self, model: torch.nn.Module) -> None:
        if self.handle is None:
            self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not module.training:
            return  # evaluation forwards are not training throughput
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not isinstance(ids, torch.Tensor):
            return
        mask = kwargs.get("attention_mask")
        self.samples = self.samples + ids.shape[0]
        self.tokens = self.tokens + ids.numel()
        real = mask.sum() if isinstance(mask, torch.Tensor) else ids.numel()
        self.real_tokens = self.real_tokens + real

    def take(self, device: torch.device) -> tuple[int, int, int]:
        """(samples, tokens, real tokens) since the last call, summed over ranks (collective under DDP)."""
        values = torch.zeros(3, dtype=torch.int64, device=device)
        for i, v in enumerate((self.samples, self.tokens, self.real_tokens)):
            values[i] += v.to(device) if isinstance(v, torch.Tensor) else int(v)
        self.samples = self.tokens = self.real_tokens = 0
        samples, tokens, real = (int(x) for x in all_reduce_sum(values).tolist())
        return samples, tokens, real


class TensorBoardCallback(TrainerCallback):
    """Rank 0 writes the scalars named in the module docstring; every rank counts tokens."""

    def __init__(self, log_dir: str, is_main: bool) -> None:
        self.log_dir = log_dir
        self.is_main = is_main
        self.writer: Any = None
        self.counter = TokenCounter()
        self.interval_start = time.perf_counter()
        self.interval_step = 0
        self.last_loss: float | None = None
        self.last_step = 0  # global step of the latest event, for the run totals

    # --- writer ---------------------------------------------------------------------------
    def _writer(self) -> Any:
        if self.writer is None and self.is_main:
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            self.writer = SummaryWriter(log_dir=self.log_dir)
            logger.info("TENSORBOARD_DIR=%s", self.log_dir)
        return self.writer

    def _scalars(self, values: Mapping[str, float], step: int) -> None:
        writer = self._writer()
        if writer is None:
            return
        for tag, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                writer.add_scalar(tag, value, step)
        writer.flush()  # readable while the run goes on, and after a crash

    # --- trainer events -------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None:
            self.counter.attach(model)
        self._restart_interval(state)
        if self.is_main:
            writer = self._writer()
            writer.add_text("args", "```\n" + args.to_json_string() + "\n```", state.global_step)
            if getattr(model, "config", None) is not None:
                writer.add_text("model_config", "```\n" + model.config.to_json_string() + "\n```", state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kw: Any) -> None:
        logs = logs or {}
        step = self.last_step = state.global_step
        if "loss" in logs and "learning_rate" in logs:
            self._train_interval(args, state, logs)
        elif any(k.startswith("eval_") for k in logs):
            self._scalars({f"eval/{k[len('eval_'):]}": v for k, v in logs.items() if k.startswith("eval_")}, step)
        elif "train_runtime" in logs:
            # whole-run figures of trainer.train(): kept apart from the per-interval train/ curves
            self._scalars({f"train_total/{k[len('train_'):]}": v for k, v in logs.items() if k.startswith("train_")},
                          step)
        elif any(k.startswith("predict_") for k in logs):
            self._scalars({f"predict/{k[len('predict_'):]}": v for k, v in logs.items() if k.startswith("predict_")},
                          step)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart_interval(state)  # evaluation time is not training step time

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart_interval(state)  # nor is checkpointing

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last_step = state.global_step
        self.counter.detach()
        if self.writer is not None:
            self.writer.flush()

    # --- helpers --------------------------------------------------------------------------
    def _restart_interval(self, state: Any) -> None:
        self.interval_start = time.perf_counter()
        self.interval_step = state.global_step

    def _train_interval(self, args: Any, state: Any, logs: Mapping[str, Any]) -> None:
        samples, tokens, real = self.counter.take(args.device)  # collective: every rank gets here
        elapsed = time.perf_counter() - self.interval_start
        steps = state.global_step - self.interval_step
        self._restart_interval(state)
        self.last_loss = float(logs["loss"])
        if not self.is_main:
            return
        values: dict[str, float] = {
            "train/loss": logs["loss"],
            "train/learning_rate": logs["learning_rate"],
        }
        if logs.get("grad_norm") is not None:
            values["train/grad_norm"] = float(logs["grad_norm"])
        if logs.get("epoch") is not None:
            values["train/epoch"] = float(logs["epoch"])
        if steps > 0 and elapsed > 0:
            values["train/step_time_seconds"] = elapsed / steps
            values["train/samples_per_second"] = samples / elapsed
            values["train/tokens_per_second"] = real / elapsed
        if tokens:
            values["train/real_token_fraction"] = real / tokens
        if torch.cuda.is_available():
            index = torch.cuda.current_device()
            values["train/gpu_memory_allocated_mb"] = torch.cuda.memory_allocated(index) / MB
            values["train/gpu_memory_reserved_mb"] = torch.cuda.memory_reserved(index) / MB
            values["train/gpu_memory_peak_allocated_mb"] = torch.cuda.max_memory_allocated(index) / MB
        self._scalars(values, state.global_step)

    def finish(self, hparams: Mapping[str, Any], metrics: Mapping[str, float], summary_md: str, step: int) -> None:
        """The run's totals: hparams (HPARAMS tab, metrics as hparam/* scalars) and a text summary. Rank 0."""
        writer = self._writer()
        if writer is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        clean_h = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in hparams.items()}
        clean_m = {
            f"hparam/{k}": float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        exp, ssi, sei = hparams_summary(clean_h, clean_m)
        file_writer = writer._get_file_writer()
        for summary in (exp, ssi, sei):
            file_writer.add_summary(summary)
        for tag, value in clean_m.items():
            writer.add_scalar(tag, value, step)
        writer.add_text("run_summary", summary_md, step)
        writer.flush()

    def close(self) -> None:
        self.counter.detach()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
