"""The run record, its results files and the closing KEY=value lines, written through the real writers."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from transformers import TrainerState

import qa_hpc.plan
from qa_hpc.device import CPU_FLAGS, read_device_facts
from qa_hpc.record import final_lines, save_results, save_trainer_state, write_run_summary


def test_closing_lines_keep_the_documented_order_and_end_with_the_wall_clock() -> None:
    results = {"eval_f1": 88.38, "train_runtime": 12.3456789, "eval_examples": 10570, "unlisted": 1.0}
    assert final_lines(results, 642.6) == [
        "train_runtime=12.3457",
        "eval_f1=88.3800",
        "eval_examples=10570",
        "WALL_CLOCK_SECONDS=643",
    ]


@pytest.mark.parametrize(
    "test_machine",
    [None, "cpu_vendor=ARM cpu_flags= cpu_model=Neoverse_V2"],  # this CPU; one with none of CPU_FLAGS
    ids=["this_cpu", "no_cpu_flags"],
)
def test_the_record_keeps_status_slurm_job_memory_summary_and_cpu(
    tmp_path: Path, monkeypatch, capsys, test_machine: str | None
) -> None:
    if test_machine is None:
        monkeypatch.delenv("QA_TEST_MACHINE", raising=False)
    else:
        monkeypatch.setenv("QA_TEST_MACHINE", test_machine)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    path = tmp_path / "run_summary.json"
    written = write_run_summary(
        str(path),
        facts=read_device_facts(),
        status="preempted",
        exit_code=75,
        wall_clock_seconds=1.23456,
        params={"model": "m"},
        plan={"precision": "fp32"},
        effective=None,
        results={"train_loss": float("nan")},
        memory={"measured_peak_mb": 10.0, "per_rank": [1, 2], "note": "n"},
        stopped={"signal": "SIGUSR1", "global_step": 4, "checkpoint": "c"},
    )
    on_disk = json.loads(path.read_text())  # NaN stays readable: json writes and reads it
    assert on_disk.keys() == written.keys()
    assert (on_disk["status"], on_disk["exit_code"], on_disk["wall_clock_seconds"]) == (
        "preempted",
        75,
        1.235,
    )
    assert (on_disk["slurm_job_id"], on_disk["slurm_restart_count"]) == ("77", 2)
    assert on_disk["memory"] == {"measured_peak_mb": 10.0, "note": "n"}  # the full report is memory.json's
    assert (
        on_disk["stopped"]["global_step"] == 4 and on_disk["effective"] is None and on_disk["error"] is None
    )
    # the CPU it ran on, as the MACHINE line every bench result keeps says it (one with none of CPU_FLAGS: an
    # empty cpu_flags= there, [] here)
    assert qa_hpc.plan.main(["--machine"]) == 0
    machine = dict(part.split("=", 1) for part in capsys.readouterr().out.split()[1:])
    assert machine["cpu_model"] == on_disk["cpu_model"].replace(" ", "_")
    assert machine["cpu_vendor"] == on_disk["cpu_vendor"]
    assert [flag for flag in machine["cpu_flags"].split(",") if flag] == on_disk["cpu_flags"]
    assert set(on_disk["cpu_flags"]) <= set(CPU_FLAGS)


def _trainer(out: Path, main: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        state=TrainerState(global_step=7, log_history=[{"loss": 1.0, "step": 7}]),
        args=types.SimpleNamespace(output_dir=str(out)),
        is_world_process_zero=lambda: main,
        log_metrics=lambda split, metrics: None,
    )


def test_results_files_add_each_split_to_all_results_and_the_trainer_state_is_hfs(tmp_path: Path) -> None:
    save_results(_trainer(tmp_path), "train", {"train_runtime": 2.0, "train_loss": 1.0})
    save_results(_trainer(tmp_path), "eval", {"eval_f1": 50.0, "train_runtime": 3.0})
    read = {
        name: json.loads((tmp_path / f"{name}_results.json").read_text()) for name in ("train", "eval", "all")
    }
    assert read == {
        "train": {"train_runtime": 2.0, "train_loss": 1.0},
        "eval": {"eval_f1": 50.0, "train_runtime": 3.0},
        "all": {"train_loss": 1.0, "eval_f1": 50.0, "train_runtime": 3.0},
    }  # the later split's value wins
    save_results(_trainer(tmp_path / "other", main=False), "eval", {"eval_f1": 1.0})
    save_trainer_state(_trainer(tmp_path / "other", main=False))
    assert not (tmp_path / "other").exists()  # only the main process writes
    save_trainer_state(trainer := _trainer(tmp_path))  # the text Trainer.save_state writes
    trainer.state.save_to_json(str(tmp_path / "hf.json"))
    assert (tmp_path / "trainer_state.json").read_text() == (tmp_path / "hf.json").read_text()
