"""The launchers as a user runs them, without Slurm and offline (the hub a closed or recording loopback port):
setup_bert.sh, the job scripts falling back loudly to the offline demo and exiting with the run's status,
accelerate launch, and scripts/start_tensorboard.sh serving a real run. Tiny overrides keep each run to
seconds.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from functools import partial
from pathlib import Path

import pytest
from conftest import REPO, skip_or_fail
from fixtures.machines import AVX2_AMD, AVX512_BF16_AMD
from fixtures.outputs import scalars, tensorboard_events
from fixtures.procs import (
    PYTHON,
    RUN_QA,
    LoggedProcess,
    accelerate,
    at_once,
    demo_job_env,
    free_port,
    offline_env,
    ok,
    run,
    side_by_side,
)
from fixtures.runs import Run, plain_flags


def run_demo_job(script: str, env: dict[str, str], tmp: Path, job: str) -> str:
    """bash SCRIPT with nothing cached, nothing reachable: the offline demo ran, labelled everywhere, scored
    the 5 questions asked for (arguments after the script win), its log copied to QA_LOG_DIR; the log."""
    log = ok(run(["bash", REPO / script, "--max_eval_samples", "5"], env=env))
    for says in (
        "MISSING model=bert-base-uncased",
        "MISSING dataset=squad",
        "OFFLINE DEMO - NOT THE BASELINE",
        "RUN_MODE=offline_demo",
    ):
        assert says in log, says
    assert "RUN_MODE=baseline" not in log and re.search(r"^WALL_CLOCK_SECONDS=\d+$", log, re.M)
    assert re.search(r"JOB_SECONDS=\d+ JOB_EXIT_CODE=0$", log, re.M) and re.search(
        r"\] EXIT_CODE=0$", log, re.M
    )
    results = json.loads((tmp / "out" / "eval_results.json").read_text())
    f1 = re.search(r"^eval_f1=(\d+\.\d+)$", log, re.M)
    assert (
        f1
        and float(f1.group(1)) == pytest.approx(results["eval_f1"], abs=1e-4)
        and results["eval_examples"] == 5
    )
    assert (
        re.search(r"^eval_exact_match=\d+\.\d+$", log, re.M) and (tmp / "out" / "OFFLINE_DEMO.txt").is_file()
    )
    (copy,) = (tmp / "logs").glob(f"{job}-local-*.out")
    assert "RUN_MODE=offline_demo" in copy.read_text()
    assert (copy.parent / f"{copy.stem}_report" / "report.md").is_file()  # the run's report beside its log
    return log


def test_job_ft3_falls_back_to_the_offline_demo_and_labels_it(tiny_bert: Path, tmp_path: Path):
    """...and QA_PRECISION reaches run_qa.py as --precision (the script decides nothing); the run says what
    ran, its torch threads the CPUs it may use. A QA_OUTPUT_DIR relative to the checkout: one absolute
    OUTPUT_DIR= value in the log, TensorBoard in runs/ under the output folder's name. The baseline's epochs
    and learning rate given to the demo: named as not taken."""
    out = os.path.relpath(tmp_path / "out", REPO)
    env = demo_job_env(
        tiny_bert,
        tmp_path,
        QA_PRECISION="bf16",
        OMP_NUM_THREADS=None,
        QA_OUTPUT_DIR=out,
        QA_EPOCHS="5",
        QA_LR="1e-3",
    )
    log = run_demo_job("job_ft3.sh", env, tmp_path, "bert_squad_ft3")
    assert "DEMO_IGNORES QA_EPOCHS=5 QA_LR=1e-3 (the baseline's;" in log
    assert set(re.findall(r"^OUTPUT_DIR=(.*)$", log, re.M)) == {str(tmp_path / "out")}, log[-3000:]
    assert f"output_dir={out} tensorboard=off" in log  # the tests' jobs report to nothing (QA_REPORT_TO)
    cpus = len(os.sched_getaffinity(0))
    assert (
        f"PLAN device=cpu precision=bf16 (--precision bf16) tf32=off threads={cpus} ({cpus} CPUs / 1 "
        "process(es) on this node) dataloader_workers=0 world_size=1 "
    ) in log, log[-3000:]
    assert re.search(r"^EFFECTIVE rank=0 precision=bf16 ", log, re.M)
    train = json.loads((tmp_path / "data" / "train.json").read_text())["data"]  # generated with the overrides
    assert sum(len(p["qas"]) for a in train for p in a["paragraphs"]) == 16


class _RecordingHub(http.server.BaseHTTPRequestHandler):
    """A hub on the loopback that is down: records each request's path and answers 503."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        self.send_error(503, "hub down (test)")

    def log_message(self, *args) -> None:
        pass


def test_setup_bert_finishes_ready_for_the_demo_without_a_hub(tmp_path: Path):
    """QA_SKIP_PREFETCH=1: setup only checks the cache and finishes. Then the login-node branch, not offline:
    it asks the hub (down: 503) for the model, once, says what is missing, and still ends ready (exit 0),
    keeping the demo data the first run made. Run again without a hub where the cache holds both: BASELINE."""
    work = (
        tmp_path / "checkout"
    )  # without data, caches and outputs; the project's venv linked in (pip is CI's)
    shutil.copytree(
        REPO,
        work,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "hf_cache", "outputs", "logs", "runs", "data", "__pycache__"
        ),
    )
    (work / ".venv").symlink_to(REPO / ".venv")
    env = offline_env(QA_SKIP_PIP="1", QA_SKIP_PREFETCH="1", QA_DEMO_TRAIN="20", QA_DEMO_EVAL="5")
    log = ok(run(["bash", "setup_bert.sh"], env=env, cwd=work))
    assert "prefetching" not in log and "HUB_REACHABLE" not in log, log[-3000:]
    assert "MISSING model=bert-base-uncased" in log and "SETUP_READY=offline_demo" in log
    assert (work / "data" / "demo" / "validation.json").is_file() and (work / "logs").is_dir()
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingHub) as hub:
        threading.Thread(target=hub.serve_forever, daemon=True).start()
        env = offline_env(
            QA_SKIP_PIP="1",
            QA_DEMO_TRAIN="20",
            QA_DEMO_EVAL="5",
            HF_HUB_OFFLINE=None,
            HF_DATASETS_OFFLINE=None,
            TRANSFORMERS_OFFLINE=None,
            HF_ENDPOINT=f"http://127.0.0.1:{hub.server_address[1]}",
        )
        try:
            log = ok(run(["bash", "setup_bert.sh"], env=env, cwd=work))
        finally:
            hub.shutdown()
    lines = log.splitlines()
    assert "prefetching bert-base-uncased + squad" in log, log[-3000:]
    assert _RecordingHub.seen == ["/api/models/bert-base-uncased"]
    assert (
        "HUB_REACHABLE=0" in lines
        and "MISSING dataset=squad" in lines
        and "SETUP_READY=offline_demo" in lines
    )
    assert "Traceback" not in log and "demo data in data/demo" in log  # the first run's data kept
    assert (work / "hf_cache").is_dir() and not list((work / "hf_cache").glob("**/models--*"))
    # run again without a hub where an earlier run cached the model and the data set: ready for the BASELINE
    snapshot = work / "hf_cache" / "hub" / "models--qa-test--cached" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).write_text("{}")
    env = offline_env(
        QA_SKIP_PIP="1",
        QA_MODEL="qa-test/cached",
        QA_DATASET=str(work / "data" / "demo"),
        HF_HUB_OFFLINE=None,
        HF_DATASETS_OFFLINE=None,
        TRANSFORMERS_OFFLINE=None,
    )
    lines = ok(run(["bash", "setup_bert.sh"], env=env, cwd=work)).splitlines()
    assert "HUB_REACHABLE=0" in lines and any(line.startswith("SETUP_READY=baseline ") for line in lines)


def test_job_cpu_runs_the_demo_on_the_cpu_with_both_levers_on(tiny_bert: Path, tmp_path: Path):
    """bash job_cpu.sh outside Slurm: one CPU process, allocator and thread binding on, whose torch threads
    are all the CPUs it may use (not the one its main thread is bound to), at the precision and with the
    dropout masks `auto` picks for its kind of CPU, made up with QA_TEST_MACHINE: the demo on an AVX2-only AMD
    CPU (fp32, bulk masks) and, side by side, a job on an AVX512-BF16 one (bf16, bulk masks) that a non-empty
    output dir stops right after its PLAN line (exit 2: cheap, and job_cpu.sh exits with the run's status)."""
    bf16_dir = tmp_path / "avx512_bf16"
    (bf16_dir / "out").mkdir(parents=True)
    (bf16_dir / "out" / "notes.txt").write_text("not a checkpoint")
    bf16_env = demo_job_env(tiny_bert, bf16_dir, QA_MODE="demo", QA_TEST_MACHINE=AVX512_BF16_AMD.test_machine)
    bf16_job = LoggedProcess(["bash", str(REPO / "job_cpu.sh")], tmp_path / "avx512_bf16.log", env=bf16_env)
    try:
        env = demo_job_env(
            tiny_bert,
            tmp_path,
            OMP_NUM_THREADS=None,
            QA_CPU_ALLOCATOR="auto",
            QA_CPU_AFFINITY="1",
            QA_TEST_MACHINE=AVX2_AMD.test_machine,
        )
        log = run_demo_job("job_cpu.sh", env, tmp_path, "bert_squad_cpu")
        assert bf16_job.proc.wait(timeout=300) == 2, bf16_job.text()[-3000:]
    finally:
        bf16_job.kill_all()
    cpus = len(os.sched_getaffinity(0))
    kind = AVX2_AMD
    levers = re.search(r"CPU_LEVERS allocator=(\S+) .*affinity=OMP_PROC_BIND=close", log)
    # auto: the first of jemalloc and tcmalloc this machine has (CI installs both), as the script finds it
    libs = "qa_find_lib libjemalloc.so || qa_find_lib libtcmalloc_minimal.so"
    found = run(["bash", "-c", f"source {REPO}/scripts/cpu_levers.sh && ({libs})"]).stdout.strip()
    allocators = {f"jemalloc({found})", f"tcmalloc({found})"} if found else {"none"}
    assert levers and levers.group(1) in allocators, (allocators, log[-3000:])
    plan = re.search(r"\bPLAN device=.*$", log, re.M)  # a log record: time, rank, logger first
    assert plan and plan.group(0).startswith(
        f"PLAN device=cpu precision={kind.precision} ({kind.precision_reason}) tf32=off threads={cpus} "
        "(OMP_NUM_THREADS) dataloader_workers=0 world_size=1 "
    ), log[-3000:]
    assert f" dropout_mask={kind.dropout_mask} ({kind.dropout_reason}) " in plan.group(0), log[-3000:]
    assert re.search(
        rf"^EFFECTIVE rank=0 precision={kind.precision} tf32=off param_dtype=float32 threads={cpus} "
        rf".*device=cpu .*dropout_mask={kind.dropout_mask} ",
        log,
        re.M,
    ), log[-3000:]
    bf16_log = bf16_job.text()
    kind = AVX512_BF16_AMD
    assert f" precision={kind.precision} ({kind.precision_reason}) " in bf16_log, bf16_log[-3000:]
    assert f" dropout_mask={kind.dropout_mask} ({kind.dropout_reason})" in bf16_log, bf16_log[-3000:]
    assert "is not empty (notes.txt)" in bf16_log and "EFFECTIVE" not in bf16_log, bf16_log[-3000:]


def _get(url: str, timeout: float = 5.0):
    """GET a loopback URL, no proxy; the decoded JSON."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def test_start_tensorboard_serves_a_runs_scalars(plain: Run, tmp_path: Path):
    """scripts/start_tensorboard.sh on a real run's event dir: TensorBoard's HTTP API returns the loss the
    event file holds (read here with TensorBoard's own reader), on 127.0.0.1 only."""
    logdir = plain.ok().out / "runs"
    (run_dir,) = [p for p in logdir.iterdir() if p.is_dir()]
    expected = scalars(tensorboard_events(plain.out), "train/loss")  # its steps: tests/e2e/test_observe.py

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = LoggedProcess(
        ["bash", str(REPO / "scripts" / "start_tensorboard.sh"), str(logdir)],
        tmp_path / "tensorboard.log",
        env=offline_env(PORT=str(port), BIND="127.0.0.1"),
    )
    try:
        tags: dict = {}
        deadline = time.monotonic() + 120
        while "train/loss" not in tags.get(run_dir.name, {}):  # up, and the run loaded
            assert server.proc.poll() is None, f"exited {server.proc.returncode}:\n{server.text()[-3000:]}"
            assert time.monotonic() < deadline, (
                f"no train/loss of {run_dir.name} after 120 s:\n{server.text()}"
            )
            try:
                tags = _get(f"{base}/data/plugin/scalars/tags")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        assert _get(f"{base}/data/runs") == [run_dir.name]
        query = urllib.parse.urlencode({"run": run_dir.name, "tag": "train/loss"})
        served = _get(f"{base}/data/plugin/scalars/scalars?{query}")  # [[wall_time, step, value], ...]
        assert [(step, value) for _, step, value in served] == [
            (s, pytest.approx(v, rel=1e-6)) for s, v in expected
        ]
        text = server.text()
        assert f"TENSORBOARD_URL=http://127.0.0.1:{port}" in text and "serving 1 event file(s)" in text
    finally:
        server.kill_all()


# accelerate's config, processes, launch flags, --precision, the precision that trains and PLAN's reason;
# tiny_flags says --precision fp32; auto (the default) leaves it to accelerate's config or --mixed_precision
ACCELERATE_CASES = [
    ("cpu.yaml", 1, (), "auto", "fp32", "accelerate mixed_precision=no"),  # cpu.yaml: mixed_precision 'no'
    ("cpu_multi.yaml", 2, ("--mixed_precision", "bf16"), "auto", "bf16", "accelerate mixed_precision=bf16"),
    ("cpu.yaml", 1, ("--mixed_precision", "bf16"), "fp32", "fp32", "--precision fp32"),  # the flag wins
]


@pytest.fixture(scope="module")
def accelerate_runs(
    tiny_bert: Path, demo_files: dict, tmp_path_factory
) -> list[tuple[subprocess.CompletedProcess, Path]]:
    """Each of ACCELERATE_CASES' runs (2 epochs of the plain run), in a folder of its own, all side by side
    (one thread per process: each mostly starts up); in order, each with its output folder."""
    folders = [tmp_path_factory.mktemp("accelerate") for _ in ACCELERATE_CASES]
    commands = []
    for (config, _, launch, precision, _, _), folder in zip(ACCELERATE_CASES, folders):
        args = [*plain_flags(tiny_bert, demo_files, folder / "out"), "--report_to", "none"]
        args += ["--save_strategy", "no", "--precision", precision, "--num_threads", "1"]
        commands.append(accelerate(config, RUN_QA, *args, launch=launch))
    done = at_once(*(partial(run, command, cwd=folder) for command, folder in zip(commands, folders)))
    return [(proc, folder / "out") for proc, folder in zip(done, folders)]


@pytest.mark.parametrize("case", ACCELERATE_CASES, ids=[f"{case[0]}-{case[3]}" for case in ACCELERATE_CASES])
def test_accelerate_launch_cpu_configs(
    case: tuple, accelerate_runs: list[tuple[subprocess.CompletedProcess, Path]]
):
    """Each config runs, and accelerate's mixed precision is what trains (unless --precision says
    otherwise)."""
    _, world, _, _, want, reason = case
    proc, out = accelerate_runs[ACCELERATE_CASES.index(case)]
    log = ok(proc)
    assert f"precision={want} ({reason})" in log
    assert re.search(rf"^EFFECTIVE rank=0 precision={want} ", log, re.M)
    assert f"DISTRIBUTED world_size={world}" in log
    if world > 1:
        assert "backend=gloo" in log
    assert len(re.findall(r"^eval_f1=", log, re.M)) == 1  # computed and printed once
    train = json.loads((out / "train_results.json").read_text())
    state = json.loads((out / "trainer_state.json").read_text())
    # 2 epochs of batches of 8 per rank
    assert state["global_step"] == 2 * -(-train["train_samples"] // (8 * world))


# --- settings through the launchers: what the user asks for reaches run_qa.py unchanged ------------------

# QA_PRECISION, the job's arguments, its exit code, what its log says
PRECISION_CASES = [
    (
        "none",
        (),
        0,
        "PLAN device=cpu precision=fp32 (--precision fp32)",
    ),  # the old name of fp32 (bf16: the demo run)
    (
        "bf16",
        ("--precision", "fp32"),
        0,
        "PLAN device=cpu precision=fp32 (--precision fp32)",
    ),  # the job's own win
    ("fp8", (), 2, "ERROR: QA_PRECISION=fp8: use auto, bf16, fp16 or fp32"),
    ("auto", ("--no_such_flag", "1"), 2, "JOB_EXIT_CODE=2"),  # the run's own status is the job's
]


@pytest.fixture(scope="module")
def precision_jobs(tiny_bert: Path, tmp_path_factory) -> list[subprocess.CompletedProcess]:
    """Each of PRECISION_CASES' jobs (job_ft3.sh's demo, one step), in a folder of its own, all side by side
    (each mostly starts up); in order."""
    return side_by_side(
        *(
            (
                ["bash", REPO / "job_ft3.sh", *args, "--max_steps", "1", "--max_eval_samples", "2"],
                demo_job_env(tiny_bert, tmp_path_factory.mktemp("precision"), QA_PRECISION=qa_precision),
            )
            for qa_precision, args, _, _ in PRECISION_CASES
        )
    )


@pytest.mark.parametrize("qa_precision, args, code, says", PRECISION_CASES)
def test_job_precision_reaches_run_qa_and_bad_settings_exit_2(
    qa_precision: str,
    args: tuple[str, ...],
    code: int,
    says: str,
    precision_jobs: list[subprocess.CompletedProcess],
):
    log = ok(precision_jobs[PRECISION_CASES.index((qa_precision, args, code, says))], code)
    assert says in log, log[-3000:]
    assert bool(re.search(r"^EFFECTIVE rank=0 precision=fp32 ", log, re.M)) == (code == 0), log[-3000:]
    assert bool(re.search(r"^WALL_CLOCK_SECONDS=", log, re.M)) == (code == 0), log[-3000:]


def test_a_gpu_job_whose_torch_sees_no_gpu_stops_at_once(tiny_bert: Path, tmp_path: Path):
    """CUDA_VISIBLE_DEVICES names a GPU (as Slurm sets it for --gres=gpu) but torch sees none: exit 2, no
    training."""
    scripts = ("job_ft3.sh", "job_ddp.sh")
    envs = [demo_job_env(tiny_bert, tmp_path / script, CUDA_VISIBLE_DEVICES="0") for script in scripts]
    jobs = side_by_side(*((["bash", REPO / script], env) for script, env in zip(scripts, envs)))
    for script, job in zip(scripts, jobs):
        log = ok(job, 2)
        assert (
            "asked for a GPU (CUDA_VISIBLE_DEVICES=0)" in log and "torch.cuda.is_available()=False" in log
        ), script
        assert "'loss'" not in log and "WALL_CLOCK_SECONDS" not in log, script


def test_rendezvous_port_is_the_jobs_own():
    """Two jobs on one node must not meet on one port: the port follows the job id, outside Slurm it is one
    free when asked (QA_RDZV_PORT overrides)."""

    def port(**env: str) -> str:
        script = f"source {REPO}/scripts/env_setup.sh && qa_rdzv_port"
        return run(["bash", "-c", script], env=offline_env(**env)).stdout.strip()

    assert port(SLURM_JOB_ID="123456") == "18456" and port(SLURM_JOB_ID="123457") == "18457"
    assert port(SLURM_JOB_ID="123456", QA_RDZV_PORT="29999") == "29999"
    # outside Slurm (one machine): a port free when asked, so a second local job, asking while the first
    # holds its port, gets another
    first = int(port(SLURM_JOB_ID=None))
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        second = int(port(SLURM_JOB_ID=None))
    assert second != first and 1024 < second < 65536, (first, second)


def test_the_jobs_output_dir_and_report_follow_the_run(tmp_path: Path):
    """An --output_dir after the script name wins in run_qa.py (the last value): the job's own lines and
    report follow it. A run stopped before it wrote a record (a second run refused, bad input) gets no
    report of the record an earlier run left there."""

    def job(script: str, *args: str, **env: str) -> str:
        proc = run(
            ["bash", "-c", f"source {REPO}/scripts/env_setup.sh && {script}", "job", *args],
            env=offline_env(**env),
        )
        return proc.stdout + proc.stderr

    pick = 'qa_flag_value output_dir "$@"'
    assert job(pick, "--seed", "1", "--output_dir", "a", "--output_dir=b").strip() == "b"
    assert job(pick, "--seed", "1", "--output_dir").strip() == ""
    reports = 'qa_flag_value report_to "$@"'  # several values, the last flag's
    assert job(
        reports, "--report_to", "wandb", "--report_to", "tensorboard", "wandb", "--seed", "1"
    ).strip() == ("tensorboard wandb")
    demo = {
        "QA_MODE": "demo",
        "QA_DEMO_DATA": str(tmp_path / "data"),
        "QA_DEMO_TRAIN": "4",
        "QA_DEMO_EVAL": "2",
    }
    chosen = job(
        'qa_setup_env && qa_select_run ft3 "$@"',
        "--max_steps",
        "2",
        "--output_dir",
        str(tmp_path / "mine"),
        **demo,
    )
    assert f"output_dir={tmp_path / 'mine'} tensorboard=runs/mine" in chosen, chosen
    # TensorBoard's folder only where the run reports to it, a --report_to after the script name winning
    show_args = 'qa_setup_env && qa_select_run ft3 "$@" 2>&1 && echo "ARGS ${QA_ARGS[*]}"'
    for report_to, folder in (("tensorboard", True), ("none", False)):
        chosen = job(show_args, "--report_to", report_to, QA_REPORT_TO="tensorboard", **demo)
        assert ("--logging_dir runs/offline_demo-ft3" in chosen) == folder, chosen
        # the job's RUN_MODE line says the same
        shown = "tensorboard=runs/offline_demo-ft3" if folder else "tensorboard=off"
        assert re.search(rf"RUN_MODE=offline_demo .* {shown}$", chosen, re.M), chosen
    chosen = job(show_args, QA_REPORT_TO="none", **demo)
    assert "--logging_dir" not in chosen, chosen
    assert re.search(r"RUN_MODE=offline_demo .* tensorboard=off$", chosen, re.M), chosen

    earlier = tmp_path / "out"
    earlier.mkdir()
    (earlier / "run_summary.json").write_text("{}")
    os.utime(earlier / "run_summary.json", (1, 1))  # written before this job started
    report = f"JOB_NAME=ft3 QA_OUT={earlier} QA_T0=$(date +%s) QA_LOCAL_LOG={tmp_path}/ft3.out qa_run_report"
    assert f"REPORT=none (this job's run wrote no run_summary.json in {earlier})" in job(report)
    assert not (tmp_path / "ft3_report").exists()


def test_the_job_checks_the_cache_for_the_model_and_data_its_arguments_name(tiny_bert: Path, tmp_path: Path):
    """The job's own --model_name_or_path and data files win in run_qa.py (the last value): the cache is
    checked for them, not for bert-base and SQuAD, which decided alone whether a run of the user's own
    model got the BASELINE recipe or the demo's (1 epoch, batch 8, its banner and folder). Named and not
    there, the run is started all the same and says what is missing, rather than a demo of another model."""
    show = 'qa_setup_env && qa_select_run ft3 "$@" 2>&1 && echo "ARGS ${QA_ARGS[*]}"'

    def job(*args: str) -> str:
        script = f"source {REPO}/scripts/env_setup.sh && {show}"
        env = offline_env(
            HF_HOME=str(tmp_path / "empty"),
            QA_DEMO_DATA=str(tmp_path / "data"),
            QA_DEMO_TRAIN="4",
            QA_DEMO_EVAL="2",
        )
        proc = run(["bash", "-c", script, "job", *args], env=env)
        return proc.stdout + proc.stderr

    files = ("--train_file", "t.json", "--validation_file", "v.json")
    own = job("--model_name_or_path", str(tiny_bert), *files)
    assert f"RUN_MODE=baseline model={tiny_bert} dataset=none (own files) " in own, own
    assert "--dataset_name" not in own and "--num_train_epochs 2 --per_device_train_batch_size 24" in own
    missing = job("--model_name_or_path", str(tmp_path / "not_copied_yet"))
    assert "RUN_MODE=baseline" in missing and "OFFLINE DEMO" not in missing, missing
    assert "RUN_MODE=offline_demo" in job("--seed", "3")  # nothing named, nothing cached: the demo


def test_a_log_folder_that_cannot_be_written_stops_the_job(tiny_bert: Path, tmp_path: Path):
    """Outside Slurm the job's log is its only record of the run: a QA_LOG_DIR it cannot write is one
    ERROR line and exit 2 before anything runs (the job used to run on with no log)."""
    (tmp_path / "a_file").write_text("")
    env = demo_job_env(tiny_bert, tmp_path, QA_LOG_DIR=str(tmp_path / "a_file" / "logs"))
    log = ok(run(["bash", REPO / "job_ft3.sh"], env=env), 2)
    assert f"ERROR: QA_LOG_DIR={tmp_path / 'a_file' / 'logs'}: cannot write there (from {REPO})" in log
    assert "RUN_MODE" not in log


@pytest.mark.parametrize("procs", ["abc", "0"])
def test_a_bad_process_count_is_one_error_line(procs: str, tiny_bert: Path, tmp_path: Path):
    """QA_CPU_PROCS_PER_NODE that is no count: exit 2 naming it (it was bash's 'unbound variable', or
    torchrun's AssertionError for 0)."""
    env = demo_job_env(tiny_bert, tmp_path, QA_CPU_PROCS_PER_NODE=procs)
    log = ok(run(["bash", REPO / "job_ddp.sh"], env=env), 2)
    assert f"ERROR: QA_NPROC_PER_NODE/QA_CPU_PROCS_PER_NODE={procs}: give a number of processes" in log


def test_a_signal_while_the_run_starts_still_counts_as_preempted(tmp_path: Path):
    """SIGTERM that reaches the training process before run_qa.py installed its handler (imports take
    seconds) kills it: 143. The job counts it as preempted, as the scheduler meant it (75, requeued under
    Slurm), not as a failure that ends the job."""
    started = tmp_path / "started"
    child = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(60)"
    script = (
        f'source {REPO}/scripts/env_setup.sh && qa_run_preemptible local {PYTHON} -c "{child}"; echo RC=$?'
    )
    shell = subprocess.Popen(
        ["bash", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=offline_env(SLURM_JOB_ID=None),
    )
    deadline = time.monotonic() + 60
    while not started.exists() and shell.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    shell.send_signal(signal.SIGTERM)
    log = shell.communicate(timeout=60)[0]
    assert "EXIT_CODE=143 (after SIGTERM)" in log, log
    assert "PREEMPTED: SIGTERM came while the run was starting, before it could save anything" in log, log
    assert "PREEMPTED: not under SLURM, so run the same command again to resume" in log, log
    assert log.splitlines()[-1] == "RC=75", log


@pytest.mark.parametrize(
    ("script", "processes", "extra", "resume", "run_qa_resume"),
    [
        ("job_cpu.sh", None, (), "run the same command again", "run the same command"),
        # the flag starts over outside a Slurm requeue: the hints say to leave it out
        (
            "job_ddp.sh",
            "2",
            ("--overwrite_output_dir",),
            "run it again without --overwrite_output_dir",
            "run it again without --overwrite_output_dir",
        ),
    ],
    ids=["cpu", "ddp"],
)
def test_ctrl_c_stops_a_job_run_by_hand_with_a_checkpoint(
    tiny_bert: Path,
    tmp_path: Path,
    script: str,
    processes: str | None,
    extra: tuple[str, ...],
    resume: str,
    run_qa_resume: str,
):
    """Ctrl-C on `bash job_cpu.sh` or `bash job_ddp.sh` (torchrun, 2 CPU processes) run by hand: SIGINT to
    its process group (the shell, tee, the run or torchrun and its workers, which a non-interactive shell
    starts with SIGINT ignored). The shell passes it on as SIGTERM, as a preemption: the run saves a
    checkpoint, the job exits 75 without requeueing and its log keeps every line to the end; nothing of the
    job is left running. (The shell used to die or ignore it, tee died with it, and the run trained on;
    torchrun passed SIGINT to its workers, which stopped without a checkpoint.)"""
    env = demo_job_env(
        tiny_bert,
        tmp_path,
        QA_MODE="demo",
        QA_DEMO_EPOCHS="1000",  # thousands of steps
        QA_CPU_PROCS_PER_NODE=processes,
        QA_RDZV_PORT=str(free_port()),
    )
    job = LoggedProcess(
        ["bash", str(REPO / script), "--logging_steps", "1", *extra],
        tmp_path / "job.log",
        env=env,
        # as from a terminal: the job's shell starts with SIGINT at its default (bash cannot trap a signal
        # ignored on entry, as it would be were pytest started with SIGINT ignored)
        preexec_fn=partial(signal.signal, signal.SIGINT, signal.SIG_DFL),
    )
    try:
        job.wait_for(r"\{'loss'", count=2)  # it is training
        os.killpg(job.proc.pid, signal.SIGINT)
        code = job.proc.wait(timeout=120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # tee and the run: gone soon after the shell
            try:
                os.killpg(job.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("processes of the job run on 30 s after it exited:\n" + job.text()[-3000:])
    finally:
        job.kill_all()
    log = job.text()
    stopped = re.search(r"PREEMPTED signal=SIGTERM global_step=(\d+) checkpoint=(\S+)", log)
    assert code == 75 and stopped, f"exit {code}:\n{log[-3000:]}"
    assert (Path(stopped.group(2)) / "trainer_state.json").is_file(), log[-3000:]
    for says in (
        "PREEMPT_SIGNAL=SIGTERM (from SIGINT: Ctrl-C): asking the run to save a checkpoint and stop",
        "EXIT_CODE=75 (after SIGTERM)",
        f"PREEMPTED: stopped by SIGINT (Ctrl-C), not requeued: {resume} to resume",
        f"exit_code=75 ({run_qa_resume} to resume)",
    ):
        assert says in log, (says, log[-3000:])
    assert re.search(r"JOB_SECONDS=\d+ JOB_EXIT_CODE=75$", log, re.M), log[-3000:]
    (copy,) = (tmp_path / "logs").glob(f"bert_squad_{script[4:7]}-local-*.out")  # tee copied it all
    assert "JOB_EXIT_CODE=75" in copy.read_text(), copy.read_text()[-3000:]


@pytest.mark.parametrize(
    "launcher, ranks, want",
    [
        (1, {"rank0": 1, "rank1": 3}, 3),  # a rank that lost its peer says 1; the one out of memory, 3
        (1, {"rank0": 75, "rank1": 75}, 75),  # preempted: every rank's checkpoint, then 75
        (143, {"rank0": 75}, 75),  # the other node's rank killed before it noted its code
        (1, {"rank10": 3, "rank9": 2}, 2),  # the lowest rank, counted as a number
        (1, {"rank0": 1, "rank1": 1}, 1),  # no cause named: the launcher's
        (1, {}, 1),  # no rank noted one
        (0, {"rank0": 0, "rank1": 0}, 0),
    ],
)
def test_the_runs_exit_code_is_the_first_rank_that_names_a_cause(launcher, ranks, want, tmp_path: Path):
    """qa_ranks_exit_code over the codes the ranks noted (QA_EXIT_CODE_DIR) and torchrun's status: the run's
    code, each rank's, and the folder removed. (Through srun and torchrun, the ranks noting theirs:
    tests/e2e/test_slurm.py's preempted 2-node job.)"""
    codes = tmp_path / "codes"
    codes.mkdir()
    for name, code in ranks.items():
        (codes / name).write_text(f"{code}\n")
    script = f"source {REPO}/scripts/env_setup.sh && qa_ranks_exit_code {launcher}"
    script += ' && echo "$QA_RUN_RC|$QA_RANK_CODES"'
    out = (
        ok(run(["bash", "-c", script], env=offline_env(QA_EXIT_CODE_DIR=str(codes)))).strip().splitlines()[-1]
    )
    rc, said = out.split("|")
    assert int(rc) == want, out
    if launcher != 0:  # a launcher that ended well: the codes are not read
        ordered = sorted(ranks, key=lambda name: int(name.removeprefix("rank")))
        assert said == " ".join(f"{name}={ranks[name]}" for name in ordered), out
    assert not codes.exists()


def test_single_gpu_config_keeps_the_gpus_slurm_gave(tmp_path: Path):
    """accelerate's gpu_ids would overwrite CUDA_VISIBLE_DEVICES: the config leaves it as Slurm set it."""
    script = tmp_path / "show.py"
    script.write_text(
        'import os\nprint("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))\n'
    )
    log = ok(
        run(accelerate("single_gpu.yaml", script), env=offline_env(CUDA_VISIBLE_DEVICES="3"), cwd=tmp_path)
    )
    assert "CUDA_VISIBLE_DEVICES=3" in log


# --- job_cpu.sh's CPU levers (scripts/env_setup.sh qa_cpu_levers): allocator preload and thread affinity.
# What the training process gets is checked from inside it: `python` on PATH is a stand-in that, for
# `python run_qa.py ...`, reports its own environment and whether the allocator is mapped into it
# (/proc/self/maps), and passes every other call (demo data) to the real interpreter.

REPORT = """import os
maps = open("/proc/self/maps").read()
keys = ("LD_PRELOAD", "OMP_PROC_BIND", "OMP_PLACES", "OMP_NUM_THREADS")
print("CHILD_ENV " + " ".join(f"{k}={os.environ.get(k, '<unset>')}" for k in keys))
print(f"CHILD_MAPS jemalloc={int('libjemalloc' in maps)} tcmalloc={int('libtcmalloc' in maps)}")
"""


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One demo data folder for the module: the first job generates it, the others reuse it (stamp)."""
    return tmp_path_factory.mktemp("levers_demo_data")


def path_without(folder: Path, program: str) -> str:
    """A folder of links to every program on PATH but `program` (the first of each name, as PATH finds it)."""
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        for found in Path(directory).glob("*") if Path(directory).is_dir() else []:
            link = folder / found.name
            if found.name != program and not link.exists() and os.access(found, os.X_OK):
                link.symlink_to(found)
    return str(folder)


def levers_job(
    tiny_bert: Path,
    tmp: Path,
    data: Path,
    script: str = "job_cpu.sh",
    gpus: int = 0,
    code: int = 0,
    numactl: bool = True,
    **extra: str,
) -> str:
    """A job in demo mode with the stand-in python (`gpus`: what it says torch sees), torchrun (prints its
    arguments, then reports as the training process) and numactl (unless `numactl` is false), exiting with
    `code`; its log."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp / "report.py").write_text(REPORT)
    stand_ins = {
        "python": f'[ "$1" = run_qa.py ] && exec {PYTHON} {tmp / "report.py"}\n'
        f'[ "$*" = "-m qa_hpc.plan --gpu-count" ] && [ {gpus} -gt 0 ] && echo {gpus} && exit\n'
        f'exec {PYTHON} "$@"',
        "torchrun": f'echo "TORCHRUN $*"; exec {PYTHON} {tmp / "report.py"}',
    }
    if numactl:
        stand_ins["numactl"] = "exit 0"
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    if not numactl and shutil.which("numactl"):  # a node without it: PATH's programs, numactl left out
        path = f"{bin_dir}:{path_without(tmp / 'path', 'numactl')}"
    unset = dict.fromkeys(
        ("LD_PRELOAD", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "OMP_NUM_THREADS")
    )
    env = demo_job_env(
        tiny_bert,
        tmp,
        QA_MODE="demo",
        QA_VENV="none",
        QA_DEMO_DATA=str(data),
        PATH=path,
        **(unset | extra),
    )
    return ok(run(["bash", REPO / script], env=env), code)


def child_env(log: str) -> dict[str, str]:
    line = re.search(r"^CHILD_ENV (.*)$", log, re.M)
    assert line, log[-3000:]
    return dict(item.split("=", 1) for item in line.group(1).split())


@pytest.mark.parametrize(
    "allocator, library, package",
    [
        ("jemalloc", "libjemalloc.so", "libjemalloc2"),
        ("tcmalloc", "libtcmalloc_minimal.so", "libtcmalloc-minimal4"),
    ],
)
def test_the_allocator_asked_for_is_preloaded_into_the_training_process(
    allocator: str, library: str, package: str, tiny_bert: Path, tmp_path: Path, demo_data: Path
):
    lib = run(["bash", "-c", f"source {REPO}/scripts/env_setup.sh; qa_find_lib {library}"]).stdout.strip()
    if not lib:
        skip_or_fail(f"{library} not installed (Debian: apt-get install -y {package})")
    log = levers_job(tiny_bert, tmp_path, demo_data, QA_CPU_ALLOCATOR=allocator, QA_CPU_AFFINITY="0")
    assert f"CPU_LEVERS allocator={allocator}({lib}) affinity=off" in log
    assert child_env(log)["LD_PRELOAD"].split(":")[0] == lib
    mapped = " ".join(f"{name}={int(name == allocator)}" for name in ("jemalloc", "tcmalloc"))
    assert f"CHILD_MAPS {mapped}" in log  # the one asked for, in the training process's memory


@pytest.mark.parametrize(
    "levers, says, child",
    [
        (
            {"QA_CPU_ALLOCATOR": "jemalloc", "QA_CPU_LIB_SEARCH": "{empty}"},  # logged, not fatal
            "CPU_LEVERS allocator=none (QA_CPU_ALLOCATOR=jemalloc: no libjemalloc library found",
            {"LD_PRELOAD": "<unset>"},
        ),
        # binds threads, and counts them: bound, run_qa.py's own mask is the first place's one CPU
        (
            {"QA_CPU_ALLOCATOR": "none", "QA_CPU_AFFINITY": "1"},
            "CPU_LEVERS allocator=none (QA_CPU_ALLOCATOR=none) "
            "affinity=OMP_PROC_BIND=close,OMP_PLACES=threads,OMP_NUM_THREADS={cpus}",
            {"OMP_PROC_BIND": "close", "OMP_PLACES": "threads", "OMP_NUM_THREADS": "{cpus}"},
        ),
        ({"QA_CPU_AFFINITY": "1", "SLURM_CPUS_PER_TASK": "1"}, "OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}),
        (
            {"QA_CPU_AFFINITY": "0"},
            "affinity=off (QA_CPU_AFFINITY=0)",
            {"OMP_PROC_BIND": "<unset>", "OMP_NUM_THREADS": "<unset>"},
        ),
        (
            {"QA_CPU_AFFINITY": "1", "OMP_PLACES": "cores"},
            "affinity=kept the user's",
            {"OMP_PLACES": "cores", "OMP_PROC_BIND": "<unset>", "OMP_NUM_THREADS": "{cpus}"},
        ),
        # an unknown value is a usage error (exit 2): no training process starts
        (
            {"QA_CPU_ALLOCATOR": "mimalloc"},
            "QA_CPU_ALLOCATOR=mimalloc: use auto, jemalloc, tcmalloc or none",
            None,
        ),
    ],
)
def test_levers_reach_the_training_process(
    levers: dict[str, str],
    says: str,
    child: dict[str, str] | None,
    tiny_bert: Path,
    tmp_path: Path,
    demo_data: Path,
):
    (tmp_path / "empty").mkdir()
    levers = {k: v.format(empty=tmp_path / "empty") for k, v in levers.items()}
    cpus = str(len(os.sched_getaffinity(0)))
    says, child = says.format(cpus=cpus), {k: v.format(cpus=cpus) for k, v in (child or {}).items()}
    log = levers_job(tiny_bert, tmp_path, demo_data, code=0 if child else 2, **levers)
    assert says in log and ("CHILD_ENV" in log) == bool(child), log[-3000:]
    assert {k: child_env(log)[k] for k in child} == child


def test_a_worker_bound_to_cpus_of_its_own_is_seen_as_bound(tmp_path: Path):
    """torchrun --numa-binding starts each worker under `numactl --physcpubind=...`, as --no-python taskset
    here: the worker's facts hold its own CPUs and its launcher's, which the plan shares out
    (tests/unit/test_plan.py); a worker torchrun did not bind has its launcher's CPUs."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip(f"needs 2 CPUs to bind a worker to fewer than its launcher's (this process has {mine})")
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from qa_hpc.device import read_device_facts\n"
        "f = read_device_facts()\n"
        "print(f'FACTS cpus={f.cpus} launcher_cpus={f.launcher_cpus} launcher={f.launcher}')\n"
    )
    launch = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port"]
    env = offline_env(SLURM_CPUS_PER_TASK=None)
    bound = ok(
        run([*launch, str(free_port()), "--no-python", "taskset", "-c", str(mine[0]), PYTHON, probe], env=env)
    )
    assert f"FACTS cpus=1 launcher_cpus={len(mine)} launcher=torchrun" in bound, bound
    unbound = ok(run([*launch, str(free_port()), str(probe)], env=env))
    assert f"FACTS cpus={len(mine)} launcher_cpus={len(mine)} launcher=torchrun" in unbound, unbound


@pytest.mark.parametrize(
    "binding, cpus, numactl, torchrun_has, says",
    [
        ("exclusive", "32", True, "--numa-binding=exclusive", "numa_binding=exclusive "),  # the default
        ("exclusive", "2", True, "--numa-binding=exclusive", "numa_binding=exclusive "),  # < 1 CPU each
        ("none", "32", True, "", "BINDING=none (QA_NUMA_BINDING=none)"),
        ("exclusive", "32", False, "", "BINDING=none (no numactl on this node: install it for"),
    ],
    ids=["exclusive", "fewer-cpus-than-gpus", "none", "no-numactl"],
)
def test_ddp_job_binds_each_gpu_worker_near_its_gpu(
    binding: str,
    cpus: str,
    numactl: bool,
    torchrun_has: str,
    says: str,
    tiny_bert: Path,
    tmp_path: Path,
    demo_data: Path,
):
    """A made-up node, 4 GPUs and 32 CPUs for the task: each worker an exclusive share of the CPUs of its
    GPU's NUMA node; QA_NUMA_BINDING=none, or a node without numactl (which says so): none. The job sets no
    threads: run_qa.py's plan shares out a bound worker's own CPUs (OMP_NUM_THREADS set here would count
    its loader workers twice)."""
    log = levers_job(
        tiny_bert,
        tmp_path,
        demo_data,
        "job_ddp.sh",
        gpus=4,
        numactl=numactl,
        QA_NUMA_BINDING=binding,
        SLURM_CPUS_PER_TASK=cpus,
    )
    torchrun = re.search(r"^TORCHRUN (.*)$", log, re.M)
    assert (
        torchrun and "--nproc_per_node=4 " in torchrun.group(1) and "--ddp_backend nccl" in torchrun.group(1)
    )
    assert ("--numa-binding" in torchrun.group(1)) == bool(torchrun_has) and torchrun_has in torchrun.group(1)
    assert child_env(log)["OMP_NUM_THREADS"] == "<unset>" and says in log, log[-3000:]
