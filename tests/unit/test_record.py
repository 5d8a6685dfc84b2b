"""The run record (written and read back), its closing KEY=value lines, and the results files, through the
real writers."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest
from transformers import TrainerState

import qa_hpc.plan
from qa_hpc.device import CPU_FLAGS, read_device_facts
from qa_hpc.flags import decide_and_build, read_flags
from qa_hpc.observe.memory import NO_CUDA_NOTE, memory_report
from qa_hpc.plan import decide
from qa_hpc.record import (
    TRAINING_ONLY,
    Environment,
    Memory,
    Params,
    Recorded,
    RunRecord,
    Stopped,
    save_results,
    save_trainer_state,
)

FACTS = read_device_facts()
A100 = {"cuda_available": True, "gpu_count": 1, "capability": (8, 0), "gpu_name": "NVIDIA A100-SXM4-80GB"}
TRAINED = {  # the Trainer's metrics and the efficiency figures, as run_qa.py gathers them
    "train_runtime": 12.3456789,
    "train_samples_per_second": 0.6,
    "train_loss": 1.25,
    "train_tokens_per_second": 136.84,
    "train_model_tflop": 2.5,
    "train_achieved_tflops": 0.25,
    "device_name": "cpu",
    "eval_f1": 88.38,
    "eval_examples": 10570,
    "unlisted": 1.0,
}


def _rank(host: str, cuda_peak: float | None, rss: float) -> dict:
    """One rank's figures as qa_hpc.observe.memory.measure_process gives them."""
    cuda = None
    if cuda_peak is not None:
        cuda = {"peak_allocated_mb": cuda_peak, "peak_reserved_mb": cuda_peak + 500.0}
    return {
        "rank": 0,
        "host": host,
        "cuda": cuda,
        "nvml": {"used_mb": 2500.0} if cuda else None,
        "nvml_note": None if cuda else NO_CUDA_NOTE,
        "cpu": {"peak_rss_mb": rss, "rss_mb": rss},
    }


def _record(tmp_path: Path, plan_facts: dict, results: dict, memory: Memory | None) -> RunRecord:
    plan = decide(read_flags(["--output_dir", str(tmp_path)]), dataclasses.replace(FACTS, **plan_facts))
    return RunRecord(
        status="ok",
        exit_code=0,
        wall_clock_seconds=642.6,
        environment=Environment(),
        params=Params(output_dir=str(tmp_path)),
        plan=plan,
        effective=Recorded(),
        results=Recorded(**results),
        memory=memory,
    )


def test_closing_lines_keep_their_order_and_formats_with_wall_clock_last(tmp_path: Path) -> None:
    estimate = {"total_mb": 810.14, "bytes_per_param": {"total": 18}}
    two_gpu_hosts = [_rank("a", 1234.56, 3000.0), _rank("b", 1000.0, 2000.0)]
    gpu_memory = Memory.of(memory_report(two_gpu_hosts, estimate, str(tmp_path)))
    peak = {"train_peak_tflops": 1248.0, "train_mfu": 0.0002, "device_name": "NVIDIA A100-SXM4-80GB"}
    gpu = _record(tmp_path, {**A100, "world_size": 2}, {**TRAINED, **peak}, gpu_memory)
    assert gpu.closing_lines() == [
        "MEMORY_CUDA_PEAK_ALLOCATED_MB=1234.6",
        "MEMORY_CUDA_PEAK_RESERVED_MB=1734.6",
        "MEMORY_NVML_USED_MB=2500.0",
        "MEMORY_CPU_PEAK_RSS_MB=3000.0",
        "MEMORY_ESTIMATE_MB=810.1",
        "MEMORY_ESTIMATE_BYTES_PER_PARAM=18",
        "RUN_NODES=2",
        "RUN_WORLD_SIZE=2",
        "RUN_DEVICE=NVIDIA A100-SXM4-80GB",
        "RUN_PRECISION=bf16",
        f"OUTPUT_DIR={tmp_path}",
        "TRAIN_TOKENS_PER_SECOND=136.8",
        "TRAIN_SAMPLES_PER_SECOND=0.600",
        "TRAIN_MODEL_TFLOP=2.500",
        "ACHIEVED_TFLOPS=0.2500",
        "PEAK_TFLOPS=1248.0",
        "MFU=0.0002",
        "train_runtime=12.3457",
        "train_samples_per_second=0.6000",
        "train_loss=1.2500",
        "eval_f1=88.3800",
        "eval_examples=10570",
        "WALL_CLOCK_SECONDS=643",
    ]
    # on a CPU, evaluation only: no CUDA figures, no estimate, no training figures
    cpu_memory = Memory.of(memory_report([_rank("a", None, 1757.3)], None, str(tmp_path)))
    cpu = _record(tmp_path, {"cuda_available": False}, {"eval_f1": 88.38}, cpu_memory)
    assert cpu.closing_lines() == [
        "MEMORY_CUDA=none (no CUDA device)",
        "MEMORY_CPU_PEAK_RSS_MB=1757.3",
        "RUN_NODES=1",
        "RUN_WORLD_SIZE=1",
        "RUN_DEVICE=cpu",
        f"RUN_PRECISION={cpu.plan.precision}",
        f"OUTPUT_DIR={tmp_path}",
        "eval_f1=88.3800",
        "WALL_CLOCK_SECONDS=643",
    ]
    # --memory_report false, trained on a CPU: no MEMORY_* or RUN_NODES lines; no peak, so no MFU
    lines = _record(tmp_path, {"cuda_available": False}, TRAINED, None).closing_lines()
    assert lines[0] == "RUN_WORLD_SIZE=1"
    assert "MFU=n/a (device=cpu: no peak table entry; achieved FLOP/s above)" in lines
    # a SQuAD v2 prediction's EM under v2's name, as the evaluation's (eval_exact)
    v2 = {"predict_exact": 50.0, "predict_f1": 61.25, "predict_HasAns_f1": 70.0}
    lines = _record(tmp_path, {"cuda_available": False}, v2, None).closing_lines()
    assert [line for line in lines if line.startswith("predict_")] == [
        "predict_exact=50.0000",
        "predict_f1=61.2500",
    ]


@pytest.mark.parametrize(
    "test_machine",
    [None, "cpu_vendor=ARM cpu_flags= cpu_model=Neoverse_V2"],  # this CPU; one with none of CPU_FLAGS
    ids=["this_cpu", "no_cpu_flags"],
)
def test_the_record_is_written_and_read_back_with_its_parts(
    tmp_path: Path, monkeypatch, capsys, test_machine: str | None
) -> None:
    if test_machine is None:
        monkeypatch.delenv("QA_TEST_MACHINE", raising=False)
    else:
        monkeypatch.setenv("QA_TEST_MACHINE", test_machine)
    facts = read_device_facts()
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    argv = ["--output_dir", str(tmp_path), "--max_seq_length", "256", "--token", "hf_secret", "--use_cpu"]
    argv += ["--precision", "fp32"]
    plan, flags = decide_and_build(read_flags(argv), facts)
    memory = Memory.of(memory_report([_rank("a", None, 10.0)], None, str(tmp_path)))
    written = RunRecord(
        status="preempted",
        exit_code=75,
        wall_clock_seconds=1.23456,
        environment=Environment.of(facts),
        params=Params.of(flags, plan.precision),
        plan=plan,
        effective=Recorded(precision=plan.precision),
        results=Recorded(train_loss=float("nan")),
        memory=memory,
        stopped=Stopped(signal="SIGUSR1", global_step=4, checkpoint="c"),
    )
    written.write(str(tmp_path))
    on_disk = json.loads((tmp_path / "run_summary.json").read_text())  # NaN stays readable
    assert list(on_disk)[:5] == ["timestamp", "status", "exit_code", "error", "wall_clock_seconds"]
    assert list(on_disk)[-6:] == ["params", "plan", "effective", "results", "memory", "stopped"]
    assert (on_disk["status"], on_disk["wall_clock_seconds"], on_disk["error"]) == ("preempted", 1.235, None)
    assert (on_disk["slurm_job_id"], on_disk["slurm_restart_count"]) == ("77", 2)  # at the top level
    # every field of the plan, as decided (a tuple as JSON writes it)
    assert on_disk["plan"] == json.loads(json.dumps(dataclasses.asdict(plan)))
    params = on_disk["params"]
    assert params["max_seq_length"] == 256 and params["precision"] == "fp32"
    assert params["output_dir"] == str(tmp_path)
    assert "hf_secret" not in (tmp_path / "run_summary.json").read_text()
    assert on_disk["memory"]["max_over_ranks"]["cpu_peak_rss_mb"] == 10.0 and "ranks" not in on_disk["memory"]

    read = RunRecord.load(tmp_path / "run_summary.json")
    assert read.environment == written.environment and read.params == written.params
    assert read.memory == memory and read.stopped == written.stopped
    assert read.plan.world_size == plan.world_size and read.plan.precision == plan.precision
    assert read.results.eval_f1 is None and read.results.train_loss != read.results.train_loss  # NaN
    assert read.closing_lines()[-1] == "WALL_CLOCK_SECONDS=1"

    # the CPU it ran on, as the MACHINE line every bench result keeps says it (one with none of CPU_FLAGS: an
    # empty cpu_flags= there, [] here)
    assert qa_hpc.plan.main(["--machine"]) == 0
    machine = dict(part.split("=", 1) for part in capsys.readouterr().out.split()[1:])
    assert machine["cpu_model"] == on_disk["cpu_model"].replace(" ", "_")
    assert machine["cpu_vendor"] == on_disk["cpu_vendor"]
    assert [flag for flag in machine["cpu_flags"].split(",") if flag] == on_disk["cpu_flags"]
    assert set(on_disk["cpu_flags"]) <= set(CPU_FLAGS)
    assert on_disk["cpu_source"] == ("QA_TEST_MACHINE" if test_machine else "/proc/cpuinfo")


def test_a_run_that_does_not_train_records_no_training_parameters(tmp_path: Path) -> None:
    """An evaluation-only run's epochs, batch, learning rate ... are the flags' defaults, which it never used:
    recorded, the report showed "epochs 3.00, global batch 8" for it beside the runs that trained."""
    common = ["--output_dir", str(tmp_path), "--use_cpu", "--precision", "fp32"]
    trained = ["--do_train", "--train_file", "t.json", "--per_device_train_batch_size", "16"]
    for argv, kept in ((["--do_eval", "--validation_file", "v.json"], False), (trained, True)):
        plan, flags = decide_and_build(read_flags([*common, *argv]), read_device_facts())
        params = Params.of(flags, plan.precision)
        training = {name: getattr(params, name) for name in TRAINING_ONLY}
        if kept:
            assert training["per_device_train_batch_size"] == 16 and training["epochs"] == 3.0
        else:
            assert training == dict.fromkeys(TRAINING_ONLY) and params.dataset == "v.json"
        assert params.max_seq_length == 384 and params.per_device_eval_batch_size is not None


def test_a_run_that_does_not_train_records_the_data_it_read_not_a_train_file_beside(tmp_path: Path) -> None:
    """A job script's flags with --do_train left out still name --train_file: the run never reads it, and its
    dataset is the file it evaluated (or predicted) on (it was the train file, the report's "dataset")."""
    common = ["--output_dir", str(tmp_path), "--use_cpu", "--precision", "fp32", "--train_file", "t.json"]
    for argv, dataset in (
        (["--do_eval", "--validation_file", "v.json", "--test_file", "p.json"], "v.json"),
        (["--do_predict", "--validation_file", "v.json", "--test_file", "p.json"], "p.json"),
        (["--do_train", "--do_eval", "--validation_file", "v.json"], "t.json"),
    ):
        plan, flags = decide_and_build(read_flags([*common, *argv]), read_device_facts())
        assert Params.of(flags, plan.precision).dataset == dataset, argv


def test_records_of_other_versions_read_back_with_what_they_lack_as_none(tmp_path: Path) -> None:
    path = tmp_path / "run_summary.json"
    older = {
        "status": "failed",
        "exit_code": 3,
        "hostname": "gpu01",
        "params": {"model": "m", "squad_metric": "squad"},  # a field records no longer have
        "plan": {"world_size": 8},
        "effective": None,  # failed before its objects were built
        "memory": {"max_over_ranks": {"cpu_peak_rss_mb": 5.0}},
    }
    path.write_text(json.dumps(older), encoding="utf-8")
    read = RunRecord.load(path)
    assert (read.status, read.exit_code) == ("failed", 3)
    assert read.environment.hostname == "gpu01" and read.params.model == "m"
    assert read.environment.driver_version is None and read.params.seed is None and read.stopped is None
    assert read.plan.world_size == 8 and read.plan.local_world_size is None
    assert read.effective.precision is None
    assert read.results.train_runtime is None and read.memory.max_over_ranks.cpu_peak_rss_mb == 5.0
    # cut off mid-write; JSON but not a record
    for text in ('{"status": "ok", "results": {"train_runtime": 1', "[1, 2]"):
        path.write_text(text, encoding="utf-8")
        assert RunRecord.load(path) is None
    assert RunRecord.load(tmp_path / "missing.json") is None


def test_what_a_record_says_of_the_training_it_ended() -> None:
    """Two questions the readers ask of a record: did its launch end a training (then the same command has
    nothing left to train), and did it train steps to the end (then the folder's trainer_state.json is its
    own). A launch that went on from the last step's checkpoint ended one without training; an
    evaluation-only run ended none; a preempted launch trained steps but ended nothing."""
    trained = {"status": "ok", "params": {"learning_rate": 3e-5}, "results": {"train_runtime": 9.0}}
    went_on = {**trained, "results": {"eval_f1": 50.0}}
    evaluated = {"status": "ok", "params": {"learning_rate": None}, "results": {"eval_f1": 50.0}}
    preempted = {**trained, "status": "preempted"}
    said = {
        name: (record.ended_training, record.trained_to_the_end)
        for name, data in [
            ("trained", trained),
            ("went_on", went_on),
            ("evaluated", evaluated),
            ("preempted", preempted),
        ]
        for record in [RunRecord.from_json(data)]
    }
    assert said == {
        "trained": (True, True),
        "went_on": (True, False),
        "evaluated": (False, False),
        "preempted": (False, False),
    }


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
    # a v1 evaluation after a v2 one (an evaluation-only run into the same folder): its figures replace the
    # earlier evaluation's whole, the training's stay
    save_results(_trainer(tmp_path), "eval", {"eval_exact": 5.0, "eval_HasAns_f1": 9.0, "epoch": 2.0})
    save_results(_trainer(tmp_path), "eval", {"eval_f1": 7.0})
    assert json.loads((tmp_path / "all_results.json").read_text()) == {
        "train_loss": 1.0,
        "eval_f1": 7.0,
    }  # the earlier evaluation's epoch and train_runtime (in its results file) went with it
    save_results(_trainer(tmp_path / "other", main=False), "eval", {"eval_f1": 1.0})
    save_trainer_state(_trainer(tmp_path / "other", main=False))
    assert not (tmp_path / "other").exists()  # only the main process writes
    save_trainer_state(trainer := _trainer(tmp_path))  # the text Trainer.save_state writes
    trainer.state.save_to_json(str(tmp_path / "hf.json"))
    assert (tmp_path / "trainer_state.json").read_text() == (tmp_path / "hf.json").read_text()


# the modules that read run records back (run_summary.json)
RECORD_READERS = ("qa_hpc/record.py", "qa_hpc/tools/collect_results.py", "qa_hpc/tools/report.py")


def test_what_the_readers_take_of_the_plan_and_effective_settings_is_theirs():
    """Read back, the plan and the effective settings are Recorded, where a name they lack reads as None: a
    typo, or a field renamed in RunPlan or Effective, would show as a missing figure in the tables, never as
    an error. Every name the readers take of them (`plan.X`, `record.plan.X`, `effective.X`) is one of
    RunPlan's or Effective's."""
    import ast

    from qa_hpc.effective import Effective
    from qa_hpc.plan import RunPlan

    repo = Path(__file__).resolve().parents[2]
    has = {
        part: {f.name for f in dataclasses.fields(cls)} | set(dir(cls))
        for part, cls in (("plan", RunPlan), ("effective", Effective))
    }
    read = []
    for path in RECORD_READERS:
        for node in ast.walk(ast.parse((repo / path).read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            part = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if part in has:
                read.append((path, part, node.attr))
    assert {part for _, part, _ in read} == {"plan", "effective"}  # the scan sees them
    assert [(path, f"{part}.{name}") for path, part, name in read if name not in has[part]] == []
