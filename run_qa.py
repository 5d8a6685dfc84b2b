#!/usr/bin/env python
"""Fine-tune a BERT-style model on SQuAD and score it (EM/F1): the qa-hpc entry point.

    python run_qa.py --model_name_or_path bert-base-uncased --dataset_name squad \
        --do_train --do_eval --output_dir outputs/bert
    python run_qa.py args.json
    torchrun --nproc_per_node=4 run_qa.py ...

This file parses flags, loads data, and wires the pieces together; features and
postprocessing live in utils_qa.py, scoring in squad_metric.py, the trainer in
trainer_qa.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

_WALL_START = time.time()

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    DataCollatorWithPadding,
    HfArgumentParser,
    default_data_collator,
)

from qa_hpc.reliability.atomic_io import OutputError, write_json_atomic, write_text_atomic  # noqa: E402
from qa_hpc.reliability.errors import (  # noqa: E402
    EXIT_IOERR,
    EXIT_OK,
    EXIT_OOM,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    BatchContext,
    OutOfMemory,
    UsageError,
    check_writable_dir,
    guarded,
    is_out_of_memory,
)
from qa_hpc.reliability.preemption import (  # noqa: E402
    PreemptionCallback,
    StopRequest,
    apply_collective_timeout,
    last_complete_checkpoint,
)
from qa_hpc.settings.flags import DataTrainingArguments, ModelArguments, QATrainingArguments  # noqa: E402
from qa_hpc.observe.observability import Observability, ObservabilityArguments  # noqa: E402
from qa_hpc.summary import final_lines, run_params, write_run_summary  # noqa: E402
from qa_hpc.data.features_cache import cache_files_in, features_cache_file  # noqa: E402
from qa_hpc.observe.efficiency import device_name_of, real_lengths, train_efficiency  # noqa: E402
from qa_hpc.settings.speed import SpeedArguments, SpeedFlagError, model_kwargs, resolve_speed  # noqa: E402
from qa_hpc.data.squad_io import DataError, load_qa_records  # noqa: E402
from qa_hpc.metric.squad import answers_by_id, score_v1, score_v2  # noqa: E402
from trainer_qa import QuestionAnsweringTrainer  # noqa: E402
from qa_hpc.data.features import FeatureConfig, FeatureError, prepare_train_features, prepare_validation_features  # noqa: E402,E501
from qa_hpc.postprocess.files import write_prediction_files  # noqa: E402
from qa_hpc.postprocess.reference import PostprocessConfig, QAPredictions  # noqa: E402
from qa_hpc.postprocess.predict import predictions_from_logits  # noqa: E402
from qa_hpc.model import load_model, load_tokenizer  # noqa: E402

logger = logging.getLogger("run_qa")



ARG_CLASSES = (ModelArguments, DataTrainingArguments, QATrainingArguments, ObservabilityArguments, SpeedArguments)


def configure_cpu_distributed() -> None:
    """Make torchrun on a CPU-only machine really distributed.

    Left alone, transformers sees no GPU, leaves accelerate's state non-distributed,
    and every rank trains on all the data by itself. Telling accelerate to use the
    CPU before TrainingArguments sets up devices gives a MULTI_CPU (gloo) run.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")


def parse_args(
    argv: list[str],
) -> tuple[ModelArguments, DataTrainingArguments, QATrainingArguments, ObservabilityArguments, SpeedArguments]:
    """Flags from the command line, or from one JSON file (unknown keys are an error)."""
    parser = HfArgumentParser(ARG_CLASSES)
    if len(argv) == 1 and argv[0].endswith(".json"):
        path = os.path.abspath(argv[0])
        if not os.path.isfile(path):
            raise UsageError(f"{path}: arguments file not found")
        try:
            return parser.parse_json_file(path)
        except ValueError as err:
            raise UsageError(f"{path}: {err}") from err
    try:
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as err:
        raise UsageError(str(err)) from err


def setup_logging(training_args: QATrainingArguments) -> None:
    """Info on the main process, warnings elsewhere, with the rank in every line."""
    rank = int(os.environ.get("RANK", "0"))
    level = logging.INFO if training_args.should_log else logging.WARNING
    logging.basicConfig(
        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
        level=level,
        force=True,
    )
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()


def checkpoint_to_resume(data_args: DataTrainingArguments, training_args: QATrainingArguments) -> str | None:
    """Decide what a non-empty --output_dir means (transformers 5 has no overwrite_output_dir).

    - --resume_from_checkpoint given: use it.
    - checkpoints present: resume from the last one (a requeued SLURM job continues by itself).
    - other files present: refuse, unless --overwrite_output_dir.
    """
    if training_args.resume_from_checkpoint:
        return training_args.resume_from_checkpoint
    out = training_args.output_dir
    if not training_args.do_train or not os.path.isdir(out) or data_args.overwrite_output_dir:
        return None
    last = last_complete_checkpoint(out)
    if last is not None:
        logger.info("RESUME_FROM=%s (checkpoint found in --output_dir; add --overwrite_output_dir to start over)", last)
        return last
    leftovers = [n for n in os.listdir(out) if not n.startswith(".")]
    if leftovers:
        raise UsageError(
            f"--output_dir {out} is not empty ({', '.join(sorted(leftovers)[:5])}) and holds no checkpoint to "
            "resume from; add --overwrite_output_dir to train into it anyway, or choose another --output_dir"
        )
    return None


def _local_file(data_args: DataTrainingArguments, split: str) -> str | None:
    return {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}[split]


def load_split(
    data_args: DataTrainingArguments, model_args: ModelArguments, split: str, limit: int | None
) -> datasets.Dataset:
    """Examples of one split: from a local file in any supported form, else from the hub."""
    path = _local_file(data_args, split)
    if path is not None:
        records, report = load_qa_records(
            path, split=split, version_2_with_negative=data_args.version_2_with_negative,
            answer_check=data_args.answer_check,
        )
        logger.info("%s split=%s", report.summary(), split)
        dataset = datasets.Dataset.from_list(records)
    else:
        if not data_args.dataset_name:
            raise UsageError(f"no --{split}_file and no --dataset_name to read the {split} split from")
        hub = datasets.load_dataset(
            data_args.dataset_name, data_args.dataset_config_name, cache_dir=model_args.cache_dir,
            token=model_args.token,
        )
        if split not in hub:
            raise UsageError(f"dataset {data_args.dataset_name} has no '{split}' split (has {list(hub)})")
        dataset = hub[split]
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return dataset


def featurize(
    examples: datasets.Dataset, fn: Any, tokenizer: Any, cfg: FeatureConfig, data_args: DataTrainingArguments,
    training_args: QATrainingArguments, desc: str,
) -> datasets.Dataset:
    """Tokenize once on the main process first, so other ranks reuse its cache (features_cache.py)."""
    cache_file = features_cache_file(
        data_args.features_cache_dir, desc.split()[0], examples, fn, tokenizer, cfg,
        (data_args.version_2_with_negative, data_args.answer_check),
    )
    with training_args.main_process_first(desc=desc):
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        before, t0 = cache_files_in(cache_file), time.time()
        features = examples.map(
            fn,
            batched=True,
            fn_kwargs={"tokenizer": tokenizer, "cfg": cfg},
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=examples.column_names,
            load_from_cache_file=not data_args.overwrite_cache,
            cache_file_name=cache_file,
            desc=desc,
        )
        computed = cache_files_in(cache_file) != before or data_args.overwrite_cache or not before
        logger.info("FEATURES_CACHE split=%s %s in %.1fs features=%d path=%s", desc.split()[0],
                    "computed" if computed else "reused", time.time() - t0, len(features), cache_file)
        return features


@dataclass
class QAData:
    """Examples and their features for each split that runs."""

    train: datasets.Dataset | None = None
    eval_examples: datasets.Dataset | None = None
    eval_features: datasets.Dataset | None = None
    predict_examples: datasets.Dataset | None = None
    predict_features: datasets.Dataset | None = None


def build_data(
    model_args: ModelArguments, data_args: DataTrainingArguments, training_args: QATrainingArguments, tokenizer: Any
) -> QAData:
    """Load and featurize each split the flags ask for."""
    data = QAData()
    source = lambda split: _local_file(data_args, split) or data_args.dataset_name or split  # noqa: E731
    cfg = lambda split: FeatureConfig(  # noqa: E731
        data_args.max_seq_length, data_args.doc_stride, data_args.pad_to_max_length, str(source(split))
    )
    if training_args.do_train:
        train_examples = load_split(data_args, model_args, "train", data_args.max_train_samples)
        data.train = featurize(train_examples, prepare_train_features, tokenizer, cfg("train"), data_args,
                               training_args, "train features")
        log_token_counts("train", data.train, data_args)
    if training_args.do_eval:
        data.eval_examples = load_split(data_args, model_args, "validation", data_args.max_eval_samples)
        data.eval_features = featurize(data.eval_examples, prepare_validation_features, tokenizer,
                                       cfg("validation"), data_args, training_args, "eval features")
        log_token_counts("eval", data.eval_features, data_args)
    if training_args.do_predict:
        data.predict_examples = load_split(data_args, model_args, "test", data_args.max_predict_samples)
        data.predict_features = featurize(data.predict_examples, prepare_validation_features, tokenizer,
                                          cfg("test"), data_args, training_args, "predict features")
    return data


def log_token_counts(split: str, features: datasets.Dataset, data_args: DataTrainingArguments) -> None:
    """How many tokens are real, against padding every feature to max_seq_length."""
    masks = features["attention_mask"]
    real = sum(sum(m) for m in masks)
    full = len(masks) * data_args.max_seq_length
    logger.info(
        "TOKENS split=%s features=%d real_tokens=%d tokens_at_max_length=%d mean_len=%.1f",
        split, len(masks), real, full, real / max(1, len(masks)),
    )


def make_postprocess(
    data_args: DataTrainingArguments, training_args: QATrainingArguments, method: str = "vectorized"
) -> Any:
    """Logits -> answers, with prediction files written on the main process.

    method 'vectorized' (postprocess_vectorized.py) reads the offsets straight from the features'
    Arrow column; 'loop' is the per-feature reference loop of utils_qa. Both give the same answers.
    """
    cfg = PostprocessConfig(
        version_2_with_negative=data_args.version_2_with_negative,
        n_best_size=data_args.n_best_size,
        max_answer_length=data_args.max_answer_length,
        null_score_diff_threshold=data_args.null_score_diff_threshold,
    )

    def post_process(examples: Any, features: Any, logits: Any, stage: str) -> QAPredictions:
        preds = predictions_from_logits(examples, features, logits, cfg, method)
        write_prediction_files(preds, training_args.output_dir, stage)
        return preds

    return post_process


def make_score(data_args: DataTrainingArguments) -> Any:
    """Answers + gold -> EM/F1 with our official-equivalent scorer."""

    def score(preds: QAPredictions, examples: Any) -> dict[str, float]:
        refs = answers_by_id({"id": examples["id"], "answers": examples["answers"]})
        if data_args.version_2_with_negative:
            # null odds are score differences; thresholding them at the same value as the
            # postprocessing keeps exact/f1 unchanged and makes best_f1_thresh a usable threshold
            return score_v2(refs, preds.answers, na_probs=preds.null_odds,
                            na_prob_thresh=data_args.null_score_diff_threshold)
        return score_v1(refs, preds.answers)

    return score


def main(argv: list[str] | None = None) -> int:
    """Run training, evaluation and prediction as asked; return the process exit code."""
    # every rank, before anything else: lets an operator (or a test) signal or kill one rank
    print(f"RANK_PID rank={os.environ.get('RANK', '0')} local_rank={os.environ.get('LOCAL_RANK', '0')} "
          f"pid={os.getpid()}", flush=True)
    stop_request = StopRequest()
    stop_request.install()  # SIGTERM / SIGUSR1 only set a flag; acted on at the next step end
    configure_cpu_distributed()
    model_args, data_args, training_args, obs_args, speed_args = parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging(training_args)
    try:
        speed_plan = resolve_speed(speed_args, training_args)  # precision, TF32, workers per device
    except SpeedFlagError as err:
        raise UsageError(str(err)) from err
    logger.info(
        "DISTRIBUTED world_size=%d rank=%d parallel_mode=%s backend=%s device=%s",
        training_args.world_size, training_args.process_index, training_args.parallel_mode.value,
        _backend(), training_args.device,
    )
    apply_collective_timeout(training_args.ddp_timeout)  # --ddp_timeout for gloo too: a frozen rank fails the job
    resume = checkpoint_to_resume(data_args, training_args)
    transformers.set_seed(training_args.seed)

    # validate every input (records, question lengths) before loading the model or writing anything
    tokenizer = load_tokenizer(model_args)
    data = build_data(model_args, data_args, training_args, tokenizer)
    check_writable_dir(training_args.output_dir)
    model = load_model(model_args, **model_kwargs(speed_args))
    speed_plan.attn_implementation = getattr(model.config, "_attn_implementation", speed_plan.attn_implementation)
    logger.info(speed_plan.log_line())
    observe = Observability(obs_args, training_args, model, data_args.max_seq_length)  # profiler, TensorBoard, memory
    collator = (
        default_data_collator if data_args.pad_to_max_length
        else DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    )
    trainer = QuestionAnsweringTrainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        eval_dataset=data.eval_features,
        eval_examples=data.eval_examples,
        processing_class=tokenizer,
        data_collator=collator,
        post_process_function=make_postprocess(data_args, training_args, speed_args.postprocess),
        score_function=make_score(data_args),
        sort_eval_by_length=not data_args.pad_to_max_length,
        callbacks=observe.callbacks,
    )

    preemption = PreemptionCallback(stop_request)
    trainer.add_callback(preemption)
    out_dir = training_args.output_dir
    batch_ctx = BatchContext(
        training_args.per_device_train_batch_size, training_args.per_device_eval_batch_size,
        training_args.gradient_accumulation_steps, data_args.max_seq_length, str(training_args.device),
    )

    results: dict[str, Any] = {}
    efficiency_lines: list[str] = []
    if training_args.do_train:
        checkpoint_dir = lambda: os.path.join(out_dir, f"checkpoint-{trainer.state.global_step}")  # noqa: E731
        with guarded("train", checkpoint_dir, batch_ctx):
            train_result = trainer.train(resume_from_checkpoint=resume)
        if preemption.stopped:
            # no rank leaves before the checkpoint is on disk: a launcher that kills the job on the
            # first exit (srun --kill-on-bad-exit) would otherwise cut the main rank's save short
            trainer.accelerator.wait_for_everyone()
            if trainer.is_world_process_zero():
                logger.warning(
                    "PREEMPTED signal=%s global_step=%d checkpoint=%s exit_code=%d (run the same command to resume)",
                    stop_request.name, trainer.state.global_step, checkpoint_dir(), EXIT_PREEMPTED,
                )
            return EXIT_PREEMPTED
        with guarded("train", out_dir, batch_ctx):
            trainer.save_model()
            metrics = dict(train_result.metrics)
            metrics["train_samples"] = len(data.train)
            results.update(metrics)
            if trainer.is_world_process_zero():  # efficiency.py: real tokens/s, model FLOP/s, MFU
                efficiency = train_efficiency(
                    real_lengths(data.train), float(trainer.state.epoch or 0.0), float(metrics["train_runtime"]),
                    model, device_name_of(training_args.device), training_args.world_size, speed_plan.precision,
                    speed_plan.tf32,
                )
                results.update(efficiency.metrics())
                efficiency_lines = efficiency.log_lines()
            save_results(trainer, "train", metrics)
            save_trainer_state(trainer)
    if stop_request.requested:
        # evaluation cannot be checkpointed part-way; the final checkpoint is saved, so finish
        logger.warning("STOP_REQUESTED signal=%s outside training: finishing the run", stop_request.name)
    if training_args.do_eval:
        with guarded("eval", out_dir, batch_ctx):
            metrics = trainer.evaluate()
        metrics["eval_samples"] = len(data.eval_features)
        results.update(metrics)
        save_results(trainer, "eval", metrics)
    if training_args.do_predict:
        with guarded("predict", out_dir, batch_ctx):
            output = trainer.predict(data.predict_features, data.predict_examples)
        metrics = dict(output.metrics)
        metrics["predict_samples"] = len(data.predict_features)
        results.update(metrics)
        save_results(trainer, "predict", metrics)

    wall = time.time() - _WALL_START
    observe_lines = observe.finish(results, wall)  # every rank (gathers memory); lines on rank 0
    if trainer.is_world_process_zero():
        params = run_params(model_args, data_args, training_args)
        params["speed"] = dataclasses.asdict(speed_plan)
        write_run_summary(os.path.join(training_args.output_dir, "run_summary.json"), params, results, wall, "ok")
        for line in observe_lines + efficiency_lines + final_lines(results, wall):
            print(line, flush=True)
    return EXIT_OK


def _backend() -> str | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_backend()
    return None


def save_results(trainer: QuestionAnsweringTrainer, split: str, metrics: dict[str, Any]) -> None:
    """{split}_results.json and all_results.json, atomically, on the main process."""
    trainer.log_metrics(split, metrics)
    if not trainer.is_world_process_zero():
        return
    out = trainer.args.output_dir
    write_json_atomic(os.path.join(out, f"{split}_results.json"), metrics, sort_keys=True)
    all_path = os.path.join(out, "all_results.json")
    combined: dict[str, Any] = {}
    if os.path.exists(all_path):
        with open(all_path, encoding="utf-8") as fh:
            combined = json.load(fh)
    combined.update(metrics)
    write_json_atomic(all_path, combined, sort_keys=True)


def save_trainer_state(trainer: QuestionAnsweringTrainer) -> None:
    """trainer_state.json like Trainer.save_state, but written atomically."""
    if trainer.is_world_process_zero():
        state = json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n"
        write_text_atomic(os.path.join(trainer.args.output_dir, "trainer_state.json"), state)


def cli() -> int:
    """Entry point with clear messages (no traceback) for the user's own mistakes and for resources.

    Exit codes (qa_hpc/reliability/exit_codes.env): 2 bad flags/data, 3 out of memory, 74 cannot write,
    75 preempted.
    """
    try:
        return main()
    except (UsageError, DataError, FeatureError) as err:
        print(f"ERROR: {err}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except OutputError as err:
        print(f"ERROR: {err}", file=sys.stderr, flush=True)
        return EXIT_IOERR
    except OutOfMemory as err:
        print(f"ERROR: {err}", file=sys.stderr, flush=True)
        return EXIT_OOM
    except Exception as err:
        if is_out_of_memory(err):
            print(f"ERROR: out of memory ({type(err).__name__}: {err}); lower --per_device_train_batch_size "
                  "or --per_device_eval_batch_size", file=sys.stderr, flush=True)
            return EXIT_OOM
        # say which rank failed (a peer that died shows up here as a failed collective), then the traceback
        print(f"ERROR: rank {os.environ.get('RANK', '0')} (pid {os.getpid()}) failed: {type(err).__name__}: "
              f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}", file=sys.stderr, flush=True)
        raise


if __name__ == "__main__":
    sys.exit(cli())
