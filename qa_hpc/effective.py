"""What a run really uses, read back from its Trainer, its accelerator, the model and torch once they are
built (`Effective`), and checked against its plan (qa_hpc.plan): a setting that did not take stops the run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch
from transformers import Trainer

from qa_hpc import attention
from qa_hpc.batching import buckets_of
from qa_hpc.dropout import BulkDropout
from qa_hpc.plan import ACCELERATE_PRECISION, LOG_NAMES, ON, RunPlan, records_cuda_graphs


def loss_filter(trainer: Trainer) -> str:
    """Where `trainer` leaves a non-finite step loss out of the logged mean: "host" (transformers' own check,
    which waits for every step's loss), "device" (QuestionAnsweringTrainer's), or "off"."""
    if trainer.args.logging_nan_inf_filter:
        return "host"
    return "device" if getattr(trainer, "loss_filter", False) else "off"


@dataclass(frozen=True)
class Effective:
    precision: str  # the accelerator's mixed precision: what autocast runs in
    tf32: bool
    param_dtype: str  # the master weights: float32 always
    threads: int
    dataloader_num_workers: int
    world_size: int
    device: str
    device_name: str
    optim: str
    attn_implementation: str
    torch_compile: bool
    dropout_mask: str
    pad_to_buckets: tuple[int, ...]
    attn_backend: str
    compile_backend: str | None
    compile_mode: str | None
    compile_dynamic: bool | None
    recompile_limit: int | None
    compile_scope: str | None
    compile_cache_dir: str | None
    cuda_graphs: bool
    persistent_workers: bool
    loss_filter: str

    @classmethod
    def read(cls, trainer: Trainer) -> Effective:
        """What the Trainer, its accelerator, the model and torch are set to now."""
        args = trainer.args
        mixed = str(trainer.accelerator.mixed_precision)
        if args.device.type == "cuda":
            device_name = torch.cuda.get_device_name(args.device)
        else:
            device_name = args.device.type
        attn_implementation = getattr(trainer.model.config, "_attn_implementation", None)
        bulk = any(isinstance(m, BulkDropout) for m in trainer.model.modules())
        compiled = bool(args.torch_compile)
        dynamo = trainer.accelerator.state.dynamo_plugin  # what accelerate passes to torch.compile
        backend = dynamo.backend.value.lower() if compiled else None
        mode = dynamo.mode if compiled else None
        return cls(
            precision=ACCELERATE_PRECISION.get(mixed, mixed),
            tf32=torch.backends.cuda.matmul.fp32_precision == "tf32",
            param_dtype=str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
            threads=torch.get_num_threads(),
            dataloader_num_workers=int(args.dataloader_num_workers),
            world_size=int(args.world_size),
            device=args.device.type,
            optim=str(args.optim.value),
            device_name=device_name,
            attn_implementation=str(attn_implementation or "default"),
            torch_compile=compiled,
            dropout_mask="bulk" if bulk else "torch",
            pad_to_buckets=buckets_of(trainer.data_collator),
            attn_backend=attention.enabled(attn_implementation),
            compile_backend=backend,
            compile_mode=mode,
            compile_dynamic=dynamo.dynamic if compiled else None,
            recompile_limit=torch.compiler.config.recompile_limit if compiled else None,
            compile_scope=("regions" if dynamo.use_regional_compilation else "model") if compiled else None,
            # torch's own variable, which its cache folder follows (made absolute when first used)
            compile_cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR") if compiled else None,
            cuda_graphs=records_cuda_graphs(backend, mode, args.device.type),
            persistent_workers=bool(args.dataloader_persistent_workers),
            loss_filter=loss_filter(trainer),
        )

    def log_line(self, rank: int) -> str:
        """One line per rank (threads and devices can differ between nodes): every field, in order."""
        shown = {
            **asdict(self),
            "tf32": ON[self.tf32],
            "device_name": self.device_name.replace(" ", "_"),
            "pad_to_buckets": ",".join(map(str, self.pad_to_buckets)) or "off",
            "cuda_graphs": ON[self.cuda_graphs],
        }
        return " ".join([f"EFFECTIVE rank={rank}", *(f"{LOG_NAMES.get(k, k)}={v}" for k, v in shown.items())])

    def check(self, plan: RunPlan) -> None:
        """Stop the run when it would not use the plan (fp32 master weights always), naming every
        difference; a field the plan leaves to the libraries (None) is not compared."""
        wanted = {**asdict(plan), "param_dtype": "float32"}  # the fields both have, by name
        diff = [
            f"{key}: planned {wanted[key]}, effective {got}"
            for key, got in asdict(self).items()
            if wanted.get(key) is not None and got != wanted[key]
        ]
        if diff:
            raise RuntimeError("the run would not use the planned settings: " + "; ".join(diff))
