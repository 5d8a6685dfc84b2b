"""Reliability without a process: atomic writes, stop requests, which checkpoint to resume, clear errors.
(Killed writers, real disk-full and out-of-memory runs, preemption and dying ranks: tests/e2e.)
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import resource
import shutil
import signal
import socket
from pathlib import Path

import pytest
import torch
from fixtures.outputs import temp_files
from fixtures.procs import tiny_flags
from transformers import TrainerState, TrainingArguments

from qa_hpc.atomic_io import write_json_atomic
from qa_hpc.device import read_device_facts
from qa_hpc.errors import (
    EXIT_OOM,
    BatchContext,
    OutputError,
    UsageError,
    check_writable_dir,
    guarded,
    write_failure,
)
from qa_hpc.flags import decide_and_build, read_flags
from qa_hpc.outputs import LAUNCH_MARK
from qa_hpc.preemption import (
    StopRequest,
    checkpoint_to_resume,
    clear_for_launch,
    last_complete_checkpoint,
    recipe_changes,
    refuse_ignored_changes,
    replaces_output_dir,
    say_resume,
    trained_every_step,
)
from qa_hpc.record import Params


def test_atomic_write_keeps_the_old_file_on_failure_and_removes_only_dead_writers_temps(
    tmp_path: Path,
) -> None:
    target = tmp_path / "x.json"
    write_json_atomic(target, {"eval_f1": 88.1})
    with pytest.raises(TypeError):  # serialized before any file is touched
        write_json_atomic(target, {"eval_f1": object()})
    assert json.loads(target.read_text()) == {"eval_f1": 88.1}
    live = tmp_path / f".x.json.{socket.gethostname()}-{os.getpid()}.abc.tmp"
    # a pid above the kernel's limit (pid_max is at most 2**22) never runs:
    # its temp file is left by a dead writer
    dead = tmp_path / f".x.json.{socket.gethostname()}-{2**22 + 1}.abc.tmp"
    live.write_text("partial")
    dead.write_text("partial")
    old = os.umask(0o027)  # group members of a project share results: not a temp file's 0600
    try:
        write_json_atomic(target, {"a": 1})
    finally:
        os.umask(old)
    assert temp_files(tmp_path) == [live.name] and target.stat().st_mode & 0o777 == 0o640
    with pytest.raises(OutputError, match="cannot write .*x.json/r.json: "):
        write_json_atomic(target / "r.json", {"a": 1})


def test_stop_request_handler_only_sets_a_flag() -> None:
    request = StopRequest()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        request.install()
        assert not request.requested
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered before the next bytecode
        assert request.requested and request.name == "SIGUSR1"
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_resume_skips_an_incompletely_written_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job killed while saving leaves a checkpoint without a readable trainer_state.json."""
    for step, state in ((4, '{"global_step": 4}'), (6, '{"global_step": 6}'), (8, '{"global_st')):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-9").mkdir()  # killed before anything was written
    with caplog.at_level("WARNING"):
        assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-6")
    assert f"INCOMPLETE_CHECKPOINT path={tmp_path / 'checkpoint-8'}" in caplog.text
    caplog.clear()  # a node's other processes look at the same folder: its first one names what it found
    with pytest.MonkeyPatch.context() as patched, caplog.at_level("WARNING"):
        patched.setenv("LOCAL_RANK", "1")
        assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-6")
    assert "INCOMPLETE_CHECKPOINT" not in caplog.text


def test_a_requeue_with_overwrite_names_an_incomplete_checkpoint_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requeue of a job killed while saving: whether it replaces the folder and what it resumes are two
    looks at its checkpoints, and the log names the one cut short once."""
    (tmp_path / "checkpoint-8").mkdir()
    (tmp_path / "checkpoint-8" / "trainer_state.json").write_text('{"global_step": 8}')
    (tmp_path / "checkpoint-9").mkdir()  # killed before anything was written
    (tmp_path / LAUNCH_MARK).write_text(json.dumps({"slurm_job_id": "7"}))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", do_train=True)
    with caplog.at_level("WARNING"):
        replaces = replaces_output_dir(str(tmp_path), overwrite_output_dir=True)
        assert checkpoint_to_resume(args, replaces) == str(tmp_path / "checkpoint-8")
    assert caplog.text.count("INCOMPLETE_CHECKPOINT") == 1


def test_resume_takes_the_highest_step_not_the_last_name(tmp_path: Path) -> None:
    """checkpoint-10 is newer than checkpoint-9 (a name sort would say otherwise); other names are no
    checkpoint."""
    for step in (9, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    (tmp_path / "checkpoint-notes").mkdir()
    (tmp_path / "checkpoint-99.txt").write_text("not a folder")
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")


def test_a_resumed_launch_counts_the_epochs_it_trained_as_the_trainer_does() -> None:
    """2 epochs; the first launch stopped after 1 epoch at batch 4 (step 17 of 17 a epoch); resumed at batch
    8 (9 steps a epoch, 18 in all), the Trainer fast-forwards past 1 epoch and 8 batches and trains step 18:
    one step's share of the 2 epochs (it counts 136 samples x 1/18), not the 1 epoch the states differ by."""
    import run_qa

    resumed = TrainerState(epoch=2.0, global_step=18, max_steps=18)
    assert run_qa.launch_epochs(resumed, resumed_step=17) == pytest.approx(2.0 / 18)
    assert run_qa.launch_epochs(resumed, resumed_step=0) == 2.0  # a launch that trained every step


def test_what_an_output_dir_holds_decides_resume_start_or_refusal(tmp_path: Path) -> None:
    """A launch that failed or was killed before its first checkpoint (its record, memory report,
    TensorBoard events, profiler traces, a demo job's marker) is started again by the corrected command; a
    --resume_from_checkpoint that is no checkpoint stops before anything loads; an evaluation-only run does
    not replace a training run's record."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("runs", "profiler"):
        (out / name).mkdir()
    (out / "memory.json").write_text("{}")
    (out / "OFFLINE_DEMO.txt").write_text("OFFLINE DEMO")  # a demo job's marker, written at its end
    (out / "run_summary.json").write_text(json.dumps({"status": "failed", "exit_code": 3, "results": {}}))

    def args(**kwargs: object) -> TrainingArguments:
        return TrainingArguments(output_dir=str(out), report_to="none", **kwargs)

    assert checkpoint_to_resume(args(do_train=True), overwrite_output_dir=False) is None
    (out / "notes.txt").write_text("mine")  # anything else is the user's
    with pytest.raises(UsageError, match=r"is not empty \(notes.txt\) and holds no checkpoint"):
        checkpoint_to_resume(args(do_train=True), overwrite_output_dir=False)

    nowhere = tmp_path / "checkpoint-9"
    with pytest.raises(UsageError, match=f"--resume_from_checkpoint {nowhere}: not a checkpoint"):
        checkpoint_to_resume(args(do_train=True, resume_from_checkpoint=str(nowhere)), False)
    nowhere.mkdir()
    (nowhere / "trainer_state.json").write_text('{"global_st')  # cut short
    with pytest.raises(UsageError, match=f"--resume_from_checkpoint {nowhere}: not a checkpoint"):
        checkpoint_to_resume(args(do_train=True, resume_from_checkpoint=str(nowhere)), False)

    assert checkpoint_to_resume(args(do_eval=True), overwrite_output_dir=False) is None  # a failed record
    trained = {"status": "ok", "exit_code": 0, "results": {"train_runtime": 12.5, "eval_f1": 40.0}}
    (out / "run_summary.json").write_text(json.dumps(trained))
    with pytest.raises(UsageError, match=rf"--output_dir {out} holds a training run \(its record: "):
        checkpoint_to_resume(args(do_eval=True), overwrite_output_dir=False)
    assert checkpoint_to_resume(args(do_eval=True), overwrite_output_dir=True) is None


def test_the_same_command_goes_on_from_where_a_launch_started_at_a_given_checkpoint_got(tmp_path: Path):
    """--resume_from_checkpoint names where the run starts: the launch marks the folder with it, and the same
    command run again (after a stop, or requeued by Slurm) resumes the newest checkpoint that launch saved,
    not the given one again (every step since lost, and with --save_total_limit their checkpoints: the given
    one too, when it was in the folder). Beside another run's checkpoints it is refused: any outside its own
    folder, or past it inside it (a run rolled back to an earlier checkpoint), which a later launch would
    take for its own; --overwrite_output_dir starts over from it, unless it is one of the checkpoints the
    flag removes."""
    start = tmp_path / "other" / "checkpoint-18"
    out = tmp_path / "out"

    def save(checkpoint: Path, step: int) -> None:
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))

    def args(given: Path) -> TrainingArguments:
        return TrainingArguments(
            output_dir=str(out), report_to="none", do_train=True, resume_from_checkpoint=str(given)
        )

    def resume(given: Path = start, overwrite: bool = False) -> str | None:
        return checkpoint_to_resume(args(given), overwrite_output_dir=overwrite)

    def launch(given: Path) -> None:  # as run_qa.py marks the folder
        clear_for_launch(args(given), overwrite_output_dir=False, params=Params())

    save(start, 18)
    save(out / "checkpoint-177", 177)
    with pytest.raises(UsageError, match=r"holds checkpoints of another run .* \(checkpoint-177\), which a"):
        resume()  # no launch of this command marked the folder
    launch(start)
    assert json.loads((out / LAUNCH_MARK).read_text())["resume_from_checkpoint"] == str(start)
    assert resume() == str(out / "checkpoint-177")
    assert resume(overwrite=True) == str(start)  # starts over from it, as asked
    with pytest.raises(UsageError, match="--overwrite_output_dir removes the checkpoints in --output_dir"):
        resume(out / "checkpoint-177", overwrite=True)
    (out / "checkpoint-177" / "trainer_state.json").write_text(json.dumps({"global_step": 12}))
    assert resume() == str(start)  # nothing saved past the given step yet

    # rolled back inside the folder: the checkpoints past the given one are another run's
    shutil.rmtree(out)
    for step in (500, 1000):
        save(out / f"checkpoint-{step}", step)
    back = out / "checkpoint-500"
    with pytest.raises(
        UsageError, match=r"\(checkpoint-1000\), which a later launch .*: remove the checkpoints past it"
    ):
        resume(back)
    shutil.rmtree(out / "checkpoint-1000")
    assert resume(back) == str(back)
    launch(back)
    save(out / "checkpoint-700", 700)
    assert resume(back) == str(out / "checkpoint-700")
    shutil.rmtree(back)  # rotated away (--save_total_limit 1): the requeue still goes on
    assert resume(back) == str(out / "checkpoint-700")

    # a finished run's model and results, its checkpoints deleted: not written over from elsewhere either
    shutil.rmtree(out)
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"")
    with pytest.raises(UsageError, match=r"is not empty \(model.safetensors\) and holds no checkpoint"):
        resume()


def test_a_launch_that_changes_the_recipe_of_its_last_step_checkpoint_is_refused(tmp_path: Path):
    """A checkpoint at the training's last step is gone on from (TRAINED_BEFORE: this launch trains nothing)
    only by a launch of the training it ends: a diverged run trained again at a lower learning rate had its
    diverged model scored again, the new rate unsaid, and a run on more processes (fewer steps) a model of a
    part of its schedule. Another recipe is refused, naming what changed, from the folder's mark (it
    outlives a launch killed before its record), else from an older folder's record."""
    last = tmp_path / "checkpoint-30"
    last.mkdir()
    (last / "trainer_state.json").write_text(json.dumps({"global_step": 30}))
    diverged = {"status": "failed", "exit_code": 2, "results": {}, "params": {"learning_rate": 1e8}}
    (tmp_path / "run_summary.json").write_text(json.dumps(diverged))
    same, lower = Params(learning_rate=1e8, world_size=1), Params(learning_rate=5e-5, world_size=1)
    assert trained_every_step(str(last), 30, str(tmp_path), same)
    assert not trained_every_step(str(last), 40, str(tmp_path), lower)  # a longer run resumes: it trains
    assert not trained_every_step(str(last), 31, str(tmp_path), lower)  # one step short of the end, too
    with pytest.raises(UsageError, match=r"this launch changes \(--learning_rate 100000000.0 -> 5e-05\) and"):
        trained_every_step(str(last), 30, str(tmp_path), lower)
    # an evaluation-only run's record (into this folder, under --overwrite_output_dir) ends no training
    evaluated = {
        "status": "ok",
        "exit_code": 0,
        "results": {"eval_f1": 1.0},
        "params": {"learning_rate": None},
    }
    (tmp_path / "run_summary.json").write_text(json.dumps(evaluated))
    assert trained_every_step(str(last), 30, str(tmp_path), same)
    # killed in its evaluation: no record, the mark has the recipe
    (tmp_path / "run_summary.json").unlink()
    recipe = {"model": None, "learning_rate": 1e8, "world_size": 1, "max_train_samples": None}
    (tmp_path / LAUNCH_MARK).write_text(json.dumps({"slurm_job_id": None, "recipe": recipe}))
    assert trained_every_step(str(last), 30, str(tmp_path), same)
    four = dataclasses.replace(same, world_size=4, max_train_samples=100)
    with pytest.raises(UsageError, match=r"\(--max_train_samples None -> 100, processes 1 -> 4\)"):
        trained_every_step(str(last), 30, str(tmp_path), four)
    assert recipe_changes(str(tmp_path), four, None) == {
        "max_train_samples": (None, 100),
        "world_size": (1, 4),
    }
    # past this launch's steps (a longer schedule's, or one on fewer processes): not the end of this training
    with pytest.raises(UsageError, match=r"is at step 30, past the 20 steps this launch counts: resume it"):
        trained_every_step(str(last), 20, str(tmp_path), same)
    with pytest.raises(
        UsageError, match=r"past the 15 steps this launch counts, the .* \(processes 1 -> 4\): resume"
    ):
        trained_every_step(str(last), 15, str(tmp_path), dataclasses.replace(four, max_train_samples=None))


def test_a_changed_schedule_is_a_changed_recipe(tmp_path: Path) -> None:
    """More epochs after a finished run resume its last checkpoint under the longer schedule: its learning
    rate at that step is the longer run's, not 0 as when it ended, nor what an uninterrupted longer run had
    (RESUME_INEXACT names the change). Fewer steps than a checkpoint holds: refused, naming the change. The
    epochs under --max_steps change nothing: the Trainer counts the steps."""
    last = tmp_path / "checkpoint-30"
    last.mkdir()
    (last / "trainer_state.json").write_text(json.dumps({"global_step": 30}))
    args = TrainingArguments(output_dir=str(tmp_path), do_train=True, report_to=[])
    two = Params(epochs=2.0, max_steps=-1, world_size=1)
    clear_for_launch(args, overwrite_output_dir=False, params=two)
    three = dataclasses.replace(two, epochs=3.0)
    assert recipe_changes(str(tmp_path), three, None) == {"epochs": (2.0, 3.0)}
    assert not trained_every_step(str(last), 45, str(tmp_path), three)
    with pytest.raises(
        UsageError, match=r"past the 15 steps this launch counts, .*\(--num_train_epochs 2.0 -> 1.0\)"
    ):
        trained_every_step(str(last), 15, str(tmp_path), dataclasses.replace(two, epochs=1.0))
    capped = dataclasses.replace(two, max_steps=30)
    clear_for_launch(args, overwrite_output_dir=False, params=capped)
    assert recipe_changes(str(tmp_path), dataclasses.replace(capped, epochs=5.0), None) == {}
    assert recipe_changes(str(tmp_path), dataclasses.replace(capped, max_steps=60), None) == {
        "max_steps": (30, 60)
    }


def test_a_resume_refuses_a_learning_rate_the_checkpoints_schedule_would_override(tmp_path: Path) -> None:
    """The Trainer restores the checkpoint's optimizer and learning-rate schedule over the flags: a new
    --learning_rate (a rolled-back diverged run) would be logged and recorded, and never used. Without the
    optimizer's state (--save_only_model) the schedule starts over at the new rate: it is taken."""
    checkpoint = tmp_path / "checkpoint-8"
    checkpoint.mkdir()
    changed = {"learning_rate": (1e-3, 3e-5)}
    refuse_ignored_changes(str(checkpoint), changed)
    (checkpoint / "optimizer.pt").write_bytes(b"")
    refuse_ignored_changes(str(checkpoint), {"world_size": (8, 16)})  # said: RESUME_INEXACT
    with pytest.raises(UsageError, match=r"^--learning_rate 3e-05: .* schedule of --learning_rate 0.001"):
        refuse_ignored_changes(str(checkpoint), changed)


def test_a_resume_says_where_from_and_whether_it_can_be_exact(tmp_path: Path, caplog, monkeypatch) -> None:
    """RESUME_FROM names the checkpoint and why; one saved under --save_only_model holds no optimizer state,
    from which the Trainer starts the optimizer and the schedule over: RESUME_INEXACT says so (README
    promises an exact resume from a full checkpoint, which the job scripts' requeues rely on)."""
    full, model_only = tmp_path / "out" / "checkpoint-8", tmp_path / "out" / "checkpoint-9"
    for checkpoint in (full, model_only):
        checkpoint.mkdir(parents=True)
        (checkpoint / "model.safetensors").write_bytes(b"")
    (full / "optimizer.pt").write_bytes(b"")
    with caplog.at_level("INFO", logger="qa_hpc.preemption"):
        say_resume(str(full), None, {})
        assert (
            f"RESUME_FROM={full} (checkpoint found in --output_dir; --overwrite_output_dir to" in caplog.text
        )
        assert "RESUME_INEXACT" not in caplog.text
        say_resume(str(model_only), "elsewhere/checkpoint-2", {})
        assert "went on from --resume_from_checkpoint elsewhere/checkpoint-2;" in caplog.text
        assert (
            f"RESUME_INEXACT checkpoint={model_only} (no optimizer state: saved with --save_only_model;"
            in (caplog.text)
        )
        say_resume(str(full), None, {"world_size": (1, 4)})
    assert f"RESUME_INEXACT checkpoint={full} (this launch changes its training: processes 1 -> 4)" in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level("INFO", logger="qa_hpc.preemption"):  # a requeue that skipped the flag it holds
        say_resume(str(full), None, {}, overwrite_given=True)
    assert f"RESUME_FROM={full} (checkpoint found in --output_dir)\n" in caplog.text
    caplog.clear()
    monkeypatch.setenv("LOCAL_RANK", "1")  # once a node: its local rank 0 said it
    with caplog.at_level("INFO", logger="qa_hpc.preemption"):
        say_resume(str(full), None, {"world_size": (1, 4)})
    assert "RESUME_FROM" in caplog.text and "RESUME_INEXACT" not in caplog.text


def test_an_evaluation_only_run_never_replaces_the_record_of_a_training_run_however_it_ended(tmp_path: Path):
    """A training run preempted (its record has no train_runtime: it did not end training), failed, or gone
    on from a finished checkpoint (TRAINED_BEFORE) is refused as a finished one is: by the mark every
    training launch leaves, or its checkpoints. An evaluation of its checkpoint into the same folder had
    replaced a preempted run's record with an ok one, and the run tables showed it finished."""
    out = tmp_path / "out"
    out.mkdir()
    preempted = {"status": "preempted", "exit_code": 75, "results": {}, "stopped": {"global_step": 132}}
    (out / "run_summary.json").write_text(json.dumps(preempted))
    (out / LAUNCH_MARK).write_text(json.dumps({"slurm_job_id": None}))
    evaluation = TrainingArguments(output_dir=str(out), report_to="none", do_eval=True)
    with pytest.raises(
        UsageError, match=f"holds a training run \\(the mark its launches leave: {LAUNCH_MARK}\\)"
    ):
        checkpoint_to_resume(evaluation, overwrite_output_dir=False)
    (out / "checkpoint-132").mkdir()
    (out / "checkpoint-132" / "trainer_state.json").write_text(json.dumps({"global_step": 132}))
    (out / LAUNCH_MARK).unlink()  # a folder of an older version: its checkpoints say so
    with pytest.raises(UsageError, match=r"holds a training run \(its checkpoints: checkpoint-132\)"):
        checkpoint_to_resume(evaluation, overwrite_output_dir=False)
    assert checkpoint_to_resume(evaluation, overwrite_output_dir=True) is None


def test_read_only_output_dir(tmp_path: Path) -> None:
    """A folder the run cannot write into: one without write permission, or, for root (who may write into
    any folder of a writable filesystem), sysfs, which takes no new files from anyone."""
    if os.geteuid() == 0:
        with pytest.raises(
            OutputError,
            match="cannot write into --output_dir /sys: (Permission denied|Read-only file system)",
        ):
            check_writable_dir("/sys")
        return
    (ro := tmp_path / "ro").mkdir(mode=0o500)
    try:
        with pytest.raises(OutputError, match="cannot write into --output_dir .*Permission denied"):
            check_writable_dir(str(ro))
    finally:
        ro.chmod(0o700)


def test_write_failure_names_the_reason_from_rust_and_torch_errors(tmp_path: Path) -> None:
    """safetensors reports 'os error 28'; torch.save only 'file write failed', and a probe write finds why."""
    target = str(tmp_path / "checkpoint-7")
    err = write_failure(Exception("I/O error: No space left on device (os error 28)"), target)
    assert isinstance(err, OutputError) and err.errno == errno.ENOSPC
    assert str(err).startswith(f"cannot write {target}: No space left on device")
    assert "MiB free" in str(err) and "--save_total_limit" in str(err)
    # an error with no errno on a writable disk is not a write failure: left to the traceback
    assert write_failure(RuntimeError("shape mismatch"), target) is None
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # Python ignores SIGXFSZ: writes fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        err = write_failure(
            RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64"), target
        )
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert isinstance(err, OutputError) and err.errno == errno.EFBIG
    assert str(err).startswith(f"cannot write {target}: File too large") and "ulimit -f" in str(err)


@pytest.mark.parametrize(
    "phase, precision, expected",
    [
        (
            "train",
            "bf16",
            [
                "ERROR: out of memory on cuda:0 during train",
                "--per_device_train_batch_size 32",
                "--per_device_train_batch_size 16 --gradient_accumulation_steps 2",
            ],
        ),  # same effective batch
        (
            "eval",
            "bf16",
            [
                "ERROR: out of memory on cuda:0 during eval with --per_device_eval_batch_size 64",
                "try --per_device_eval_batch_size 32",
            ],
        ),
        (
            "eval",
            "fp32",
            [
                "ERROR: out of memory on cuda:0 during eval",
                "32 (evaluation batches do not change the results), or --precision bf16",
            ],
        ),
    ],
)
def test_out_of_memory_is_exit_3_naming_the_batch_size_and_what_to_lower(
    phase: str, precision: str, expected: list, capsys, monkeypatch
) -> None:
    import run_qa

    def main() -> int:
        with guarded(
            phase,
            "out",
            BatchContext(
                train_batch_size=32,
                eval_batch_size=64,
                gradient_accumulation_steps=1,
                max_seq_length=384,
                device="cuda:0",
                precision=precision,
            ),
        ):
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)"
            )

    monkeypatch.setattr(run_qa, "main", main)
    assert run_qa.cli() == EXIT_OOM
    err = capsys.readouterr().err
    assert err.startswith(expected[0]) and "Traceback" not in err, err
    assert all(part in err for part in expected + ["Tried to allocate 2.00 GiB"]), err
    assert ("--precision" in err) == (precision == "fp32"), err  # never the precision the run already has


def test_overwrite_removes_the_replaced_runs_checkpoints_so_no_later_run_resumes_them(
    tiny_bert, demo_files, tmp_path: Path, process_settings, caplog
) -> None:
    """Without --overwrite_output_dir the command resumes from the newest checkpoint (the record of the launch
    before it removed); with it the run starts
    over and the old checkpoints go, else a later run of the command without the flag (a requeued job)
    would resume the replaced run's weights and step. The user's other files stay."""
    import run_qa

    out = tmp_path / "out"
    old = out / "checkpoint-16"
    old.mkdir(parents=True)
    (old / "trainer_state.json").write_text(json.dumps({"global_step": 16, "epoch": 2.0}))
    (out / "notes.txt").write_text("mine")
    (out / "run_summary.json").write_text(json.dumps({"status": "preempted", "exit_code": 75}))

    def setup(*extra: str) -> run_qa.Run:
        argv = tiny_flags(tiny_bert, out, "--do_train", "--train_file", str(demo_files["train"]), *extra)
        values, facts = read_flags(argv), read_device_facts()
        plan, flags = decide_and_build(values, facts)
        return run_qa.setup(values, flags, plan, facts, StopRequest())

    assert setup().resume == str(old)
    # the earlier launch's record goes: one killed from here on shows as incomplete, not as that one ended
    assert not (out / "run_summary.json").exists()
    assert setup("--overwrite_output_dir").resume is None
    assert not old.exists() and (out / "notes.txt").read_text() == "mine"
    assert "OVERWRITE removed=checkpoint-16 " in caplog.text


@pytest.mark.parametrize(
    ("job_id", "restart_count", "marked_by", "checkpoint", "resumed"),
    [
        ("7", "1", "7", True, True),  # the job requeued itself after its stop: resume what it saved
        ("7", "1", "6", True, False),  # another job's run is there: replace it
        ("7", "1", None, True, False),  # no launch of this job marked the folder: replace what is there
        ("7", "1", "7", False, False),  # its first launch saved no checkpoint: start over, as asked
        ("7", "0", "7", True, False),  # the job's first launch (an sbatch of the same job id cannot be)
        ("7", "", "7", True, False),  # set but empty: no restart counted
        (None, None, "7", True, False),  # not under Slurm: the flag as given
    ],
)
def test_a_requeued_job_with_overwrite_resumes_its_own_checkpoint(
    job_id: str | None,
    restart_count: str | None,
    marked_by: str | None,
    checkpoint: bool,
    resumed: bool,
    tiny_bert,
    demo_files,
    tmp_path: Path,
    process_settings,
    monkeypatch,
) -> None:
    """A preempted job requeues itself and runs the same command again, --overwrite_output_dir and all: its
    first launch replaced the earlier run and marked the folder with its job (at the launch: one killed
    without a record counts too), so the requeue resumes the checkpoint that launch saved instead of
    removing it and training from scratch. Each launch marks the folder again."""
    import run_qa

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # without a checkpoint, only the flag lets a run train here
    saved = out / "checkpoint-8"
    if checkpoint:
        saved.mkdir()
        (saved / "trainer_state.json").write_text(json.dumps({"global_step": 8, "epoch": 1.0}))
    if marked_by is not None:
        (out / LAUNCH_MARK).write_text(json.dumps({"slurm_job_id": marked_by}))
    for name, value in (("SLURM_JOB_ID", job_id), ("SLURM_RESTART_COUNT", restart_count)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)

    argv = tiny_flags(
        tiny_bert, out, "--do_train", "--train_file", str(demo_files["train"]), "--overwrite_output_dir"
    )
    values, facts = read_flags(argv), read_device_facts()
    plan, flags = decide_and_build(values, facts)
    run = run_qa.setup(values, flags, plan, facts, StopRequest())

    assert run.resume == (str(saved) if resumed else None)
    assert saved.exists() == resumed
    mark = json.loads((out / LAUNCH_MARK).read_text())
    assert (mark["slurm_job_id"], mark["resume_from_checkpoint"]) == (job_id, None)
    assert mark["recipe"]["learning_rate"] == run.params.learning_rate
