"""The launchers as a user runs them, without SLURM: setup_bert.sh, job_ft3.sh, job_cpu.sh (and its CPU levers),
accelerate launch, and scripts/start_tensorboard.sh serving a real run to TensorBoard's HTTP API on the loopback.

All offline (the hub is a closed or a recording port on 127.0.0.1): setup_bert.sh must try the hub, still
finish and leave the offline demo ready; the job scripts must fall back to the offline demo, say so loudly,
and exit with the run's status. Tiny overrides (tiny random BERT, a few generated questions) keep each run
to seconds.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, skip_or_fail
from fixtures.procs import free_port, offline_env
from fixtures.runs import Run

TIMEOUT = 300


def base_env(**extra: str | None) -> dict[str, str]:
    return offline_env(**extra)


def demo_env(tiny_bert: Path, tmp: Path, **extra: str | None) -> dict[str, str]:
    return base_env(**{
        "QA_DEMO_MODEL": str(tiny_bert), "QA_DEMO_DATA": str(tmp / "data"), "QA_DEMO_TRAIN": "16",
        "QA_DEMO_EVAL": "9", "QA_DEMO_CONTEXT_WORDS": "40", "QA_DEMO_BATCH": "8", "QA_MAX_SEQ_LENGTH": "128",
        "QA_DOC_STRIDE": "32", "QA_OUTPUT_DIR": str(tmp / "out"), "QA_REPORT_TO": "none",
        "QA_LOG_DIR": str(tmp / "logs"), **extra,
    })


def run(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def test_job_ft3_falls_back_to_the_offline_demo_and_labels_it(tiny_bert: Path, tmp_path: Path):
    """...and QA_PRECISION reaches run_qa.py as --precision (the script decides nothing); the run says what ran."""
    proc = run(["bash", str(REPO / "job_ft3.sh"), "--max_eval_samples", "5"],
               demo_env(tiny_bert, tmp_path, QA_PRECISION="bf16"))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "PLAN device=cpu precision=bf16 (--precision bf16)" in log
    assert re.search(r"^EFFECTIVE rank=0 precision=bf16 ", log, re.M)
    # nothing cached, nothing reachable: the demo, and it says so
    assert "MISSING model=bert-base-uncased" in log and "MISSING dataset=squad" in log
    assert "OFFLINE DEMO - NOT THE BASELINE" in log
    assert "RUN_MODE=offline_demo" in log and "RUN_MODE=baseline" not in log
    assert re.search(r"^WALL_CLOCK_SECONDS=\d+$", log, re.M)
    f1 = re.search(r"^eval_f1=(\d+\.\d+)$", log, re.M)
    assert f1 and re.search(r"^eval_exact_match=\d+\.\d+$", log, re.M)
    out = tmp_path / "out"
    results = json.loads((out / "eval_results.json").read_text())
    assert float(f1.group(1)) == pytest.approx(results["eval_f1"], abs=1e-4)
    assert results["eval_examples"] == 5  # extra arguments reach run_qa.py and win over the defaults
    assert (out / "OFFLINE_DEMO.txt").is_file()
    # the demo data was generated with the overrides, and a copy of the log kept
    questions = sum(len(p["qas"]) for a in json.loads((tmp_path / "data" / "train.json").read_text())["data"]
                    for p in a["paragraphs"])
    assert questions == 16
    logs = list((tmp_path / "logs").glob("bert_squad_ft3-local-*.out"))
    assert len(logs) == 1 and "RUN_MODE=offline_demo" in logs[0].read_text()


def test_job_ft3_exits_with_the_run_status(tiny_bert: Path, tmp_path: Path):
    proc = run(["bash", str(REPO / "job_ft3.sh"), "--no_such_flag", "1"], demo_env(tiny_bert, tmp_path))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 2, log[-3000:]
    assert "JOB_EXIT_CODE=2" in log and not re.search(r"^WALL_CLOCK_SECONDS=", log, re.M)


class _RecordingHub(http.server.BaseHTTPRequestHandler):
    """A hub on the loopback that is down: records each request's path and answers 503."""

    seen: list[str]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        self.send_error(503, "hub down (test)")

    def log_message(self, *args) -> None:
        pass


def _checkout_copy(tmp_path: Path) -> Path:
    """A copy of the checkout without data, caches and outputs; the project's venv linked in (pip is CI's)."""
    work = tmp_path / "checkout"
    keep = shutil.ignore_patterns(".git", ".venv", "hf_cache", "outputs", "logs", "runs", "data", "__pycache__")
    shutil.copytree(REPO, work, ignore=keep)
    (work / ".venv").symlink_to(REPO / ".venv")
    return work


def test_setup_bert_without_trying_the_hub_finishes_ready_for_the_demo(tmp_path: Path):
    """QA_SKIP_PREFETCH=1 (no hub here): setup only checks the cache, finishes, twice, and says what it got."""
    work = _checkout_copy(tmp_path)
    env = base_env(QA_SKIP_PIP="1", QA_SKIP_PREFETCH="1", QA_DEMO_TRAIN="20", QA_DEMO_EVAL="5")
    for attempt in (1, 2):
        proc = run(["bash", "setup_bert.sh"], env, cwd=work)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-3000:]
        assert "MISSING model=bert-base-uncased" in log and "SETUP_READY=offline_demo" in log
        assert "prefetching" not in log and "HUB_REACHABLE" not in log
    assert "demo data in data/demo" in log  # the second run kept what the first made
    for name in ("train.json", "validation.json"):
        assert (work / "data" / "demo" / name).is_file()
    assert (work / "logs").is_dir() and (work / "hf_cache").is_dir()


def test_setup_bert_online_tries_the_hub_and_falls_back_cleanly(tmp_path: Path):
    """The login-node branch: not offline, it asks the hub for the model; the hub is down, so it says so,
    reports what is missing and still ends ready for the offline demo (exit 0)."""
    work = _checkout_copy(tmp_path)
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Hub", (_RecordingHub,), {"seen": []}))
    seen = hub.RequestHandlerClass.seen
    server = threading.Thread(target=hub.serve_forever, daemon=True)
    server.start()
    try:
        env = base_env(QA_SKIP_PIP="1", QA_DEMO_TRAIN="20", QA_DEMO_EVAL="5", HF_HUB_OFFLINE=None,
                       HF_DATASETS_OFFLINE=None, TRANSFORMERS_OFFLINE=None,
                       HF_ENDPOINT=f"http://127.0.0.1:{hub.server_address[1]}")
        proc = run(["bash", "setup_bert.sh"], env, cwd=work)
    finally:
        hub.shutdown()
        hub.server_close()
        server.join(timeout=10)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "prefetching bert-base-uncased + squad" in log
    assert seen == ["/api/models/bert-base-uncased"], seen  # it did ask, once, for the model
    lines = log.splitlines()
    assert "HUB_REACHABLE=0" in lines
    assert "MISSING model=bert-base-uncased" in lines and "MISSING dataset=squad" in lines
    assert "SETUP_READY=offline_demo" in lines and "Traceback" not in log
    assert (work / "data" / "demo" / "train.json").is_file()
    assert not list((work / "hf_cache").glob("**/models--*")), "nothing was downloaded"


def test_job_cpu_runs_the_demo_on_the_cpu_with_threads_from_its_cpus(tiny_bert: Path, tmp_path: Path):
    """bash job_cpu.sh outside Slurm: one CPU process whose torch threads are the CPUs it may use, in bf16 where this
    CPU does bf16 in hardware (AVX512-BF16 or AMX: torch's own capability check), else fp32."""
    import torch

    fast = next((name for name in ("amx_bf16", "avx512_bf16") if torch.cpu.get_capabilities().get(name)), None)
    want, why = ("bf16", f"CPU has {fast}") if fast else ("fp32", "CPU has no amx_bf16 or avx512_bf16")
    cpus = len(os.sched_getaffinity(0))
    env = demo_env(tiny_bert, tmp_path, OMP_NUM_THREADS=None, QA_CPU_ALLOCATOR="none", QA_CPU_AFFINITY="0")
    proc = run(["bash", str(REPO / "job_cpu.sh"), "--max_eval_samples", "5"], env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    plan = re.search(r"\bPLAN device=.*$", log, re.M)  # a log record: time, rank, logger first
    assert plan, log[-3000:]
    assert plan.group(0).startswith(f"PLAN device=cpu precision={want} (auto: {why}) tf32=off threads={cpus} "
                                    f"({cpus} CPUs / 1 process(es) on this node) dataloader_workers=0 "
                                    "world_size=1 "), plan.group(0)
    assert re.search(rf"^EFFECTIVE rank=0 precision={want} tf32=off param_dtype=float32 threads={cpus} .*device=cpu ",
                     log, re.M)
    assert "CPU_LEVERS allocator=none (QA_CPU_ALLOCATOR=none) affinity=off (QA_CPU_AFFINITY=0)" in log
    assert "OFFLINE DEMO - NOT THE BASELINE" in log and "RUN_MODE=offline_demo" in log
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    f1 = re.search(r"^eval_f1=(\d+\.\d+)$", log, re.M)
    assert f1 and float(f1.group(1)) == pytest.approx(results["eval_f1"], abs=1e-4)
    assert results["eval_examples"] == 5
    assert re.search(r"^WALL_CLOCK_SECONDS=\d+$", log, re.M)
    assert re.search(r"JOB_SECONDS=\d+ JOB_EXIT_CODE=0$", log, re.M)
    logs = list((tmp_path / "logs").glob("bert_squad_cpu-local-*.out"))
    assert len(logs) == 1 and "RUN_MODE=offline_demo" in logs[0].read_text()


def _get(url: str, timeout: float = 5.0):
    """GET a loopback URL, no proxy; the decoded JSON."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def test_start_tensorboard_serves_a_runs_scalars(plain: Run, tmp_path: Path):
    """scripts/start_tensorboard.sh on a real run's event dir: TensorBoard's HTTP API returns the loss the
    event file holds (read here with TensorBoard's own reader), on 127.0.0.1 only."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = plain.ok().out / "runs"
    (run_dir,) = [p for p in logdir.iterdir() if p.is_dir()]
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    expected = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert [s for s, _ in expected] == list(range(1, 19))

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "tensorboard.log"
    with open(log, "w") as fh:
        server = subprocess.Popen(["bash", str(REPO / "scripts" / "start_tensorboard.sh"), str(logdir)],
                                  env=base_env(PORT=str(port), BIND="127.0.0.1"), stdout=fh,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        tags: dict = {}
        deadline = time.monotonic() + 120
        while "train/loss" not in tags.get(run_dir.name, {}):  # up, and the run loaded
            assert server.poll() is None, f"exited {server.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no train/loss of {run_dir.name} after 120 s:\n{log.read_text()}"
            try:
                tags = _get(f"{base}/data/plugin/scalars/tags")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        assert _get(f"{base}/data/runs") == [run_dir.name]
        query = urllib.parse.urlencode({"run": run_dir.name, "tag": "train/loss"})
        served = _get(f"{base}/data/plugin/scalars/scalars?{query}")  # [[wall_time, step, value], ...]
        assert [(step, value) for _, step, value in served] == [(s, pytest.approx(v, rel=1e-6)) for s, v in expected]
        text = log.read_text()
        assert f"TENSORBOARD_URL=http://127.0.0.1:{port}" in text and "serving 1 event file(s)" in text
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=20)


def accelerate_cmd(config: str, tiny_bert: Path, files: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(REPO / "configs" / "accelerate" / config), *extra, str(REPO / "run_qa.py"),
        "--model_name_or_path", str(tiny_bert), "--train_file", str(files["train"]),
        "--validation_file", str(files["validation"]), "--do_train", "--do_eval", "--output_dir", str(out),
        "--max_seq_length", "128", "--doc_stride", "32", "--per_device_train_batch_size", "8",
        "--num_train_epochs", "1", "--report_to", "none", "--save_strategy", "no",
    ]


@pytest.mark.parametrize("config, world, launch, want, reason", [
    ("cpu.yaml", 1, (), "fp32", "accelerate mixed_precision=no"),  # cpu.yaml says mixed_precision: 'no'
    ("cpu_multi.yaml", 2, ("--mixed_precision", "bf16"), "bf16", "accelerate mixed_precision=bf16"),
])
def test_accelerate_launch_cpu_configs(config: str, world: int, launch: tuple[str, ...], want: str, reason: str,
                                       tiny_bert: Path, demo_files: dict, tmp_path: Path):
    """Each config runs, and accelerate's mixed precision is what trains."""
    out = tmp_path / "out"
    proc = run(accelerate_cmd(config, tiny_bert, demo_files, out, "--main_process_port", str(free_port()), *launch),
               base_env(), cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert f"precision={want} ({reason})" in log
    assert re.search(rf"^EFFECTIVE rank=0 precision={want} ", log, re.M)
    assert f"DISTRIBUTED world_size={world}" in log
    if world > 1:
        assert "backend=gloo" in log
    assert len(re.findall(r"^eval_f1=", log, re.M)) == 1  # computed and printed once
    train = json.loads((out / "train_results.json").read_text())
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == -(-train["train_samples"] // (8 * world))


# --- settings through the launchers: what the user asks for reaches run_qa.py unchanged ------------------


def test_job_passes_qa_precision_none_as_fp32(tiny_bert: Path, tmp_path: Path):
    """(QA_PRECISION=bf16: the demo run above; fp32: the test below.)"""
    proc = run(["bash", str(REPO / "job_ft3.sh"), "--max_steps", "2", "--max_eval_samples", "3"],
               demo_env(tiny_bert, tmp_path, QA_PRECISION="none"))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "PLAN device=cpu precision=fp32 (--precision fp32)" in log
    assert re.search(r"^EFFECTIVE rank=0 precision=fp32 ", log, re.M)


def test_job_flags_win_over_qa_precision_and_bad_values_are_refused(tiny_bert: Path, tmp_path: Path):
    proc = run(["bash", str(REPO / "job_ft3.sh"), "--precision", "fp32", "--max_steps", "1", "--max_eval_samples", "2"],
               demo_env(tiny_bert, tmp_path, QA_PRECISION="bf16"))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "precision=fp32 (--precision fp32)" in log and re.search(r"^EFFECTIVE rank=0 precision=fp32 ", log, re.M)
    bad = run(["bash", str(REPO / "job_ft3.sh")], demo_env(tiny_bert, tmp_path / "bad", QA_PRECISION="fp8"))
    assert bad.returncode == 2 and "ERROR: QA_PRECISION=fp8: use auto, bf16, fp16 or fp32" in bad.stdout + bad.stderr


def test_a_gpu_job_whose_torch_sees_no_gpu_stops_at_once(tiny_bert: Path, tmp_path: Path):
    """CUDA_VISIBLE_DEVICES names a GPU (as Slurm sets it for --gres=gpu) but torch sees none: exit 2, no training."""
    for script in ("job_ft3.sh", "job_ddp.sh"):
        env = demo_env(tiny_bert, tmp_path / script, CUDA_VISIBLE_DEVICES="0")
        proc = run(["bash", str(REPO / script)], env)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 2, (script, log[-3000:])
        assert "asked for a GPU (CUDA_VISIBLE_DEVICES=0)" in log and "torch.cuda.is_available()=False" in log, script
        assert "'loss'" not in log and "WALL_CLOCK_SECONDS" not in log, script


def test_rendezvous_port_is_the_jobs_own():
    """Two jobs on one node must not meet on one port: the port follows the job id (QA_RDZV_PORT overrides)."""
    def port(**env: str) -> str:
        script = f"source {REPO}/scripts/env_setup.sh && qa_rdzv_port"
        return run(["bash", "-c", script], base_env(**env)).stdout.strip()

    assert port(SLURM_JOB_ID="123456") == "18456" and port(SLURM_JOB_ID="123457") == "18457"
    assert port(SLURM_JOB_ID="123456", QA_RDZV_PORT="29999") == "29999"


def accelerate_train(config: str, tiny_bert: Path, files: dict[str, Path], out: Path, *extra: str,
                     run_args: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(REPO / "configs" / "accelerate" / config), *extra, str(REPO / "run_qa.py"),
        "--model_name_or_path", str(tiny_bert), "--train_file", str(files["train"]), "--do_train",
        "--output_dir", str(out), "--max_seq_length", "128", "--doc_stride", "32", "--max_steps", "2",
        "--report_to", "none", "--save_strategy", "no", *run_args,
    ]


def test_precision_flag_wins_over_accelerates_mixed_precision(tiny_bert: Path, demo_files: dict, tmp_path: Path):
    proc = run(accelerate_train("cpu.yaml", tiny_bert, demo_files, tmp_path / "out", "--mixed_precision", "bf16",
                                run_args=("--precision", "fp32")), base_env(), cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "precision=fp32 (--precision fp32)" in log
    assert re.search(r"^EFFECTIVE rank=0 precision=fp32 ", log, re.M)


def test_single_gpu_config_keeps_the_gpus_slurm_gave(tmp_path: Path):
    """accelerate's gpu_ids would overwrite CUDA_VISIBLE_DEVICES: the config leaves it as Slurm set it."""
    script = tmp_path / "show.py"
    script.write_text('import os\nprint("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))\n')
    proc = run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO / "configs" / "accelerate" / "single_gpu.yaml"), str(script)],
               base_env(CUDA_VISIBLE_DEVICES="3"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CUDA_VISIBLE_DEVICES=3" in proc.stdout


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


def find_jemalloc() -> str | None:
    out = subprocess.run(["bash", "-c", f"source {REPO}/scripts/env_setup.sh; qa_find_lib libjemalloc.so"],
                         capture_output=True, text=True)
    return out.stdout.strip() or None


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One demo data folder for the module: the first job generates it, the others reuse it (stamp)."""
    return tmp_path_factory.mktemp("levers_demo_data")


def levers_job(tiny_bert: Path, tmp: Path, data: Path, **extra: str) -> tuple[int, str]:
    """job_cpu.sh in demo mode with the stand-in python; (exit code, log)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp / "report.py").write_text(REPORT)
    fake = bin_dir / "python"
    fake.write_text(f'#!/bin/bash\n[ "$1" = run_qa.py ] && exec {sys.executable} {tmp / "report.py"}\n'
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    env = demo_env(tiny_bert, tmp, QA_MODE="demo", QA_VENV="none", **extra)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["QA_DEMO_DATA"] = str(data)
    for key in ("LD_PRELOAD", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "OMP_NUM_THREADS"):
        if key not in extra:
            env.pop(key, None)
    proc = run(["bash", str(REPO / "job_cpu.sh")], env)
    return proc.returncode, proc.stdout + proc.stderr


def child_env(log: str) -> dict[str, str]:
    line = re.search(r"^CHILD_ENV (.*)$", log, re.M)
    assert line, log[-3000:]
    return dict(item.split("=", 1) for item in line.group(1).split())


def test_jemalloc_is_preloaded_into_the_training_process(tiny_bert: Path, tmp_path: Path, demo_data: Path):
    lib = find_jemalloc()
    if not lib:
        skip_or_fail("libjemalloc not installed (Debian: apt-get install -y libjemalloc2)")
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, QA_CPU_ALLOCATOR="jemalloc", QA_CPU_AFFINITY="0")
    assert rc == 0, log[-3000:]
    assert f"CPU_LEVERS allocator=jemalloc({lib}) affinity=off" in log
    assert child_env(log)["LD_PRELOAD"].split(":")[0] == lib
    assert "CHILD_MAPS jemalloc=1" in log


def test_missing_allocator_is_logged_and_not_fatal(tiny_bert: Path, tmp_path: Path, demo_data: Path):
    empty = tmp_path / "no_libs"
    empty.mkdir()
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, QA_CPU_ALLOCATOR="jemalloc", QA_CPU_LIB_SEARCH=str(empty))
    assert rc == 0, log[-3000:]
    assert "CPU_LEVERS allocator=none (QA_CPU_ALLOCATOR=jemalloc: no libjemalloc library found" in log
    assert child_env(log)["LD_PRELOAD"] == "<unset>"
    assert "CHILD_MAPS jemalloc=0 tcmalloc=0" in log


def test_affinity_binds_threads_and_leaves_the_count_to_run_qa(tiny_bert: Path, tmp_path: Path, demo_data: Path):
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, QA_CPU_ALLOCATOR="none", QA_CPU_AFFINITY="1")
    assert rc == 0, log[-3000:]
    assert "CPU_LEVERS allocator=none (QA_CPU_ALLOCATOR=none) affinity=OMP_PROC_BIND=close,OMP_PLACES=threads" in log
    env = child_env(log)
    assert (env["OMP_PROC_BIND"], env["OMP_PLACES"]) == ("close", "threads")
    assert env["OMP_NUM_THREADS"] == "<unset>"  # run_qa.py decides the thread count


def test_affinity_off_and_users_own_binding_kept(tiny_bert: Path, tmp_path: Path, demo_data: Path):
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, QA_CPU_AFFINITY="0")
    assert rc == 0 and "affinity=off (QA_CPU_AFFINITY=0)" in log, log[-3000:]
    assert child_env(log)["OMP_PROC_BIND"] == "<unset>"
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, QA_CPU_AFFINITY="1", OMP_PLACES="cores")
    assert rc == 0 and "affinity=kept the user's" in log, log[-3000:]
    env = child_env(log)
    assert (env["OMP_PLACES"], env["OMP_PROC_BIND"]) == ("cores", "<unset>")


def test_unknown_value_is_a_usage_error(tiny_bert: Path, tmp_path: Path, demo_data: Path):
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, QA_CPU_ALLOCATOR="mimalloc")
    assert rc == 2, log[-3000:]
    assert "QA_CPU_ALLOCATOR=mimalloc: use auto, jemalloc, tcmalloc or none" in log
    assert "CHILD_ENV" not in log


def test_training_runs_with_both_levers_on(tiny_bert: Path, tmp_path: Path, demo_data: Path):
    env = demo_env(tiny_bert, tmp_path, QA_MODE="demo", QA_CPU_ALLOCATOR="auto", QA_CPU_AFFINITY="1")
    env["QA_DEMO_DATA"] = str(demo_data)
    proc = run(["bash", str(REPO / "job_cpu.sh"), "--max_eval_samples", "5"], env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert re.search(r"CPU_LEVERS allocator=\S+ .*affinity=OMP_PROC_BIND=close", log)
    assert re.search(r"^eval_f1=\d+\.\d+$", log, re.M)
