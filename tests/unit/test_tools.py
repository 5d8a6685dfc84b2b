"""The tools, in-process: make_demo_data's generated SQuAD, and collect_results on the outputs/ of Slurm jobs
that failed, were preempted or killed (records from the real writer, qa_hpc.record.RunRecord).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from matplotlib.colors import to_hex

import qa_hpc.tools.make_demo_data as mdd
from qa_hpc.device import read_device_facts
from qa_hpc.errors import EXIT_IOERR
from qa_hpc.flags import read_flags
from qa_hpc.outputs import LAUNCH_MARK
from qa_hpc.plan import decide
from qa_hpc.record import Environment, Params, Recorded, RunRecord, Stopped
from qa_hpc.squad_io import load_qa_records
from qa_hpc.tools import collect_results
from qa_hpc.tools.figures import bar_figure
from qa_hpc.tools.make_demo_data import generate_squad

FACTS = read_device_facts()  # this machine, as run_qa.py records it
N = 600  # ~100 paragraphs at the default 450 words: enough for shares, fast to build


@pytest.fixture(scope="module")
def v1() -> dict:
    return generate_squad(N, seed=0)


@pytest.fixture(scope="module")
def v2() -> dict:
    return generate_squad(N, seed=0, with_impossible=True)


def _qas(ds: dict) -> list[tuple[str, dict]]:
    return [(par["context"], qa) for art in ds["data"] for par in art["paragraphs"] for qa in par["qas"]]


def test_deterministic_ids_and_exact_offsets(v1, v2):
    assert generate_squad(N, seed=0) == v1 and generate_squad(N, seed=1) != v1
    first_context = lambda ds: ds["data"][0]["paragraphs"][0]["context"]  # noqa: E731
    assert first_context(generate_squad(N, seed=0, title_prefix="other")) != first_context(v1)
    ids = [qa["id"] for _, qa in _qas(v1)]
    assert len(set(ids)) == len(ids) == N and ids[0] == "demo-000000" and ids[-1] == f"demo-{N - 1:06d}"
    assert (
        min(len(p["qas"]) for art in v1["data"] for p in art["paragraphs"][:-1]) >= 3
    )  # several per paragraph
    for ctx, qa in _qas(v1) + _qas(v2):
        for a in qa["answers"]:
            assert (
                ctx[a["answer_start"] : a["answer_start"] + len(a["text"])]
                == a["text"]
                == a["text"].strip()
                != ""
            )
    with pytest.raises(ValueError):
        generate_squad(0)


def test_long_contexts_varied_questions_and_late_answers(v1, tokenizer):
    contexts = [p["context"] for art in v1["data"] for p in art["paragraphs"]]
    assert all(
        len(p["context"].split()) < 120
        for art in generate_squad(30, context_words=60)["data"]
        for p in art["paragraphs"]
    )
    tokens = tokenizer(contexts[:60], add_special_tokens=False)["input_ids"]  # MiniLM's uncased WordPiece
    assert sum(len(ids) > 384 for ids in tokens) / len(tokens) > 0.9
    assert tokenizer.unk_token_id not in {i for ids in tokens for i in ids}  # invented names: known pieces
    # answers in later windows: the token position of the answer start passes the first window
    late = [
        len(tokenizer(ctx[: qa["answers"][0]["answer_start"]], add_special_tokens=False)["input_ids"]) > 352
        for ctx, qa in _qas(v1)[:300]
    ]
    assert sum(late) / len(late) > 0.25
    assert {"Who", "What", "How", "Which", "When", "In", "Where"} <= {
        qa["question"].split()[0] for _, qa in _qas(v1)
    }
    answers = [qa["answers"][0]["text"] for _, qa in _qas(v1)]
    assert any(re.fullmatch(r"1\d\d\d", a) for a in answers) and any(a.endswith("metres") for a in answers)


def test_v2_asks_about_entities_the_paragraph_never_names(v1, v2):
    qas = _qas(v2)
    impossible = [qa for _, qa in qas if qa["is_impossible"]]
    assert 0.25 < len(impossible) / len(qas) < 0.42 and all(qa["answers"] == [] for qa in impossible)
    for ctx, qa in qas:
        names = [
            w
            for w in re.findall(r"[A-Za-z]+", qa["question"])[1:]
            if w[0].isupper() and w not in {"Mount", "Lake"}
        ]
        assert names and (
            any(n not in ctx for n in names) if qa["is_impossible"] else all(n in ctx for n in names)
        )
    assert not any("is_impossible" in qa for _, qa in _qas(v1))


def test_cli_writes_the_same_bytes_atomically_and_they_load_cleanly(tmp_path, capsys):
    args = ["--num_train", "60", "--num_eval", "20", "--seed", "3", "--context_words", "120"]
    assert mdd.main(["--output_dir", str(tmp_path / "a"), *args]) == 0
    out = capsys.readouterr().out
    assert mdd.main(["--output_dir", str(tmp_path / "b"), *args]) == 0
    names = ["test.json", "train.json", "validation.json"]
    assert sorted(os.listdir(tmp_path / "a")) == names, "no temp files left behind"
    for name in names:
        a = (tmp_path / "a" / name).read_bytes()
        assert a == (tmp_path / "b" / name).read_bytes() and f"{tmp_path / 'a' / name} " in out
        assert hashlib.sha256(a).hexdigest()[:12] in out
    # the bytes of this version: the README's demo figures were measured on data made by it
    assert "sha256=ae5435f13128" in out and "sha256=d72dc9814842" in out and "sha256=425eeed0f7d1" in out
    (train, rep), (val, _), (test, _) = (
        load_qa_records(tmp_path / "a" / f"{split}.json", split=split)
        for split in ("train", "validation", "test")
    )
    assert (rep.fmt, rep.n_records, rep.skipped, rep.fixed, len(val)) == ("squad-nested", 60, {}, 0, 20)
    assert [r["id"] for r in test] == [r["id"] for r in val] and all(r["answers"]["text"] == [] for r in test)
    assert not {r["context"] for r in train} & {r["context"] for r in val}, "train and eval differ"
    assert mdd.main(["--output_dir", str(tmp_path / "c"), *args, "--version_2_with_negative"]) == 0
    v2 = tmp_path / "c" / "train.json"
    _, rep = load_qa_records(v2, version_2_with_negative=True)
    assert json.loads(v2.read_text())["version"] == "2.0" and 0 < rep.n_impossible < 60
    assert rep.n_impossible == sum(qa["is_impossible"] for _, qa in _qas(json.loads(v2.read_text())))
    test_qas = _qas(json.loads((tmp_path / "c" / "test.json").read_text()))
    assert test_qas and not any({"answers", "is_impossible"} & qa.keys() for _, qa in test_qas), (
        "no answer given away"
    )
    capsys.readouterr()
    assert mdd.main(["--output_dir", "/dev/null/demo", *args]) == EXIT_IOERR  # a folder it cannot make
    assert capsys.readouterr().err == "ERROR: cannot create --output_dir /dev/null/demo: Not a directory\n"


# --- collect_results ----------------------------------------------------------------------------------------
def collect(capsys, root: Path, *args: str) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        code = collect_results.main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def rows_of(capsys, root: Path, *args: str) -> dict[str, dict]:
    return {r["run"]: r for r in json.loads(collect(capsys, root, *args, "--format", "json"))["runs"]}


def write_record(out_dir: Path, monkeypatch, job: tuple[str, str] | None, **fields) -> RunRecord:
    """A record as run_qa.py writes one, through the real writer, under (job name, job id) or outside Slurm;
    the plan decided for `layout` (world size, processes per node) of H100s; `params`, the Params fields
    given (a dict)."""
    for key, value in zip(("SLURM_JOB_NAME", "SLURM_JOB_ID"), job or (None, None)):
        monkeypatch.setenv(key, value) if value else monkeypatch.delenv(key, raising=False)
    out_dir.mkdir(parents=True)
    world, per_node = fields.pop("layout", (1, 1))
    given = fields.pop("params", {})
    h100 = dataclasses.replace(
        FACTS,
        cuda_available=True,
        gpu_count=per_node,
        capability=(9, 0),
        gpu_name="NVIDIA H100",
        world_size=world,
        local_world_size=per_node,
    )
    plan = decide(read_flags(["--output_dir", str(out_dir)]), h100)
    record = RunRecord(
        environment=Environment.of(FACTS),
        params=Params(world_size=world, precision=plan.precision, output_dir=str(out_dir), **given),
        plan=plan,
        effective=Recorded(precision="bf16", world_size=world, device="cuda", device_name="NVIDIA H100"),
        **fields,
    )
    record.write(str(out_dir))
    return record


def trained(out_dir: Path, monkeypatch, train_runtime: float, resumed_from_step: int = 0, **params) -> None:
    """The record of a training that ended ok outside Slurm, its wall clock 2 s past its train time;
    `params`, the Params fields given."""
    write_record(
        out_dir,
        monkeypatch,
        None,
        status="ok",
        exit_code=0,
        wall_clock_seconds=train_runtime + 2,
        results=Recorded(train_runtime=train_runtime, train_resumed_from_step=resumed_from_step),
        params=params,
    )


def report_warning(runs: list[Path], out: Path) -> str | None:
    """The report's warning line on `runs`, None without one."""
    from qa_hpc.tools import report

    assert report.main([*map(str, runs), "--out", str(out)]) == 0
    return next((line for line in (out / "report.md").read_text().splitlines() if "Warning" in line), None)


@pytest.fixture
def jobs(tmp_path, monkeypatch, capsys) -> dict:
    """A checkout's outputs/ after Slurm jobs that failed, were preempted or killed, and a local run; and
    logs/ with the jobs' logs."""
    logs, outputs = tmp_path / "logs", tmp_path / "outputs"
    oom = write_record(
        outputs / "bert_squad_ddp",
        monkeypatch,
        ("bert_squad_ddp", "77"),
        status="failed",
        exit_code=3,
        wall_clock_seconds=180.0,
        results=Recorded(),
        layout=(8, 4),
        error="OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity "
        "of 79.19 GiB of which 1.02 GiB is free.",
    )
    stopped = Stopped(signal="SIGUSR1", global_step=40, checkpoint="outputs/bert_squad_ft3/checkpoint-40")
    write_record(
        outputs / "bert_squad_ft3",
        monkeypatch,
        ("bert_squad_ft3", "78"),
        status="preempted",
        exit_code=75,
        wall_clock_seconds=3500.0,
        results=Recorded(),
        stopped=stopped,
    )
    local = write_record(
        outputs / "bert_squad_cpu",
        monkeypatch,
        None,
        status="ok",
        exit_code=0,
        wall_clock_seconds=95.5,
        results=Recorded(train_runtime=80.25, eval_f1=12.5, eval_exact=0.0),
    )
    # the dir of a run killed (time limit, out of memory) before it wrote its record
    (outputs / "offline_demo-bert_squad_gpu").mkdir()
    (outputs / "offline_demo-bert_squad_gpu" / "trainer_state.json").write_text(
        '{"log_history": [{"loss": 2.5, "step": 10}]}', encoding="utf-8"
    )
    logs.mkdir()
    (logs / "bert_squad_ddp-76.out").write_text(
        "ERROR: rank 3 (pid 99) failed: RuntimeError\n", encoding="utf-8"
    )
    return {
        "root": tmp_path,
        "outputs": outputs.resolve(),
        "oom": oom,
        "stopped": stopped,
        "local": local,
        "rows": rows_of(capsys, tmp_path, "logs", "outputs"),
    }


def test_every_row_comes_from_a_record_and_a_dir_without_one_is_incomplete(jobs, capsys):
    """Failed and preempted runs say why from their records; job logs are not read (logs/ adds no row)."""
    rows, oom = jobs["rows"], jobs["oom"]
    assert list(rows) == [
        "bert_squad_ddp-77",
        "bert_squad_ft3-78",
        "bert_squad_cpu",
        "offline_demo-bert_squad_gpu",
    ]
    row = rows["bert_squad_ddp-77"]
    assert row["status"] == "failed" and row["exit_code"] == oom.exit_code == 3
    assert row["reason"] == f"exit code 3: {oom.error}"
    failed_reason = row["reason"]
    assert (row["nodes"], row["procs_per_node"], row["world_size"]) == (2, 4, 8)
    assert row["device"] == "NVIDIA H100" and row["precision"] == "bf16"
    assert row["wall_clock_seconds"] == 180.0 and row["job_name"] == "bert_squad_ddp"
    row = rows["bert_squad_ft3-78"]
    assert row["status"] == "preempted" and row["exit_code"] == 75 and row["speedup"] is None
    assert row["reason"] == f"SIGUSR1 at step 40; resumes from {jobs['stopped'].checkpoint}"
    row = rows["bert_squad_cpu"]
    assert row["status"] == "ok" and row["job_id"] is None and row["speedup"] == 1.0  # the only ok run
    assert (row["train_runtime"], row["f1"], row["exact_match"]) == (80.25, 12.5, 0.0)  # v2's exact
    assert row["wall_clock_seconds"] == jobs["local"].wall_clock_seconds
    row = rows["offline_demo-bert_squad_gpu"]
    assert row["status"] == "incomplete" and row["reason"] == collect_results.NO_RECORD
    assert row["output_dir"] == str(jobs["outputs"] / "offline_demo-bert_squad_gpu")
    assert row["loss_curve"] == [[10, 2.5]] and row["exit_code"] is None and row["world_size"] is None
    md = collect(capsys, jobs["root"], "outputs")
    assert "| bert_squad_ddp-77 | 77 | 2×4 | NVIDIA H100 | bf16 | 180 |" in md
    assert "PREEMPTED: SIGUSR1 at step 40" in md and "INCOMPLETE: no readable run_summary.json" in md
    # the table cuts a long reason at 100 characters (csv and json keep it whole)
    failed = next(line for line in md.splitlines() if line.startswith("| bert_squad_ddp-77 "))
    assert len(failed_reason) > 100 and failed.endswith(f"| FAILED: {failed_reason[:97]}... |")
    # a bar per run, red when it did not end ok
    table = collect_results.read_runs([str(jobs["outputs"])])[0]
    (ax,) = bar_figure(table, "wall_clock_seconds", "wall clock seconds").axes
    colours = [to_hex(bar.get_facecolor()) for bar in ax.patches]
    assert colours == [to_hex("tab:red")] * 2 + [to_hex("tab:blue"), to_hex("tab:red")]
    # each labelled with its value: whole numbers from 1,000 on (a long job's 3725 s was 3.73e+03)
    table.loc[0, "wall_clock_seconds"] = 3725.4
    (ax,) = bar_figure(table, "wall_clock_seconds", "wall clock seconds").axes
    labels = [text.get_text() for text in ax.texts]
    assert labels[0].startswith("3,725 (") and labels[2] == f"{table.at[2, 'wall_clock_seconds']:.3g}"
    table.loc[0, "wall_clock_seconds"] = 999.7  # what 3 significant digits round up to 1,000
    (ax,) = bar_figure(table, "wall_clock_seconds", "wall clock seconds").axes
    assert ax.texts[0].get_text().startswith("1,000 (")


def test_a_local_model_folder_counts_as_cached(tiny_bert, tmp_path, monkeypatch, capsys):
    """QA_MODEL may be a folder (a model copied to project space): the job's cache check takes it as it is
    (it used to stop with the hub's HFValidationError, and the job fell back to the offline demo)."""
    from qa_hpc.tools.prefetch import report

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # report() sets both; restored after the test
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    report(str(tiny_bert), str(tmp_path / "no_data"))
    assert f"CACHED model={tiny_bert} path={tiny_bert.resolve()}\n" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    report(str(tmp_path / "empty"), str(tmp_path / "no_data"))
    assert f"MISSING model={tmp_path / 'empty'}\n" in capsys.readouterr().out


def test_a_fetch_that_fails_is_one_line_and_what_is_missing(tmp_path, monkeypatch, capsys):
    """The hub answers but a download fails (a proxy, a quota): FETCH_FAILED naming why, the MISSING lines,
    exit 1 (it was a traceback)."""
    import huggingface_hub

    from qa_hpc.tools import prefetch

    def refused(*args, **kwargs):
        raise OSError("403 Forbidden (test)")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # prefetch sets both for its report; restored after the test
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(prefetch, "hub_reachable", lambda model: True)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refused)
    model, dataset = str(tmp_path / "no_model"), str(tmp_path / "no_data")
    assert prefetch.main(["--model", model, "--dataset", dataset]) == 1
    out = capsys.readouterr().out
    assert "FETCH_FAILED OSError: 403 Forbidden (test)\n" in out and f"MISSING model={model}\n" in out


def test_the_loss_curve_of_a_run_killed_while_saving_comes_from_its_last_whole_checkpoint(tmp_path):
    """No trainer_state.json at the top (the run stopped before its end) and the newest checkpoint's cut
    short (killed while saving): the history is the newest readable checkpoint's (it was none at all)."""
    history = [{"loss": 2.5, "step": 2}, {"loss": 1.5, "step": 4}]
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    (tmp_path / "checkpoint-6").mkdir()
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text('{"log_history": [{"loss"')
    assert collect_results.read_log_history(tmp_path, None) == history
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history[:1]}))
    # the run's own, where it wrote one
    assert collect_results.read_log_history(tmp_path, None) == history[:1]


def test_runs_of_one_slurm_job_are_told_apart_by_their_folders(tmp_path):
    """A sweep in one job (one run per batch size): each run is labelled by the job and its folder, so that
    each can be the baseline (both were `sweep-4242`, and --baseline matched several)."""
    record = {"status": "ok", "exit_code": 0, "slurm_job_name": "sweep", "slurm_job_id": "4242"}
    for folder, seconds in (("bs8", 10.0), ("bs16", 6.0)):
        (tmp_path / folder).mkdir()
        results = {"results": {"train_runtime": seconds}}
        (tmp_path / folder / "run_summary.json").write_text(json.dumps({**record, **results}))
    table, _ = collect_results.read_runs([str(tmp_path)])
    assert sorted(table["run"]) == ["sweep-4242/bs16", "sweep-4242/bs8"]
    base, error = collect_results.pick_baseline(table, "sweep-4242/bs8", "train_runtime")
    assert error is None and table.at[base, "train_runtime"] == 10.0
    # as deep as it takes: a/out and b/out of one job, two local runs x/out of folders a/ and b/
    dirs = ["r/a/out", "r/b/out", "r/a/x/out", "r/b/x/out", "r/c/y"]
    labels = ["sweep-42", "sweep-42", "out", "out", "y"]
    told = collect_results.told_apart(labels, dirs, [True, True, False, False, False])
    assert told == ["sweep-42/a/out", "sweep-42/b/out", "a/x/out", "b/x/out", "y"]


def test_the_loss_curve_of_a_replacing_run_that_was_stopped_is_its_own_not_the_replaced_runs(tmp_path):
    """--overwrite_output_dir removes the replaced run's checkpoints and leaves its other files, its
    trainer_state.json among them. The replacing launch marks the folder (LAUNCH_MARK) and, stopped before its
    end, leaves its history in its checkpoints only: the tables and report show that, not the replaced run's
    curves; with no checkpoint yet, no curve. A trainer_state.json written after the mark is the launch's."""
    replaced = [{"loss": 4.8, "step": 50}]
    own = [{"loss": 2.0, "step": 5}, {"loss": 1.0, "step": 129}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": replaced}))
    os.utime(tmp_path / "trainer_state.json", (1_000, 1_000))
    (tmp_path / LAUNCH_MARK).write_text(json.dumps({"slurm_job_id": None}))
    assert collect_results.read_log_history(tmp_path, None) == []
    (tmp_path / "checkpoint-129").mkdir()
    (tmp_path / "checkpoint-129" / "trainer_state.json").write_text(json.dumps({"log_history": own}))
    assert collect_results.read_log_history(tmp_path, None) == own
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": own[:1]}))  # after the mark
    assert collect_results.read_log_history(tmp_path, None) == own[:1]
    # a finished run copied without its checkpoints, its files' times in the order of the copy: the record
    # says it trained to the end, so its trainer_state.json is its own whatever its time
    shutil.rmtree(tmp_path / "checkpoint-129")
    os.utime(tmp_path / "trainer_state.json", (1_000, 1_000))
    finished = {"status": "ok", "exit_code": 0, "results": {"train_runtime": 12.5}}
    (tmp_path / "run_summary.json").write_text(json.dumps(finished))
    record = RunRecord.load(tmp_path / "run_summary.json")
    assert collect_results.read_log_history(tmp_path, record) == own[:1]


def test_the_report_reads_a_runs_training_history_once(tmp_path, monkeypatch):
    """The table's loss curve and the report's curves come from one read of trainer_state.json."""
    from qa_hpc.tools import report

    run = tmp_path / "run"
    write_record(
        run,
        monkeypatch,
        None,
        status="ok",
        exit_code=0,
        wall_clock_seconds=5.0,
        results=Recorded(train_runtime=4.0),
    )
    history = [{"loss": 2.0, "step": 5, "learning_rate": 1e-5}, {"loss": 1.0, "step": 10}]
    (run / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    reads = []
    read_json_object = collect_results.read_json_object

    def counted(path):
        reads.append(Path(path).name)
        return read_json_object(path)

    monkeypatch.setattr(collect_results, "read_json_object", counted)
    assert report.main([str(run), "--out", str(tmp_path / "report")]) == 0
    assert reads.count("trainer_state.json") == 1
    assert "![training curves of run]" in (tmp_path / "report" / "report.md").read_text()


def test_a_run_that_only_predicted_on_answered_questions_shows_their_scores(tmp_path, monkeypatch):
    """--do_predict alone on a test file with answers: EM/F1 are the prediction's (they were n/a); beside an
    evaluation, the evaluation's."""
    only = write_record(
        tmp_path / "predicted",
        monkeypatch,
        None,
        status="ok",
        exit_code=0,
        wall_clock_seconds=5.0,
        results=Recorded(predict_exact_match=40.0, predict_f1=55.5),
    )
    row = collect_results.run_row(tmp_path / "predicted")
    assert (row["exact_match"], row["f1"]) == (40.0, 55.5) and only.results.eval_f1 is None
    write_record(
        tmp_path / "both",
        monkeypatch,
        None,
        status="ok",
        exit_code=0,
        wall_clock_seconds=5.0,
        results=Recorded(eval_exact_match=30.0, eval_f1=45.0, predict_exact_match=40.0, predict_f1=55.5),
    )
    row = collect_results.run_row(tmp_path / "both")
    assert (row["exact_match"], row["f1"]) == (30.0, 45.0)


def test_an_evaluation_only_run_gets_no_speedup_on_wall_clock(tmp_path, monkeypatch, capsys):
    """--speedup_on wall_clock_seconds compares trainings: an evaluation-only run's wall clock (it trained
    nothing) is neither the default baseline nor compared (it was both: a training 0.25x its evaluation)."""
    for name, wall, results in (
        ("a_eval_only", 4.0, Recorded(eval_f1=10.0, eval_runtime=3.0)),
        ("b_trained", 16.0, Recorded(train_runtime=12.0, eval_f1=10.0, train_resumed_from_step=0)),
        ("c_trained", 8.0, Recorded(train_runtime=6.0, eval_f1=10.0, train_resumed_from_step=0)),
    ):
        write_record(
            tmp_path / "outputs" / name,
            monkeypatch,
            None,
            status="ok",
            exit_code=0,
            wall_clock_seconds=wall,
            results=results,
        )
    rows = rows_of(capsys, tmp_path, "outputs", "--speedup_on", "wall_clock_seconds")
    assert {run: row["speedup"] for run, row in rows.items()} == {
        "a_eval_only": None,
        "b_trained": 1.0,
        "c_trained": 2.0,
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        args = ["outputs", "--speedup_on", "wall_clock_seconds", "--baseline", "a_eval_only"]
        assert collect_results.main(args) == 2
    assert "a_eval_only, whose last launch trained nothing" in capsys.readouterr().err


def test_the_report_warns_of_runs_that_cut_their_questions_into_other_windows(tmp_path, monkeypatch):
    """--doc_stride decides, with --max_seq_length, how many features (windows) each question makes, so two
    runs of the same questions and epochs at other strides train on other amounts of work (85 against 358
    features at 32 and 96): the comparison warns, as for any other part of the recipe (it said nothing)."""
    for name, stride, seconds in (("stride32", 32, 7.0), ("stride96", 96, 3.0)):
        trained(tmp_path / name, monkeypatch, seconds, max_seq_length=128, doc_stride=stride)
    warning = report_warning([tmp_path / "stride32", tmp_path / "stride96"], tmp_path / "report")
    assert "doc_stride (32, 96)" in warning


def test_a_resumed_runs_bar_says_it_is_its_last_launchs(tmp_path, monkeypatch):
    """wall_time.png: a resumed run's wall clock is its last launch's alone (the tables give it no speedup on
    a time); its bar says so, where it read as the whole run's."""
    for name, wall, step in (("whole", 20.0, 0), ("resumed", 15.0, 40)):
        trained(tmp_path / name, monkeypatch, wall - 2, resumed_from_step=step)
    table = collect_results.read_runs([str(tmp_path)])[0]
    (ax,) = bar_figure(table, "wall_clock_seconds", "wall clock seconds").axes
    labels = dict(zip(table["run"], (text.get_text() for text in ax.texts)))
    assert labels == {"resumed": "15 (last launch, from step 40)", "whole": "20"}


def test_the_reports_comparison_says_a_resumed_runs_times_are_its_last_launchs(tmp_path, monkeypatch):
    """The comparison table's wall clock and train time of a resumed run are its last launch's alone (no
    speedup, as the footnote says): its name says so, where they read as the whole run's."""
    from qa_hpc.tools import report

    for name, step in (("whole", 0), ("resumed", 40)):
        trained(tmp_path / name, monkeypatch, 10.0, resumed_from_step=step)
    out = tmp_path / "report"
    assert report.main([str(tmp_path / "whole"), str(tmp_path / "resumed"), "--out", str(out)]) == 0
    rows = [line for line in (out / "report.md").read_text().splitlines() if line.startswith("| ")]
    assert any(
        row.startswith("| resumed (times: its last launch, from step 40) | 12.00 | 10.00 |") for row in rows
    )
    assert any(row.startswith("| whole | 12.00 | 10.00 |") for row in rows), rows


def test_the_report_does_not_warn_of_epochs_a_max_steps_run_never_used(tmp_path, monkeypatch):
    """Under --max_steps the Trainer ignores --num_train_epochs: two runs of the same 1,000 steps, one with
    the job scripts' 2 epochs and one with the default 3, trained alike (the comparison warned of epochs)."""
    for name, epochs, max_steps in (("two", 2.0, 1000), ("three", 3.0, 1000), ("epochs", 3.0, -1)):
        trained(tmp_path / name, monkeypatch, 8.0, epochs=epochs, max_steps=max_steps)

    def warning(*runs: str) -> str | None:
        return report_warning([tmp_path / run for run in runs], tmp_path / "report")

    assert warning("two", "three") is None
    assert "max steps (1,000, -1)" in warning("two", "epochs")
