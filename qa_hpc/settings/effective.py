"""The settings a run really uses, read back from the objects that do the work, against the plan.

Read after the Trainer is built: the accelerator's mixed precision (what autocast runs in),
torch's fp32 matmul precision (TF32), the model's parameter dtype (the master weights),
torch's thread count, the Trainer's dataloader workers, the number of processes. One
EFFECTIVE line and run_summary.json carry them; a difference from the plan stops the run,
because a log that says bf16 over a run in fp32 is worse than no log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from qa_hpc.settings.devices import device_name
from qa_hpc.settings.plan import RunPlan

ACCELERATE_TO_OURS = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}


class SettingsMismatch(RuntimeError):
    """What runs is not what was planned (a bug: the message names every setting that differs)."""


@dataclass(frozen=True)
class Effective:
    precision: str
    tf32: bool
    param_dtype: str
    threads: int
    dataloader_num_workers: int
    world_size: int
    device: str
    device_name: str
    optim: str
    attn_implementation: str
    torch_compile: bool
    postprocess: str

    def log_line(self, rank: int) -> str:
        """One line per rank: threads and devices can differ between nodes."""
        return (
            f"EFFECTIVE rank={rank} precision={self.precision} tf32={'on' if self.tf32 else 'off'} "
            f"param_dtype={self.param_dtype} "
            f"threads={self.threads} dataloader_workers={self.dataloader_num_workers} world_size={self.world_size} "
            f"device={self.device} device_name={self.device_name.replace(' ', '_')} optim={self.optim} "
            f"attn={self.attn_implementation} torch_compile={self.torch_compile} postprocess={self.postprocess}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_effective(trainer: Any, postprocess: str) -> Effective:
    """What the Trainer, its accelerator, the model and torch are set to now."""
    device = trainer.args.device
    mixed = str(trainer.accelerator.mixed_precision)
    return Effective(
        precision=ACCELERATE_TO_OURS.get(mixed, mixed),
        tf32=torch.backends.cuda.matmul.fp32_precision == "tf32",
        param_dtype=str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
        threads=torch.get_num_threads(),
        dataloader_num_workers=int(trainer.args.dataloader_num_workers),
        world_size=int(trainer.accelerator.num_processes),
        device=device.type,
        device_name=device_name(device),
        optim=str(getattr(trainer.args.optim, "value", trainer.args.optim)),
        attn_implementation=str(getattr(trainer.model.config, "_attn_implementation", None) or "default"),
        torch_compile=bool(trainer.args.torch_compile),
        postprocess=postprocess,
    )


def differences(plan: RunPlan, effective: Effective) -> list[str]:
    """'name: planned X, effective Y' for every setting that differs (fp32 master weights always)."""
    wanted = {
        "precision": plan.precision,
        "tf32": plan.tf32,
        "param_dtype": "float32",
        "threads": plan.threads,
        "dataloader_num_workers": plan.dataloader_num_workers,
        "world_size": plan.world_size,
        "device": plan.device,
    }
    got = effective.to_dict()
    return [f"{key}: planned {value}, effective {got[key]}" for key, value in wanted.items() if got[key] != value]


def check_effective(plan: RunPlan, effective: Effective) -> None:
    diff = differences(plan, effective)
    if diff:
        raise SettingsMismatch("the run would not use the planned settings: " + "; ".join(diff))
