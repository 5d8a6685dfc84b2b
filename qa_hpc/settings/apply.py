"""From flag values to a plan, and from the plan to the settings of the objects that do the work.

    values = read_flags(argv)                                   # values only, no dataclass built yet
    plan = decide(request_from(values), read_device_facts())    # qa_hpc.settings.plan: pure
    flags = build_flags(values, plan.training_fields(values["tf32"]))   # every dataclass built once
    apply_process_settings(plan)                                # torch threads

The TrainingArguments are built once, with the plan's fields (RunPlan.training_fields) in,
before the Trainer sees them; nothing changes them afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from transformers import HfArgumentParser

from qa_hpc.errors import UsageError
from qa_hpc.settings.flags import FLAG_GROUPS, Flags, QATrainingArguments
from qa_hpc.settings.plan import Request, RunPlan


def read_flags(argv: list[str]) -> dict[str, Any]:
    """Every flag's value (defaults filled in), from the command line or from one JSON file.

    Values only: no dataclass is built yet, so nothing (TrainingArguments sets up devices and
    process groups when built) happens before the plan is decided from them.
    """
    parser = HfArgumentParser(FLAG_GROUPS)
    if len(argv) == 1 and argv[0].endswith(".json"):
        return {**vars(parser.parse_args([])), **_json_flags(argv[0], parser)}
    values, unknown = parser.parse_known_args(argv)
    if unknown:
        raise UsageError(f"unknown arguments (not flags of run_qa.py): {' '.join(unknown)}")
    return vars(values)


def _json_flags(path: str, parser: HfArgumentParser) -> dict[str, Any]:
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UsageError(f"{path}: arguments file not found")
    try:
        with open(path, encoding="utf-8") as fh:
            given = json.load(fh)
    except (OSError, ValueError) as err:
        raise UsageError(f"{path}: not a readable JSON object of flags: {err}") from err
    if not isinstance(given, dict):
        raise UsageError(f"{path}: expected a JSON object of flags, got {type(given).__name__}")
    known = {action.dest for action in parser._actions}
    unknown = sorted(set(given) - known)
    if unknown:
        raise UsageError(f"{path}: unknown keys (not flags of run_qa.py): {', '.join(unknown)}")
    return given


def build_flags(values: Mapping[str, Any], training_fields: Mapping[str, Any]) -> Flags:
    """Each flag group built once from the values; the TrainingArguments with the plan's fields."""
    groups = []
    for cls in FLAG_GROUPS:
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        kwargs = {k: v for k, v in values.items() if k in names}
        if cls is QATrainingArguments:
            kwargs.update(training_fields)
        try:
            groups.append(cls(**kwargs))
        except ValueError as err:
            raise UsageError(str(err)) from err
    return Flags(*groups)


def report_targets(report_to: Any) -> tuple[str, ...]:
    """--report_to as a tuple of integration names ('none' -> none), as TrainingArguments reads it."""
    if report_to is None or report_to == "none" or report_to == ["none"]:
        return ()
    return (report_to,) if isinstance(report_to, str) else tuple(report_to)


def request_from(values: Mapping[str, Any]) -> Request:
    """What the user asked for, in the plan's terms."""
    return Request(
        precision=values["precision"],
        hf_bf16=bool(values["bf16"]),
        hf_fp16=bool(values["fp16"]),
        tf32=values["tf32"],
        dataloader_num_workers=int(values["dataloader_num_workers"]),
        num_threads=int(values["num_threads"]),
        speed_defaults=bool(values["speed_defaults"]),
        use_cpu=bool(values["use_cpu"]),
        report_to=report_targets(values["report_to"]),
        logging_dir=values["logging_dir"],
        output_dir=values["output_dir"],
        profile=bool(values["profile"]),
        profile_dir=values["profile_dir"],
    )


def apply_process_settings(plan: RunPlan) -> None:
    """Settings of this process that no TrainingArguments field carries."""
    torch.set_num_threads(plan.threads)
