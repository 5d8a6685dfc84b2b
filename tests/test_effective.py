"""What runs is what the log says: the settings read back from the objects that do the work equal the plan.

- every difference between the plan and what the Trainer, the accelerator, the model and torch really
  use is named, and stops the run;
- the TrainingArguments the Trainer gets are the parsed ones plus the plan's declared fields, nothing
  else, and stay so to the end of a run (training_args.bin, written at the end, is compared);
- a model saved in fp16 still trains with fp32 master weights (transformers 5 loads dtype="auto").
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fixtures.runqa import run_qa, tiny_flags
from fixtures.settings import plan_and_flags
from qa_hpc.settings.effective import Effective, SettingsMismatch, check_effective, differences


def _effective(**changes) -> Effective:
    base = Effective(precision="fp32", tf32=False, param_dtype="float32", threads=2, dataloader_num_workers=0,
                     world_size=1, device="cpu", device_name="cpu", optim="adamw_torch_fused",
                     attn_implementation="sdpa", torch_compile=False, postprocess="vectorized")
    return dataclasses.replace(base, **changes)


def test_every_difference_is_named_and_stops_the_run(tmp_path):
    plan, _ = plan_and_flags(["--output_dir", str(tmp_path), "--num_threads", "2", "--report_to", "none"])
    check_effective(plan, _effective())  # equal: no error
    wrong = _effective(precision="bf16", param_dtype="float16", threads=8)
    assert differences(plan, wrong) == [
        "precision: planned fp32, effective bf16",
        "param_dtype: planned float32, effective float16",
        "threads: planned 2, effective 8",
    ]
    with pytest.raises(SettingsMismatch, match="precision: planned fp32, effective bf16"):
        check_effective(plan, wrong)


def _expected_training_args(argv: list[str]) -> dict:
    """The parsed TrainingArguments (no plan) with the plan's declared fields put in: what the Trainer must get."""
    plan, _ = plan_and_flags(argv)
    from qa_hpc.settings.apply import build_flags, read_flags

    values = read_flags(argv)
    expected = build_flags(values, {}).training.to_dict()
    fields = plan.training_fields(values["tf32"])
    expected.update(fields)
    if fields["use_cpu"]:  # TrainingArguments itself turns pinned memory off on the CPU
        expected["dataloader_pin_memory"] = False
    return expected


def test_training_args_given_to_the_trainer_are_the_parsed_ones_plus_the_plan(tiny_bert, demo_files, tmp_path):
    """Built and read back in process: the settings path of run_qa.setup, the Trainer, the effective settings."""
    import run_qa

    out = tmp_path / "out"
    argv = [*tiny_flags(tiny_bert, out), "--do_train", "--train_file", str(demo_files["train"]), "--max_steps", "1",
            "--num_threads", "1"]
    plan, flags = plan_and_flags(argv)
    from qa_hpc.reliability.preemption import StopRequest

    threads = torch.get_num_threads()
    try:
        run = run_qa.setup(flags, plan, StopRequest())
        assert run.effective.threads == torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert run.trainer.args is flags.training
    assert run.trainer.args.to_dict() == _expected_training_args(argv)
    assert differences(plan, run.effective) == []
