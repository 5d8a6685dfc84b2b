#!/usr/bin/env python
"""Fine-tune a BERT-style model on SQuAD and score it (EM/F1): the qa-hpc entry point.

    python run_qa.py --model_name_or_path bert-base-uncased --dataset_name squad \
        --do_train --do_eval --output_dir outputs/bert
    python run_qa.py args.json
    torchrun --nproc_per_node=4 run_qa.py ...

main() is the recipe, top to bottom: decide the settings once, set up data, model and trainer, train,
evaluate, predict, report. `python run_qa.py --help` lists every flag.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import datasets
import torch
import transformers
from accelerate import PartialState
from transformers import PretrainedConfig, TrainerState, TrainingArguments

from qa_hpc import attention
from qa_hpc.atomic_io import readable_as_umask_allows
from qa_hpc.batching import make_collator
from qa_hpc.compile import CompiledSteps, apply_recompile_limit
from qa_hpc.device import DeviceFacts, read_device_facts, set_cuda_tf32
from qa_hpc.dist import (
    end_process_group,
    exit_code_noted,
    launch_env,
    process_start_time,
    same_on_every_rank,
)
from qa_hpc.dropout import install as install_bulk_dropout
from qa_hpc.effective import Effective
from qa_hpc.errors import EXIT_OK, EXIT_PREEMPTED, BatchContext, check_writable_dir, classify, guarded
from qa_hpc.features import QAData, build_data, real_lengths
from qa_hpc.flags import (
    Flags,
    batch_lines,
    decide_and_build,
    optimizer_steps,
    read_flags,
    training_batches,
    unused_flags,
)
from qa_hpc.metric.squad import make_score
from qa_hpc.model import (
    ModelShape,
    check_attention_dropout,
    check_max_seq_length,
    load_config,
    load_model,
    load_tokenizer,
)
from qa_hpc.observe.efficiency import train_efficiency
from qa_hpc.observe.run import finish_observability, observability_callbacks
from qa_hpc.outputs import SUMMARY_FILE, checkpoint_dir
from qa_hpc.plan import FlagValues, RunPlan
from qa_hpc.postprocess import make_postprocess
from qa_hpc.preemption import (
    PreemptionCallback,
    ReadableCheckpoints,
    StopRequest,
    apply_collective_timeout,
    checkpoint_state,
    checkpoint_to_resume,
    clear_for_launch,
    recipe_changes,
    refuse_ignored_changes,
    replaces_output_dir,
    say_resume,
    take_trained_state,
    trained_every_step,
)
from qa_hpc.record import (
    Environment,
    Memory,
    Params,
    Recorded,
    RunRecord,
    Status,
    Stopped,
    save_results,
    save_trainer_state,
)
from trainer_qa import QuestionAnsweringTrainer

logger = logging.getLogger("run_qa")


@dataclass
class Run:
    """What the steps of one run share: built by setup(), then read by the steps."""

    flags: Flags
    plan: RunPlan
    facts: DeviceFacts
    args: TrainingArguments  # the finished ones: never changed after setup
    data: QAData
    shape: ModelShape
    trainer: QuestionAnsweringTrainer
    effective: Effective
    params: Params  # what the run's record and TensorBoard say it ran with
    preemption: PreemptionCallback
    resume: str | None
    # the last checkpoint of an earlier launch that trained every step: its model is the run's, and this
    # launch trains nothing (None: it trains, from `resume` where there is one)
    trained_before: str | None
    # every split's metrics, as the results files have them
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def oom_context(self) -> BatchContext:
        """What an out-of-memory message quotes."""
        a = self.args
        return BatchContext(
            a.per_device_train_batch_size,
            a.per_device_eval_batch_size,
            a.gradient_accumulation_steps,
            self.flags.data.max_seq_length,
            str(a.device),
            self.plan.precision,
        )


def main(argv: list[str] | None = None) -> int:
    """Run training, evaluation and prediction as asked; return the process exit code."""
    stop = StopRequest()
    stop.install()  # SIGTERM / SIGUSR1 only set a flag; acted on at an optimizer step's end
    values = read_flags(sys.argv[1:] if argv is None else argv)  # --help ends here
    # every rank, before anything slow: lets an operator (or a test) signal or kill one rank
    launch = launch_env()
    print(f"RANK_PID rank={launch.rank} local_rank={launch.local_rank} pid={os.getpid()}", flush=True)
    facts = read_device_facts()  # the machine, read once: the plan decides from it, the record keeps it
    # every flag dataclass built with the plan's fields (again in setup, for a compile that waits for the
    # training batches to be counted)
    plan, flags = decide_and_build(values, facts)
    setup_logging(flags.training)
    run = setup(values, flags, plan, facts, stop)
    try:
        run.effective.check(run.plan)  # a setting that did not take: exit 1, recorded with both
        if run.args.do_train and not train(run, stop):
            return EXIT_PREEMPTED
        if run.args.do_eval:
            evaluate(run, stop)
        if run.args.do_predict:
            predict(run)
        stop.note_outside_training()  # a signal while it evaluated or predicted
        report(run)
    except Exception as err:
        record(run, Status.FAILED, classify(err)[0], error=f"{type(err).__name__}: {err}")
        raise
    return EXIT_OK


def setup_logging(args: TrainingArguments) -> None:
    """Info where the TrainingArguments' should_log, warnings elsewhere; the rank in every line."""
    level = logging.INFO if args.should_log else logging.WARNING
    logging.basicConfig(
        format=f"%(asctime)s [rank{args.process_index}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
        level=level,
        force=True,
    )
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()


def setup(values: FlagValues, flags: Flags, plan: RunPlan, facts: DeviceFacts, stop: StopRequest) -> Run:
    """Process settings, data, model and trainer; every input is checked before anything is written. A plan
    whose compile waits for the training batches is decided again, and logged, once they are counted."""
    args = flags.training
    if not plan.awaits_batch_count:
        log_plan(plan, values)
    logger.info(
        "DISTRIBUTED world_size=%d rank=%d parallel_mode=%s backend=%s device=%s",
        args.world_size,
        args.process_index,
        args.parallel_mode.value,
        PartialState().backend,
        args.device,
    )
    apply_collective_timeout(args.ddp_timeout)  # --ddp_timeout for gloo too: a frozen rank fails the job
    # decided before anything is written: clear_for_launch rewrites the mark it reads
    replaces = replaces_output_dir(args.output_dir, flags.data.overwrite_output_dir)
    resume = checkpoint_to_resume(args, replaces)
    transformers.set_seed(args.seed)
    # model, tokenizer, data and metric found, every record checked: then write
    config = load_config(flags.model)
    tokenizer = load_tokenizer(flags.model)
    check_max_seq_length(flags.data.max_seq_length, config, tokenizer, flags.model.model_name_or_path)
    check_attention_dropout(flags.speed.attn_implementation, config, args.do_train)
    data = build_data(flags.model, flags.data, args, tokenizer)
    params = Params.of(flags, plan.precision)
    resume, trained_before = start_of_training(
        args, replaces, resume, data, params, flags.data.overwrite_output_dir
    )
    if plan.awaits_batch_count:
        plan, flags = replan_with_batch_count(values, flags, facts, len(data.train))
        args = flags.training
    torch.set_num_threads(plan.threads)  # the one process setting no TrainingArguments field carries
    for line in batch_lines(args, len(data.train)) if args.do_train else []:
        logger.info(line)  # the main process: global batch, optimizer steps, learning rate
    score = None
    if args.do_eval or args.do_predict:  # the metric, loaded before anything is written
        score = make_score(flags.data.version_2_with_negative, flags.data.null_score_diff_threshold)
    # the model loaded before any folder is made: weights that cannot be loaded leave none behind
    model = build_model(flags, plan, config, trained_before)
    check_output_folders(plan, args.output_dir)
    shape = ModelShape.of(model)  # counted before any wrapper (FSDP) shards the parameters
    preemption = PreemptionCallback(stop, plan.stop_vote_every)
    trainer = QuestionAnsweringTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.eval_features,
        eval_examples=data.eval_examples,
        processing_class=tokenizer,
        data_collator=make_collator(tokenizer, plan.pad_to_buckets, flags.data.pad_to_max_length),
        post_process_function=make_postprocess(flags.data, args.output_dir),
        score_function=score,
        sort_eval_by_length=not flags.data.pad_to_max_length,
        compiled_steps=CompiledSteps(plan.torch_compile, plan.cuda_graphs),
        loss_filter=plan.loss_filter == "device",
        callbacks=[*observability_callbacks(flags, plan), preemption, ReadableCheckpoints()],
    )
    if plan.device == "cuda":
        set_cuda_tf32(plan.tf32)
    effective = Effective.read(trainer)
    print(effective.log_line(args.process_index), flush=True)  # every rank: what it really uses
    clear_for_launch(args, replaces, params)
    return Run(
        flags, plan, facts, args, data, shape, trainer, effective, params, preemption, resume, trained_before
    )


def replan_with_batch_count(
    values: FlagValues, flags: Flags, facts: DeviceFacts, train_features: int
) -> tuple[RunPlan, Flags]:
    """The compile pays only over enough batches: the whole plan again once they are counted (buckets and
    attention kernels follow the compile), and the flags built with it, before anything is compiled or
    written; logged."""
    # disable_tqdm as the first TrainingArguments derived it, from the log level before setup_logging
    # (transformers' own default): progress bars as in a run that does not wait
    values = {**values, "disable_tqdm": flags.training.disable_tqdm}
    plan, flags = decide_and_build(values, facts, training_batches(flags.training, train_features))
    log_plan(plan, values)
    return plan, flags


def check_output_folders(plan: RunPlan, output_dir: str) -> None:
    """The other folders a run writes into, then its own: found unwritable as their writers open, they would
    end the run after its training, naming --output_dir."""
    if plan.tensorboard and plan.logging_dir is not None:
        check_writable_dir(plan.logging_dir, "--logging_dir")
    if plan.profile_dir is not None:
        check_writable_dir(plan.profile_dir, "--profile_dir")
    check_writable_dir(output_dir)


def build_model(
    flags: Flags, plan: RunPlan, config: PretrainedConfig, trained_before: str | None
) -> torch.nn.Module:
    """The model the plan runs: the process-wide settings its kernels and compiled graphs read set first,
    loaded (from the last checkpoint where an earlier launch trained every step), its dropout masks and
    padding mask as the plan says."""
    attention.apply(plan.attn_backend)
    apply_recompile_limit(plan)
    model_args = flags.model
    if trained_before is not None:
        model_args = replace(model_args, model_name_or_path=trained_before)
    model = load_model(model_args, config, attn_implementation=flags.speed.attn_implementation)
    if plan.dropout_mask == "bulk":
        install_bulk_dropout(model)
    elif plan.compile_scope == "regions":  # the mask, built between the compiled layers, waits for nothing
        attention.mask_every_batch(model)
    return model


def start_of_training(
    args: TrainingArguments,
    replaces: bool,
    resume: str | None,
    data: QAData,
    params: Params,
    overwrite_given: bool,
) -> tuple[str | None, str | None]:
    """(the checkpoint to resume, the one an earlier launch trained every step to): at most one of them,
    decided once the training data is counted (a run that resumes trains: it has training data), the same
    on every rank, and said."""
    trained_before = None
    if resume and trained_every_step(resume, optimizer_steps(args, len(data.train)), args.output_dir, params):
        trained_before, resume = resume, None
    # each rank decided from the folder it sees: one that sees another (a node-local --output_dir without
    # --save_on_each_node) would start from another step, its optimizer and schedule apart from rank 0's
    same_on_every_rank(
        f"where training starts in --output_dir {args.output_dir} (start over, resume from, trained before)",
        (replaces, resume, trained_before),
        "give an --output_dir every node sees, or --save_on_each_node to keep checkpoints on each node",
    )
    if resume:  # said only now: a checkpoint that leaves nothing to train is not resumed
        changes = recipe_changes(args.output_dir, params, None)
        refuse_ignored_changes(resume, changes)
        say_resume(resume, args.resume_from_checkpoint, changes, overwrite_given)
    return resume, trained_before


def log_plan(plan: RunPlan, values: FlagValues) -> None:
    """PLAN, then UNUSED naming the flags given whose subject the plan leaves off."""
    logger.info(plan.log_line())
    if unused := unused_flags(values, plan):
        logger.info("UNUSED %s", " ".join(unused))  # as PLAN: once a node


def train(run: Run, stop: StopRequest) -> bool:
    """Train (resuming from a checkpoint when there is one); False when a stop signal ended it at a
    checkpoint."""
    trainer, out = run.trainer, run.args.output_dir
    if run.trained_before is not None:
        take_trained_state(trainer.state, run.trained_before)
        if trainer.is_world_process_zero():
            logger.warning(
                "TRAINED_BEFORE checkpoint=%s (the training's last step: an earlier launch trained every "
                "step; this one saves its model, then evaluates and predicts as asked)",
                run.trained_before,
            )
        with guarded("train", out, run.oom_context):
            save_model(trainer)
        return True

    def current_checkpoint() -> str:
        """Where a write failing in training was going: the checkpoint of the step reached."""
        return checkpoint_dir(out, trainer.state.global_step)

    resumed_step = 0
    if run.resume:
        resumed_step = checkpoint_state(run.resume).global_step
    with guarded("train", current_checkpoint, run.oom_context):
        outcome = trainer.train(resume_from_checkpoint=run.resume)
    if run.preemption.stopped_at_step is not None:
        # no rank leaves before the checkpoint is on disk: a launcher that kills the job on the
        # first exit (srun --kill-on-bad-exit) would otherwise cut the main rank's save short
        trainer.accelerator.wait_for_everyone()
        stopped = Stopped(
            signal=stop.name,
            global_step=trainer.state.global_step,
            checkpoint=current_checkpoint(),
        )
        if trainer.is_world_process_zero():
            again = "the same command"
            if run.flags.data.overwrite_output_dir:  # skipped by a Slurm requeue only: by hand, a start over
                again = "it again without --overwrite_output_dir"
            logger.warning(
                "PREEMPTED signal=%s global_step=%d checkpoint=%s exit_code=%d (run %s to resume)",
                stop.name,
                trainer.state.global_step,
                stopped.checkpoint,
                EXIT_PREEMPTED,
                again,
            )
        log_compiled(run.trainer)
        record(run, Status.PREEMPTED, EXIT_PREEMPTED, stopped=stopped)
        return False
    with guarded("train", out, run.oom_context):
        save_model(trainer)
        metrics = {**outcome.metrics, "train_samples": len(run.data.train)}
        efficiency = train_efficiency(
            real_lengths(run.data.train),
            launch_epochs(trainer.state, resumed_step),
            float(metrics["train_runtime"]),
            run.shape,
            run.plan.gpu_name or "cpu",
            run.plan.world_size,
            run.plan.precision,
            run.plan.tf32,
        )
        # the record's: a resumed launch's train_runtime is its own alone, and the run tables say so
        run.results.update(metrics, **efficiency, train_resumed_from_step=resumed_step)
        save_results(trainer, "train", metrics)
        save_trainer_state(trainer)
    return True


def save_model(trainer: QuestionAnsweringTrainer) -> None:
    """The final model in --output_dir, readable as every other output (safetensors writes it 0600)."""
    trainer.save_model()
    if trainer.args.should_save:
        readable_as_umask_allows(trainer.args.output_dir)


def launch_epochs(state: TrainerState, resumed_step: int) -> float:
    """The epochs this launch trained, as the Trainer counts its samples/s: the run's epochs times the share
    of its optimizer steps trained since the checkpoint it resumed from (a resumed launch's speed is its
    own, also where the batch size changed and the Trainer fast-forwarded by the new one's epochs)."""
    return float(state.epoch or 0.0) * (state.global_step - resumed_step) / max(state.max_steps, 1)


def evaluate(run: Run, stop: StopRequest) -> None:
    """EM/F1 on the validation split, with the prediction files."""
    stop.note_outside_training()
    with guarded("eval", run.args.output_dir, run.oom_context):
        metrics = run.trainer.evaluate()
    metrics["eval_samples"] = len(run.data.eval_features)
    run.results.update(metrics)
    save_results(run.trainer, "eval", metrics)


def predict(run: Run) -> None:
    """Answers for the test split (scored too when it has answers), with the prediction files."""
    with guarded("predict", run.args.output_dir, run.oom_context):
        output = run.trainer.predict(run.data.predict_features, run.data.predict_examples)
    metrics = {**output.metrics, "predict_samples": len(run.data.predict_features)}
    run.results.update(metrics)
    save_results(run.trainer, "predict", metrics)


def log_compiled(trainer: QuestionAnsweringTrainer) -> None:
    """`COMPILE graphs=N batch_shapes=M` on rank 0 of a compiled run, finished or stopped: the graphs built
    against the batch shapes seen."""
    if trainer.is_world_process_zero() and (compiled := trainer.compiled_steps.summary()):
        logger.info(compiled)


def report(run: Run) -> None:
    """Memory report, run_summary.json, and the closing KEY=value lines (WALL_CLOCK_SECONDS last)."""
    wall = time.time() - process_start_time()
    # every rank: the memory report gathers every rank's figures
    memory = finish_observability(run.trainer, run.flags, run.plan, run.params, run.shape, run.results, wall)
    log_compiled(run.trainer)
    ended = record(run, Status.OK, EXIT_OK, wall=wall, memory=Memory.of(memory) if memory else None)
    if ended is not None:
        for line in ended.closing_lines():
            print(line, flush=True)


def record(
    run: Run,
    status: Status,
    exit_code: int,
    wall: float | None = None,
    memory: Memory | None = None,
    stopped: Stopped | None = None,
    error: str | None = None,
) -> RunRecord | None:
    """The run's record, written as run_summary.json, on rank 0 (None elsewhere): how the run ended, where it
    ran, what it planned and used, what came out."""
    if not run.trainer.is_world_process_zero():
        return None
    ended = RunRecord(
        status=status,
        exit_code=exit_code,
        wall_clock_seconds=time.time() - process_start_time() if wall is None else wall,
        environment=Environment.of(run.facts),
        params=run.params,
        plan=run.plan,
        effective=run.effective,
        results=Recorded(**run.results),
        memory=memory,
        stopped=stopped,
        error=error,
    )
    try:
        ended.write(run.args.output_dir)
    except OSError as err:  # a failure record must never hide the failure itself
        logger.warning("could not write %s: %s", SUMMARY_FILE, err)
    return ended


def cli() -> int:
    """Entry point: clear messages (no traceback) for the user's own mistakes and for resources; exit codes in
    qa_hpc/exit_codes.env (1 with a traceback for anything else)."""
    try:
        code = main()
        # after main's objects are gone: a DDP reducer freed after its process group was destroyed
        # would tear the group down while holding the GIL, and gloo's threads can deadlock on that
        end_process_group()
        return code
    except Exception as err:  # noqa: BLE001 - classified; unknown errors keep their traceback
        code, message = classify(err)
        if message is not None:
            print(f"ERROR: {message}", file=sys.stderr, flush=True)
            return code
        # say which rank failed (a peer that died shows up here as a failed collective), then the traceback
        first = (str(err).strip().splitlines() or [""])[0]
        print(
            f"ERROR: rank {launch_env().rank} (pid {os.getpid()}) failed: {type(err).__name__}: {first}",
            file=sys.stderr,
            flush=True,
        )
        raise


if __name__ == "__main__":
    with exit_code_noted():
        sys.exit(cli())
