"""bench/gpu_speed.py's records: one variant's figures from its probe (bench/gpu_speed_probe.py), its JSON
record, MiniLM's accuracy beside the eager reference, and the markdown table of a sitting with its ratios.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.gpu_smoke import TRAIN_FEATURES, steady_state

BASELINE = "ours_today"  # the ratio columns: against today's default, HF's defaults, HF's best flags
HF_DEFAULTS = "hf_defaults"
HF_BEST = "hf_best"
MINILM_REFERENCE = {"exact_match": 48.16, "f1": 60.99, "questions": 10570, "max_f1_diff": 0.5}
MINILM_REFERENCE_SOURCE = "eager, bf16, one H200: bench/results/2026-11-27_h200_gpu_smoke/"


@dataclass(frozen=True)
class Speed:
    """A training run's figures from its probe. Steady: the steps after the warm-up; regular: the steady
    steps but those over OUTLIER x the median, which hold a one-time cost (a compile, new kernel plans)."""

    steps: int
    global_batch: int
    precision: str
    tf32: bool
    dataloader_num_workers: int
    torch_compile: bool
    torch_compile_mode: str | None
    median_step_ms: float  # steady
    mean_step_ms: float  # steady
    regular_mean_step_ms: float
    outlier_steps: int  # steady steps left out of the regular ones
    median_samples_per_second: float  # batch / median step, as bench/gpu_smoke.py counts
    whole_run_samples_per_second: float  # every step's samples / train()'s wall time
    train_wall_seconds: float
    warmup_seconds: float  # the warm-up steps
    one_time_seconds: float  # what all timed steps took beyond as many regular steps
    compile_seconds: float | None  # dynamo's own account
    compiled_graphs: int | None
    real_tokens_per_second: float  # regular steps
    achieved_tflops: float  # regular steps, useful FLOPs on real tokens
    peak_tflops: float | None
    mfu: float | None
    peak_memory_mb: float | None
    projected_2_epochs_seconds: float  # the timed steps + the rest of 2 epochs at the regular mean step
    # inductor's graph-cache lookups (hits: compiled warm) and the graphs it ran without CUDA graphs; None
    # without a compile, and in records from before these were kept
    compile_cache_hits: int | None = None
    compile_cache_misses: int | None = None
    cuda_graph_skips: int | None = None


OUTLIER = 4.0
TWO_EPOCHS = 2 * TRAIN_FEATURES  # SQuAD v1.1's 88,524 train features at 384/128, twice


def speed_from_probe(probe: dict[str, Any], warmup: int) -> Speed:
    import numpy as np

    from qa_hpc.observe.efficiency import peak_tflops, train_flops_per_sequence

    steps = probe["step_seconds"]
    state = steady_state(steps, warmup)
    median = state.median_step_seconds
    regular = [i for i in range(warmup, len(steps)) if steps[i] <= OUTLIER * median]
    regular_seconds = sum(steps[i] for i in regular)
    regular_mean = regular_seconds / len(regular)
    batch = probe["global_batch"]
    lengths = np.array([n for i in regular for n in probe["step_lengths"][i]], dtype=np.int64)
    shape = probe["model_shape"]
    flops = train_flops_per_sequence(lengths, shape["non_embedding_params"], shape["layers"], shape["hidden"])
    achieved = float(flops.sum()) / regular_seconds / 1e12
    peak = peak_tflops(probe["environment"]["device"], probe["precision"], probe["tf32"])
    return Speed(
        steps=len(steps),
        global_batch=batch,
        precision=probe["precision"],
        tf32=probe["tf32"],
        dataloader_num_workers=probe["dataloader_num_workers"],
        torch_compile=probe["torch_compile"],
        torch_compile_mode=probe["torch_compile_mode"],
        median_step_ms=median * 1e3,
        mean_step_ms=state.mean_step_seconds * 1e3,
        regular_mean_step_ms=regular_mean * 1e3,
        outlier_steps=state.steps_timed - len(regular),
        median_samples_per_second=batch / median,
        whole_run_samples_per_second=len(steps) * batch / probe["train_wall_seconds"],
        train_wall_seconds=probe["train_wall_seconds"],
        warmup_seconds=state.warmup_seconds,
        one_time_seconds=sum(steps) - len(steps) * regular_mean,
        compile_seconds=probe["compile_seconds"],
        compiled_graphs=probe["compiled_graphs"],
        real_tokens_per_second=float(lengths.sum()) / regular_seconds,
        achieved_tflops=achieved,
        peak_tflops=peak,
        mfu=achieved / peak if peak else None,
        peak_memory_mb=probe["peak_memory_mb"],
        projected_2_epochs_seconds=sum(steps) + (math.ceil(TWO_EPOCHS / batch) - len(steps)) * regular_mean,
        compile_cache_hits=probe.get("compile_cache_hits"),
        compile_cache_misses=probe.get("compile_cache_misses"),
        cuda_graph_skips=probe.get("cuda_graph_skips"),
    )


@dataclass(frozen=True)
class Record:
    """One variant as it ran (or did not): one JSON file in the results folder."""

    name: str
    script: str
    flags: list[str]
    status: str  # ok | failed | timed_out | not_run
    reason: str | None = None  # why it failed or was not run
    exit_code: int | None = None
    process_seconds: float | None = None
    plan_line: str | None = None
    effective_line: str | None = None
    environment: dict[str, Any] | None = None
    speed: Speed | None = None
    accuracy: dict[str, Any] | None = None  # MiniLM's recipe: EM/F1 and how they compare with the reference

    @property
    def ran(self) -> bool:
        return self.speed is not None


def load_record(path: Path) -> Record:
    """A variant's record as bench/gpu_speed.py saved it (its JSON, the sitting's name beside the fields)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data.pop("sitting", None)
    data.pop("call", None)  # a joined record's call (bench/gpu_speed.py join)
    speed = data.pop("speed")
    return Record(**data, speed=Speed(**speed) if speed else None)


def save_record(path: Path, sitting: str, record: Record, call: int | None = None) -> None:
    """What load_record reads: the sitting's name (and, in a joined folder, the call that ran it), then the
    record's fields."""
    head: dict[str, Any] = {"sitting": sitting} if call is None else {"sitting": sitting, "call": call}
    path.write_text(json.dumps({**head, **asdict(record)}, indent=1), encoding="utf-8")


def log_line(log: str, key: str) -> str | None:
    """The first line of a child's log that starts with `key` (PLAN, EFFECTIVE), or its last ERROR line."""
    found = re.findall(rf"(?m)^.*?\b({key}\b.*)$", log)
    return (found[-1] if key == "ERROR" else found[0]) if found else None


def minilm_accuracy(summary: dict[str, Any]) -> dict[str, Any]:
    """MiniLM's EM/F1 beside the eager reference (compared only when every dev question was scored)."""
    results = summary.get("results", {})
    keys = ("eval_exact_match", "eval_f1", "eval_examples", "train_runtime", "eval_runtime")
    accuracy = {key: results.get(key) for key in keys}
    whole = accuracy["eval_examples"] == MINILM_REFERENCE["questions"] and accuracy["eval_f1"] is not None
    accuracy["f1_diff_vs_reference"] = accuracy["eval_f1"] - MINILM_REFERENCE["f1"] if whole else None
    accuracy["within_target"] = (
        abs(accuracy["f1_diff_vs_reference"]) <= MINILM_REFERENCE["max_f1_diff"] if whole else None
    )
    return accuracy


# --- the table --------------------------------------------------------------------------------------------
def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def ratio(reference: Record | None, record: Record) -> str:
    """How many times shorter the record's 2-epoch projection is than the reference's."""
    if reference is None or not reference.ran or not record.ran:
        return "–"
    return f"{reference.speed.projected_2_epochs_seconds / record.speed.projected_2_epochs_seconds:.2f}x"


def compile_cell(s: Speed) -> str:
    """Dynamo's compile seconds, then (graphs; inductor's cache hits/misses; graphs run without CUDA graphs),
    as far as the record has them."""
    if s.compile_seconds is None:
        return "–"
    counts = [s.compiled_graphs]
    if s.compile_cache_hits is not None:
        counts += [f"{s.compile_cache_hits}/{s.compile_cache_misses}", s.cuda_graph_skips]
    return f"{fmt(s.compile_seconds)} ({'; '.join(map(str, counts))})"


def table_row(record: Record, by_name: dict[str, Record]) -> str:
    flags = f"`{' '.join(record.flags)}`" if record.flags else "(none)"
    if not record.ran:
        return f"| {record.name} | {flags} | {record.status}: {record.reason} |" + " |" * 14
    s = record.speed
    cells = [
        f"{s.precision}, {s.dataloader_num_workers} workers",
        fmt(s.median_step_ms),
        fmt(s.mean_step_ms),
        fmt(s.median_samples_per_second, 0),
        fmt(s.whole_run_samples_per_second, 0),
        fmt(s.warmup_seconds),
        fmt(s.one_time_seconds),
        compile_cell(s),
        fmt(s.mfu, 3),
        fmt(s.peak_memory_mb, 0),
        fmt(s.projected_2_epochs_seconds, 0),
        ratio(by_name.get(BASELINE), record),
        ratio(by_name.get(HF_DEFAULTS), record),
        ratio(by_name.get(HF_BEST), record),
    ]
    return f"| {record.name} | {flags} | {' | '.join(cells)} |"


TABLE_HEAD = (
    "| variant | flags | precision, loader | median step ms | mean step ms | samples/s (median step) | "
    "whole-run samples/s | warm-up s | one-time s | "
    "compile s (graphs; cache hits/misses; CUDA graph skips) | MFU, real tokens | peak GPU MB | "
    f"2 epochs projected s | vs today ({BASELINE}) | vs {HF_DEFAULTS} | vs {HF_BEST} |\n" + "|---" * 16 + "|"
)


def machine_line(records: list[Record]) -> str:
    env = next((r.environment for r in records if r.environment), None)
    if env is None:
        return "Machine: no variant ran."
    return (
        f"Machine: {env['device']} ({env['capability'] or 'no GPU'}), driver {env['driver']}, "
        f"CUDA {env['cuda']}, cuDNN {env['cudnn']}, torch {env['torch']}, "
        f"transformers {env['transformers']}, datasets {env['datasets']}, accelerate {env['accelerate']}, "
        f"Python {env['python']}; {env['cpus']} CPUs ({env['cpu_model']})."
    )


def minilm_text(record: Record | None) -> str:
    if record is None:
        return "MiniLM's full recipe: not reached."
    flags = f"`{' '.join(record.flags)}`" if record.flags else "none beyond the recipe"
    if record.accuracy is None or record.accuracy.get("eval_f1") is None:
        return f"MiniLM's full recipe (levers: {flags}): {record.status}: {record.reason}."
    a = record.accuracy
    reference = (
        f"eager reference {MINILM_REFERENCE['exact_match']} / {MINILM_REFERENCE['f1']} "
        f"({MINILM_REFERENCE_SOURCE}): F1 {a['f1_diff_vs_reference']:+.2f}, "
        f"{'within' if a['within_target'] else 'NOT within'} {MINILM_REFERENCE['max_f1_diff']} F1"
        if a["f1_diff_vs_reference"] is not None
        else "the reference holds for all 10,570 dev questions only"
    )
    return (
        f"MiniLM's full recipe (docs/ACCURACY.md; levers: {flags}): EM {a['eval_exact_match']:.2f} / F1 "
        f"{a['eval_f1']:.2f} on {a['eval_examples']:,} questions; {reference}. "
        f"Train {fmt(a['train_runtime'])} s, eval {fmt(a['eval_runtime'])} s, "
        f"the process {fmt(record.process_seconds, 0)} s."
    )


def write_table(
    path: Path, sitting: str, method: str, records: list[Record], choices: list[str], minilm: Record | None
) -> None:
    by_name = {record.name: record for record in records}
    lines = [
        f"# GPU speed, sitting {sitting}, {time.strftime('%Y-%m-%d')}",
        "",
        machine_line([*records, *([minilm] if minilm else [])]),
        "",
        TABLE_HEAD,
        *(table_row(record, by_name) for record in records),
        "",
        *(f"- {line}" for line in choices),
        "",
        minilm_text(minilm),
        "",
        method,
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
