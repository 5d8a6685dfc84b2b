"""Stop cleanly when the scheduler says time is up (SIGTERM, or SIGUSR1 with `#SBATCH --signal=USR1@120`),
and resume where the run stopped. The handler only sets a flag: handlers run between two bytecodes, so I/O
or collectives there could deadlock. Every `vote_every` optimizer steps the ranks vote (an all_reduce, which
syncs host and device on GPUs) and all stop at the same step with a full checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from qa_hpc.atomic_io import read_json_object, readable_as_umask_allows, write_json_atomic
from qa_hpc.dist import launch_env, max_over_ranks
from qa_hpc.errors import EXIT_PREEMPTED, UsageError
from qa_hpc.outputs import (
    LAUNCH_MARK,
    MEMORY_FILE,
    PROFILER_DIR,
    SUMMARY_FILE,
    TRAINER_STATE_FILE,
    checkpoint_dir,
    checkpoint_step,
    checkpoints_oldest_first,
)
from qa_hpc.record import Params, RunRecord

logger = logging.getLogger(__name__)


class StopRequest:
    """Records that a stop signal arrived. The handler does nothing else."""

    signum: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, lambda signum, frame: setattr(self, "signum", signum))

    requested = property(lambda self: self.signum is not None)
    name = property(lambda self: signal.Signals(self.signum).name if self.requested else "none")
    noted = False  # note_outside_training logged it

    def note_outside_training(self) -> None:
        """One line, the first time it is called after a signal: evaluation and prediction cannot be
        checkpointed part-way (the final model is saved), so the run finishes. Called before evaluation and
        again at the run's end, so that a signal that arrived while it evaluated is said too."""
        if self.requested and not self.noted:
            self.noted = True
            logger.warning("STOP_REQUESTED signal=%s outside training: finishing the run", self.name)


def apply_collective_timeout(seconds: float) -> None:
    """Make --ddp_timeout the timeout of every collective, gloo included: transformers passes it to the
    process group only for GPU backends, so a frozen rank of a CPU job would hang for torch's 30-minute
    default."""
    if dist.is_available() and dist.is_initialized():
        # the default group (private: listed in qa_hpc/private_api.py)
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))
        logger.info("COLLECTIVE_TIMEOUT_SECONDS=%g backend=%s", seconds, dist.get_backend())


class PreemptionCallback(TrainerCallback):
    """Every vote_every optimizer steps: if any rank was signalled, save a checkpoint and stop training."""

    def __init__(self, request: StopRequest, vote_every: int) -> None:
        self.request = request
        self.vote_every = vote_every
        # None: training was not stopped by a signal
        self.stopped_at_step: int | None = None

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> TrainerControl:
        # not a voting step: no collective, no host-device sync
        if state.global_step % self.vote_every != 0:
            return control
        # the signal's number, so that a rank it did not reach (signals reach the ranks one after another)
        # names it too: rank 0 logs and records the stop
        signum = max_over_ranks(self.request.signum or 0, args.device)
        if signum:
            if not self.request.requested:
                self.request.signum = signum
            control.should_save = control.should_training_stop = True
            self.stopped_at_step = state.global_step
            logger.warning(
                "STOP_REQUESTED signal=%s global_step=%d: saving a checkpoint, then exiting with %d",
                self.request.name,
                state.global_step,
                EXIT_PREEMPTED,
            )
        return control


class ReadableCheckpoints(TrainerCallback):
    """Each checkpoint's weights readable as the umask allows, as the final model's (safetensors writes them
    0600): a checkpoint may be the only copy of a run's weights, for the group to load or resume from."""

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> TrainerControl:
        if args.should_save:
            readable_as_umask_allows(checkpoint_dir(args.output_dir, state.global_step))
        return control


def checkpoint_state(checkpoint: str) -> TrainerState:
    """The Trainer's state a checkpoint holds (written last: a checkpoint cut short has none readable);
    OSError or ValueError where it cannot be read."""
    return TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_FILE))


def take_trained_state(state: TrainerState, checkpoint: str) -> None:
    """A launch that trains nothing, an earlier one having trained every step (TRAINED_BEFORE): the Trainer's
    step, epoch and log history as that checkpoint holds them, so that the evaluation of its model is logged
    (TensorBoard, the results' epoch, the last loss among the run's totals) at the training's last step,
    not at step 0. Each rank keeps its own is_*_process_zero."""
    done = checkpoint_state(checkpoint)
    state.global_step = done.global_step
    state.epoch = done.epoch
    state.max_steps = done.max_steps
    state.log_history = done.log_history


def last_complete_checkpoint(output_dir: str, name_incomplete: bool = True) -> str | None:
    """The newest checkpoint-N in output_dir with a readable trainer_state.json (the Trainer writes it last),
    naming those without unless told not to: a job killed while saving leaves one (transformers'
    get_last_checkpoint would resume from it). Named by each node's first process: every rank looks at the
    same folder, which may be node-local."""
    for path in reversed(checkpoints_oldest_first(output_dir)):
        try:
            checkpoint_state(path)
            return path
        except (OSError, ValueError):
            if name_incomplete and launch_env().local_rank == 0:
                logger.warning(
                    "INCOMPLETE_CHECKPOINT path=%s (no readable trainer_state.json); not resuming from it",
                    path,
                )
    return None


def replaces_output_dir(output_dir: str, overwrite_output_dir: bool) -> bool:
    """Whether this launch replaces what --output_dir holds: --overwrite_output_dir, unless the launch is a
    requeue (SLURM_RESTART_COUNT > 0) of the Slurm job whose launch marked the folder (LAUNCH_MARK, written
    at the launch, so a launch killed without a word counts too) and left a checkpoint. Its first launch
    replaced the earlier run; the requeued job runs the same command, flag and all, and must resume the
    checkpoint it saved, not remove it and start over."""
    job, restarts = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_RESTART_COUNT", "0")
    if not overwrite_output_dir or not job or restarts in ("", "0"):
        return overwrite_output_dir
    # quiet: checkpoint_to_resume looks again, and names an incomplete checkpoint once
    if (
        launch_mark(output_dir).get("slurm_job_id") != job
        or last_complete_checkpoint(output_dir, name_incomplete=False) is None
    ):
        return True
    logger.info(
        "OVERWRITE skipped: job %s restart %s is a requeue of the job whose first launch replaced the "
        "earlier run; resuming its own checkpoints",
        job,
        restarts,
    )
    return False


# The parameters that make a training what it is: a launch that asks for others means to train, and a
# checkpoint at the training's last step would leave it nothing to train with them (trained_every_step).
# The schedule is one of them: a resume under more epochs goes on with the learning rate of the longer
# schedule's step, not the one an uninterrupted run of either had.
RECIPE = (
    "model",
    "dataset",
    "version_2_with_negative",
    "max_train_samples",
    "max_seq_length",
    "doc_stride",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "world_size",
    "learning_rate",
    "epochs",
    "max_steps",
)


def recipe_of(params: Params) -> dict[str, Any]:
    """The RECIPE in `params`; the epochs None where --max_steps is given (the Trainer counts its steps
    then, whatever the epochs)."""
    recipe = {name: getattr(params, name) for name in RECIPE}
    if params.trains_by_steps:
        recipe["epochs"] = None
    return recipe


def clear_for_launch(training_args: TrainingArguments, overwrite_output_dir: bool, params: Params) -> None:
    """What an earlier launch left that this training launch replaces, removed once the inputs are checked
    and the model and Trainer built, by each process that saves (with --save_on_each_node, one a node: on a
    shared folder the first removes, the others find nothing). That launch's record: a launch then killed
    leaves none, and the tables show it incomplete rather than as the earlier launch ended. Under
    --overwrite_output_dir the checkpoints of the run it replaces: else a later run of the command without
    the flag, a requeued job among them, would resume from the newest of them, the other run's weights and
    step. Then the folder is marked as this launch's (LAUNCH_MARK: its Slurm job; the checkpoint it was
    asked to start from, so that a later launch of the same command goes on from where this one gets; and
    its RECIPE, which a launch killed before its record still leaves)."""
    if not (training_args.do_train and training_args.should_save):
        return
    Path(training_args.output_dir, SUMMARY_FILE).unlink(missing_ok=True)
    old = checkpoints_oldest_first(training_args.output_dir) if overwrite_output_dir else []
    for path in old:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)
    if old:
        logger.warning(
            "OVERWRITE removed=%s (--overwrite_output_dir: the checkpoints of the run this one replaces)",
            ",".join(os.path.basename(path) for path in old),
        )
    given = training_args.resume_from_checkpoint
    mark = {
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "resume_from_checkpoint": os.path.abspath(given) if given else None,
        "recipe": recipe_of(params),
    }
    write_json_atomic(Path(training_args.output_dir, LAUNCH_MARK), mark)


# what a launch leaves in --output_dir before its first checkpoint: its record, memory report, TensorBoard
# events and profiler traces (the defaults' folders), and the marker a demo job writes at its end
# (scripts/env_setup.sh qa_report). A launch that failed or was killed there is started again by the same or
# the corrected command, not refused for them.
LAUNCH_FILES = frozenset({SUMMARY_FILE, MEMORY_FILE, "runs", PROFILER_DIR, "OFFLINE_DEMO.txt"})


def checkpoint_to_resume(training_args: TrainingArguments, overwrite_output_dir: bool) -> str | None:
    """What a non-empty --output_dir means (transformers 5 has no overwrite_output_dir):
    --resume_from_checkpoint wins, unless an earlier launch of the command went on from it there
    (launch_mark), and refused among another run's checkpoints; else resume from its last complete checkpoint
    (a requeued job continues by itself); other files than a launch's own (LAUNCH_FILES): refuse, unless
    --overwrite_output_dir. An evaluation-only run may write anywhere but into a training run's folder
    (training_traces)."""
    out, given = training_args.output_dir, training_args.resume_from_checkpoint
    if given and training_args.do_train:
        return _from_given(given, out, overwrite_output_dir)
    if not os.path.isdir(out) or overwrite_output_dir:
        return None
    if not training_args.do_train:
        if trained := training_traces(out):
            raise UsageError(
                f"--output_dir {out} holds a training run ({trained}), whose record and results this "
                "evaluation-only run would write over; give the evaluation its own --output_dir "
                f"(--model_name_or_path {out}, or one of its checkpoints, still loads the trained model), or "
                "add --overwrite_output_dir"
            )
        return None
    if (last := last_complete_checkpoint(out)) is not None:
        return last
    refuse_leftovers(out)
    return None


def refuse_leftovers(out: str) -> None:
    """Refuse a training into a folder that holds more than a launch's own files (LAUNCH_FILES) and no
    checkpoint to go on from: another run's model and results, or the user's files."""
    if not os.path.isdir(out):
        return
    if leftovers := sorted(n for n in os.listdir(out) if not n.startswith(".") and n not in LAUNCH_FILES):
        raise UsageError(
            f"--output_dir {out} is not empty ({', '.join(leftovers[:5])}) and holds no checkpoint to "
            "resume from; add --overwrite_output_dir to train into it anyway, or choose another "
            "--output_dir"
        )


def _from_given(given: str, out: str, overwrite_output_dir: bool) -> str:
    """Where a training given --resume_from_checkpoint starts: there, unless a launch of the same command
    marked --output_dir (launch_mark) and saved a later checkpoint there (a requeue, or the command run
    again after a stop: on from where it got, not back to `given`, its steps since lost and, with
    --save_total_limit, their checkpoints; `given` itself may be rotated away by then). Refused: `given`
    among the checkpoints --overwrite_output_dir removes, and checkpoints of another run in --output_dir,
    any outside `given`'s own folder, or past it inside it (a later launch would take them for its own)."""
    marked_start = launch_mark(out).get("resume_from_checkpoint")
    ours = not overwrite_output_dir and marked_start == os.path.abspath(given)
    last = last_complete_checkpoint(out, name_incomplete=False) if ours else None
    try:
        start = checkpoint_state(given).global_step
    except (OSError, ValueError) as err:
        if last is not None:
            return last
        raise UsageError(
            f"--resume_from_checkpoint {given}: not a checkpoint (no readable trainer_state.json there: "
            f"{getattr(err, 'strerror', None) or err}); give a checkpoint-N folder a training run "
            "saved, or leave the flag out to resume from the last checkpoint in --output_dir"
        ) from err
    inside = Path(out).resolve() in Path(given).resolve().parents
    if overwrite_output_dir:
        if inside:
            raise UsageError(
                f"--overwrite_output_dir removes the checkpoints in --output_dir {out}, and "
                f"--resume_from_checkpoint {given} is one of them: give one of the two flags"
            )
        return given
    if last is not None and checkpoint_state(last).global_step > start:
        return last
    others = [path for path in checkpoints_oldest_first(out) if not inside or checkpoint_step(path) > start]
    if others and not ours:
        what = "remove the checkpoints past it, or choose another --output_dir"
        if not inside:
            what = "add --overwrite_output_dir to replace them, or choose another --output_dir"
        raise UsageError(
            f"--output_dir {out} holds checkpoints of another run than one from --resume_from_checkpoint "
            f"{given} ({os.path.basename(others[-1])}), which a later launch of this command would take "
            f"for its own: {what}"
        )
    if not inside and not ours:  # a finished run's model and results, say, without its checkpoints
        refuse_leftovers(out)
    return given


def say_resume(
    checkpoint: str, given: str | None, changes: dict[str, tuple[Any, Any]], overwrite_given: bool = False
) -> None:
    """RESUME_FROM and why, and how to start over where the command does not already say it (a requeue that
    skips its --overwrite_output_dir: OVERWRITE skipped says why). RESUME_INEXACT where the run will not
    equal an uninterrupted one, as a resume from a full checkpoint does: the checkpoint holds no optimizer
    state (saved under --save_only_model: the Trainer starts the optimizer's moments and the learning-rate
    schedule over), or this launch `changes` the training's RECIPE (recipe_changes: the checkpoint's
    schedule and data position are then another run's; more processes skip a share of the data, or train
    past the end)."""
    why = "--resume_from_checkpoint" if given == checkpoint else "checkpoint found in --output_dir"
    if given and given != checkpoint:
        why += f", where a launch went on from --resume_from_checkpoint {given}"
    if not overwrite_given:
        why += "; --overwrite_output_dir to start over"
    logger.info("RESUME_FROM=%s (%s)", checkpoint, why)
    inexact = [f"this launch changes its training: {shown(changes)}"] if changes else []
    if not holds_optimizer_state(checkpoint):
        inexact.append(
            "no optimizer state: saved with --save_only_model; the optimizer's moments and the learning-rate "
            "schedule start over"
        )
    if inexact and launch_env().local_rank == 0:  # once a node, as its folder may be its own
        logger.warning("RESUME_INEXACT checkpoint=%s (%s)", checkpoint, "; ".join(inexact))


def launch_mark(output_dir: str) -> dict[str, Any]:
    """What the last training launch noted in `output_dir` (clear_for_launch): its Slurm job, the checkpoint
    it was asked to start from, its RECIPE; {} where no launch marked the folder, or the mark is unreadable
    (each key may be missing: a mark of an older version)."""
    try:
        return read_json_object(os.path.join(output_dir, LAUNCH_MARK))
    except (OSError, ValueError):
        return {}


def holds_optimizer_state(checkpoint: str) -> bool:
    """Whether the Trainer saved its optimizer's state there: optimizer.pt (optimizer.bin, or an optimizer_0/
    folder, when sharded); a checkpoint saved under --save_only_model has none."""
    return any(name.startswith("optimizer") for name in os.listdir(checkpoint))


def training_traces(output_dir: str) -> str | None:
    """What in `output_dir` says a training run lives there, in words; None where nothing does. Every training
    launch marks the folder (LAUNCH_MARK), whatever became of it (preempted, failed, finished); a folder of an
    older version has its checkpoints or its record's training time."""
    if checkpoints := checkpoints_oldest_first(output_dir):
        return f"its checkpoints: {os.path.basename(checkpoints[-1])}"
    if os.path.isfile(os.path.join(output_dir, LAUNCH_MARK)):
        return f"the mark its launches leave: {LAUNCH_MARK}"
    record = RunRecord.load(os.path.join(output_dir, SUMMARY_FILE))
    if record is not None and record.results.train_runtime is not None:
        return f"its record: {SUMMARY_FILE}"
    return None


def trained_every_step(checkpoint: str, total_steps: int, output_dir: str, params: Params) -> bool:
    """Whether `checkpoint` is the training's last step: an earlier launch trained every step (it was
    stopped at that step, or killed while it evaluated), so this one goes on with that checkpoint's model;
    resuming from it would train no step (or, under --max_steps, one past the limit, which the Trainer
    checks after a step). Refused, before anything is replaced: the same command again where --output_dir
    holds the record of a run that ended ok (it trained, or went on from that checkpoint); a launch that
    changes the training's RECIPE (a diverged run trained again at a lower learning rate), which would
    train nothing with the change; and a checkpoint past this launch's steps, a longer schedule's (or one
    of fewer processes), whose model is not this training's end."""
    step = checkpoint_state(checkpoint).global_step
    if step < total_steps:
        return False
    record = RunRecord.load(os.path.join(output_dir, SUMMARY_FILE))
    # not an evaluation-only run's record (into this folder under --overwrite_output_dir)
    if record is not None and record.ended_training:
        raise UsageError(
            f"--output_dir {output_dir} holds a finished training ({SUMMARY_FILE}: status ok) and its last "
            f"checkpoint {checkpoint} leaves nothing to train. To evaluate the trained model: "
            f"--model_name_or_path {output_dir} --do_eval without --do_train, into another --output_dir; "
            "to train again: --overwrite_output_dir or another --output_dir"
        )
    changes = recipe_changes(output_dir, params, record)
    if step > total_steps:
        changed = f", the training's recipe changed ({shown(changes)})" if changes else ""
        raise UsageError(
            f"--output_dir {output_dir}: its last checkpoint {checkpoint} is at step {step}, past the "
            f"{total_steps} steps this launch counts{changed}: resume it with the schedule it had (its "
            "--num_train_epochs or --max_steps, and processes), or add --overwrite_output_dir, or choose "
            "another --output_dir"
        )
    if changes:
        raise UsageError(
            f"--output_dir {output_dir}: its last checkpoint {checkpoint} ends a training that this launch "
            f"changes ({shown(changes)}) and would train nothing with the change: add "
            "--overwrite_output_dir, or choose another --output_dir"
        )
    return True


def refuse_ignored_changes(checkpoint: str, changes: dict[str, tuple[Any, Any]]) -> None:
    """A resume goes on with the checkpoint's optimizer and learning-rate schedule, which the Trainer
    restores over the flags: a --learning_rate changed since would be logged and recorded, and never used.
    Refused (a rolled-back diverged run trained on at the old rate)."""
    if "learning_rate" in changes and holds_optimizer_state(checkpoint):
        then, now = changes["learning_rate"]
        raise UsageError(
            f"--learning_rate {now}: {checkpoint} goes on with the schedule of --learning_rate {then}, which "
            "a resume restores with the optimizer; to train at another rate, start over "
            "(--overwrite_output_dir, or another --output_dir with --model_name_or_path CHECKPOINT)"
        )


def recipe_changes(output_dir: str, params: Params, record: RunRecord | None) -> dict[str, tuple[Any, Any]]:
    """What this launch's `params` change of the RECIPE of the training in `output_dir` (trained_with):
    name -> (then, now)."""
    now = recipe_of(params)
    trained = trained_with(output_dir, record)
    return {name: (then, now[name]) for name, then in trained.items() if then != now[name]}


def shown(changes: dict[str, tuple[Any, Any]]) -> str:
    """The changes in words: `--learning_rate 0.001 -> 3e-05, processes 8 -> 16`."""
    labels = {"world_size": "processes", "dataset": "data", "epochs": "--num_train_epochs"}
    return ", ".join(
        f"{labels.get(name, '--' + name)} {then} -> {now}" for name, (then, now) in changes.items()
    )


def trained_with(output_dir: str, record: RunRecord | None) -> dict[str, Any]:
    """The RECIPE of the training in `output_dir`: its last launch's mark has all of it, also where the
    launch was killed before its record; a folder of an older version, the record's that it has."""
    recipe = launch_mark(output_dir).get("recipe")
    if isinstance(recipe, dict):
        return {name: recipe[name] for name in RECIPE if name in recipe}
    if record is None:
        return {}
    return {name: then for name, then in recipe_of(record.params).items() if then is not None}
