"""What runs is what the log says: the settings read back from the objects that do the work equal the plan.
(The check itself and the arguments the Trainer gets, in process: tests/unit/test_plan.py.)

- every difference between the plan and what the Trainer, the accelerator, the model and torch really
  use is named, and stops the run;
- the TrainingArguments the Trainer gets are the parsed ones plus the plan's declared fields, nothing
  else, and stay so to the end of a run (training_args.bin, written at the end, is compared);
- a model saved in fp16 still trains with fp32 master weights (transformers 5 loads dtype="auto").
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from fixtures.runqa import run_qa, tiny_flags
from fixtures.settings import plan_and_flags


def _expected_training_args(argv: list[str]) -> dict:
    """The parsed TrainingArguments (no plan) with the plan's declared fields put in: what the Trainer must get."""
    plan, _ = plan_and_flags(argv)
    from qa_hpc.flags import build_flags, read_flags

    values = read_flags(argv)
    expected = build_flags(values, {}).training.to_dict()
    fields = plan.training_fields(values["tf32"])
    expected.update(fields)
    if fields["use_cpu"]:  # TrainingArguments itself turns pinned memory off on the CPU
        expected["dataloader_pin_memory"] = False
    return expected


def test_fp16_checkpoint_trains_with_fp32_weights_and_args_are_unchanged_at_the_end(tiny_bert, demo_files, tmp_path):
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    half = tmp_path / "half"
    AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert)).half().save_pretrained(half)
    AutoTokenizer.from_pretrained(str(tiny_bert)).save_pretrained(half)
    assert AutoModelForQuestionAnswering.from_pretrained(str(half)).dtype == torch.float16  # what "auto" would give
    out = tmp_path / "out"
    argv = [*tiny_flags(half, out), "--do_train", "--train_file", str(demo_files["train"]), "--max_steps", "2"]
    proc = run_qa(argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = re.search(r"^EFFECTIVE rank=0 .*$", proc.stdout, re.M).group(0)
    assert "param_dtype=float32" in line and "precision=fp32" in line
    # the arguments the Trainer saved at the end of the run are still the parsed ones plus the plan
    saved = torch.load(out / "training_args.bin", weights_only=False).to_dict()
    assert saved == _expected_training_args(argv)


def test_the_plan_and_what_ran_are_in_the_record(tiny_bert, demo_files, tmp_path):
    import json

    out = tmp_path / "out"
    proc = run_qa([*tiny_flags(tiny_bert, out), "--do_eval", "--validation_file", str(demo_files["validation"]),
                   "--max_eval_samples", "4"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((Path(out) / "run_summary.json").read_text())
    assert summary["plan"]["precision"] == summary["effective"]["precision"] == "fp32"
    assert summary["effective"]["param_dtype"] == "float32"
    assert summary["plan"]["threads"] == summary["effective"]["threads"]
    assert re.search(rf"run_qa: PLAN .* threads={summary['plan']['threads']} ", proc.stdout)
