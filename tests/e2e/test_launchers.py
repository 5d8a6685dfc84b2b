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


def demo_env(tiny_bert: Path, tmp: Path, **extra: str | None) -> dict[str, str]:
    """The job scripts' overrides for a seconds-long offline demo (tests/e2e/test_slurm.py submits with them too)."""
    return offline_env(**{
        "QA_DEMO_MODEL": str(tiny_bert), "QA_DEMO_DATA": str(tmp / "data"), "QA_DEMO_TRAIN": "16",
        "QA_DEMO_EVAL": "9", "QA_DEMO_CONTEXT_WORDS": "40", "QA_DEMO_BATCH": "8", "QA_MAX_SEQ_LENGTH": "128",
        "QA_DOC_STRIDE": "32", "QA_OUTPUT_DIR": str(tmp / "out"), "QA_REPORT_TO": "none",
        "QA_LOG_DIR": str(tmp / "logs"), **extra,
    })


def run(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def assert_demo_ran_and_said_so(proc: subprocess.CompletedProcess, tmp: Path, job: str) -> str:
    """Nothing cached, nothing reachable: the offline demo ran, labelled everywhere, scored the 5 questions asked
    for (arguments after the script win), its log copied to QA_LOG_DIR; the log."""
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "MISSING model=bert-base-uncased" in log and "MISSING dataset=squad" in log
    assert "OFFLINE DEMO - NOT THE BASELINE" in log and "RUN_MODE=offline_demo" in log and "RUN_MODE=baseline" not in log
    assert re.search(r"^WALL_CLOCK_SECONDS=\d+$", log, re.M) and re.search(r"JOB_SECONDS=\d+ JOB_EXIT_CODE=0$", log, re.M)
    results = json.loads((tmp / "out" / "eval_results.json").read_text())
    f1 = re.search(r"^eval_f1=(\d+\.\d+)$", log, re.M)
    assert f1 and float(f1.group(1)) == pytest.approx(results["eval_f1"], abs=1e-4) and results["eval_examples"] == 5
    assert re.search(r"^eval_exact_match=\d+\.\d+$", log, re.M) and (tmp / "out" / "OFFLINE_DEMO.txt").is_file()
    (copy,) = (tmp / "logs").glob(f"{job}-local-*.out")
    assert "RUN_MODE=offline_demo" in copy.read_text()
    return log


def test_job_ft3_falls_back_to_the_offline_demo_and_labels_it(tiny_bert: Path, tmp_path: Path):
    """...and QA_PRECISION reaches run_qa.py as --precision (the script decides nothing); the run says what ran."""
    log = assert_demo_ran_and_said_so(run(["bash", str(REPO / "job_ft3.sh"), "--max_eval_samples", "5"],
                                          demo_env(tiny_bert, tmp_path, QA_PRECISION="bf16")), tmp_path, "bert_squad_ft3")
    assert "PLAN device=cpu precision=bf16 (--precision bf16)" in log
    assert re.search(r"^EFFECTIVE rank=0 precision=bf16 ", log, re.M)
    train = json.loads((tmp_path / "data" / "train.json").read_text())["data"]  # generated with the overrides
    assert sum(len(p["qas"]) for a in train for p in a["paragraphs"]) == 16


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


def test_setup_bert_finishes_ready_for_the_demo_without_a_hub(tmp_path: Path):
    """QA_SKIP_PREFETCH=1: setup only checks the cache and finishes. Then the login-node branch, not offline: it
    asks the hub (down: 503) for the model, once, says what is missing, and still ends ready (exit 0), keeping
    the demo data the first run made."""
    work = _checkout_copy(tmp_path)
    env = offline_env(QA_SKIP_PIP="1", QA_SKIP_PREFETCH="1", QA_DEMO_TRAIN="20", QA_DEMO_EVAL="5")
    proc = run(["bash", "setup_bert.sh"], env, cwd=work)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "prefetching" not in log and "HUB_REACHABLE" not in log, log[-3000:]
    assert "MISSING model=bert-base-uncased" in log and "SETUP_READY=offline_demo" in log
    assert (work / "data" / "demo" / "validation.json").is_file() and (work / "logs").is_dir()
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Hub", (_RecordingHub,), {"seen": []}))
    server = threading.Thread(target=hub.serve_forever, daemon=True)
    server.start()
    try:
        env = offline_env(QA_SKIP_PIP="1", QA_DEMO_TRAIN="20", QA_DEMO_EVAL="5", HF_HUB_OFFLINE=None,
                          HF_DATASETS_OFFLINE=None, TRANSFORMERS_OFFLINE=None,
                          HF_ENDPOINT=f"http://127.0.0.1:{hub.server_address[1]}")
        proc = run(["bash", "setup_bert.sh"], env, cwd=work)
    finally:
        hub.shutdown()
        hub.server_close()
        server.join(timeout=10)
    log, lines = proc.stdout + proc.stderr, (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 0 and "prefetching bert-base-uncased + squad" in log, log[-3000:]
    assert hub.RequestHandlerClass.seen == ["/api/models/bert-base-uncased"]
    assert "HUB_REACHABLE=0" in lines and "MISSING dataset=squad" in lines and "SETUP_READY=offline_demo" in lines
    assert "Traceback" not in log and "demo data in data/demo" in log  # the first run's data kept
    assert (work / "hf_cache").is_dir() and not list((work / "hf_cache").glob("**/models--*"))


def test_job_cpu_runs_the_demo_on_the_cpu_with_threads_from_its_cpus(tiny_bert: Path, tmp_path: Path):
    """bash job_cpu.sh outside Slurm: one CPU process whose torch threads are the CPUs it may use, in bf16 where this
    CPU does bf16 in hardware (AVX512-BF16 or AMX: torch's own capability check), else fp32."""
    import torch

    fast = next((name for name in ("amx_bf16", "avx512_bf16") if torch.cpu.get_capabilities().get(name)), None)
    want, why = ("bf16", f"CPU has {fast}") if fast else ("fp32", "CPU has no amx_bf16 or avx512_bf16")
    cpus = len(os.sched_getaffinity(0))
    env = demo_env(tiny_bert, tmp_path, OMP_NUM_THREADS=None, QA_CPU_ALLOCATOR="none", QA_CPU_AFFINITY="0")
    log = assert_demo_ran_and_said_so(run(["bash", str(REPO / "job_cpu.sh"), "--max_eval_samples", "5"], env),
                                      tmp_path, "bert_squad_cpu")
    plan = re.search(r"\bPLAN device=.*$", log, re.M)  # a log record: time, rank, logger first
    assert plan and plan.group(0).startswith(
        f"PLAN device=cpu precision={want} (auto: {why}) tf32=off threads={cpus} ({cpus} CPUs / 1 process(es) on "
        "this node) dataloader_workers=0 world_size=1 "), log[-3000:]
    assert re.search(rf"^EFFECTIVE rank=0 precision={want} tf32=off param_dtype=float32 threads={cpus} .*device=cpu ",
                     log, re.M)
    assert "CPU_LEVERS allocator=none (QA_CPU_ALLOCATOR=none) affinity=off (QA_CPU_AFFINITY=0)" in log


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
                                  env=offline_env(PORT=str(port), BIND="127.0.0.1"), stdout=fh,
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


def run_qa_args(tiny_bert: Path, files: dict[str, Path], out: Path, *extra: str) -> list[str]:
    """run_qa.py's arguments for one epoch of the demo files with the tiny BERT (`extra` last: it wins)."""
    return ["--model_name_or_path", str(tiny_bert), "--train_file", str(files["train"]),
            "--validation_file", str(files["validation"]), "--do_train", "--do_eval", "--output_dir", str(out),
            "--max_seq_length", "128", "--doc_stride", "32", "--per_device_train_batch_size", "8",
            "--num_train_epochs", "1", "--report_to", "none", "--save_strategy", "no", *extra]


@pytest.mark.parametrize("config, world, launch, run_args, want, reason", [
    ("cpu.yaml", 1, (), (), "fp32", "accelerate mixed_precision=no"),  # cpu.yaml says mixed_precision: 'no'
    ("cpu_multi.yaml", 2, ("--mixed_precision", "bf16"), (), "bf16", "accelerate mixed_precision=bf16"),
    ("cpu.yaml", 1, ("--mixed_precision", "bf16"), ("--precision", "fp32"), "fp32", "--precision fp32"),  # flag wins
])
def test_accelerate_launch_cpu_configs(config: str, world: int, launch: tuple[str, ...], run_args: tuple[str, ...],
                                       want: str, reason: str, tiny_bert: Path, demo_files: dict, tmp_path: Path):
    """Each config runs, and accelerate's mixed precision is what trains (unless --precision says otherwise)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "configs" / "accelerate"
           / config), "--main_process_port", str(free_port()), *launch, str(REPO / "run_qa.py"),
           *run_qa_args(tiny_bert, demo_files, out, *run_args)]
    proc = run(cmd, offline_env(), cwd=tmp_path)
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


@pytest.mark.parametrize("qa_precision, args", [
    ("none", ()),  # the old name of fp32 (QA_PRECISION=bf16: the demo run above)
    ("bf16", ("--precision", "fp32")),  # the job's own arguments win over its environment
])
def test_job_precision_reaches_run_qa(qa_precision: str, args: tuple[str, ...], tiny_bert: Path, tmp_path: Path):
    proc = run(["bash", str(REPO / "job_ft3.sh"), *args, "--max_steps", "1", "--max_eval_samples", "2"],
               demo_env(tiny_bert, tmp_path, QA_PRECISION=qa_precision))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "PLAN device=cpu precision=fp32 (--precision fp32)" in log
    assert re.search(r"^EFFECTIVE rank=0 precision=fp32 ", log, re.M)


@pytest.mark.parametrize("qa_precision, args, says", [
    ("fp8", (), "ERROR: QA_PRECISION=fp8: use auto, bf16, fp16 or fp32"),
    ("auto", ("--no_such_flag", "1"), "JOB_EXIT_CODE=2"),  # the run's own status is the job's
])
def test_job_refuses_bad_settings_with_exit_2(qa_precision: str, args: tuple[str, ...], says: str, tiny_bert: Path,
                                              tmp_path: Path):
    proc = run(["bash", str(REPO / "job_ft3.sh"), *args], demo_env(tiny_bert, tmp_path, QA_PRECISION=qa_precision))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 2 and says in log, log[-3000:]
    assert not re.search(r"^WALL_CLOCK_SECONDS=", log, re.M)


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
        return run(["bash", "-c", script], offline_env(**env)).stdout.strip()

    assert port(SLURM_JOB_ID="123456") == "18456" and port(SLURM_JOB_ID="123457") == "18457"
    assert port(SLURM_JOB_ID="123456", QA_RDZV_PORT="29999") == "29999"


def test_single_gpu_config_keeps_the_gpus_slurm_gave(tmp_path: Path):
    """accelerate's gpu_ids would overwrite CUDA_VISIBLE_DEVICES: the config leaves it as Slurm set it."""
    script = tmp_path / "show.py"
    script.write_text('import os\nprint("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))\n')
    proc = run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO / "configs" / "accelerate" / "single_gpu.yaml"), str(script)],
               offline_env(CUDA_VISIBLE_DEVICES="3"), cwd=tmp_path)
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


def levers_job(tiny_bert: Path, tmp: Path, data: Path, script: str = "job_cpu.sh", gpus: int = 0,
               **extra: str) -> tuple[int, str]:
    """A job in demo mode with the stand-in python (`gpus`: what it says torch sees) and torchrun (prints its
    arguments, then reports as the training process); (exit code, log)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp / "report.py").write_text(REPORT)
    for name, body in {"python": f'[ "$1" = run_qa.py ] && exec {sys.executable} {tmp / "report.py"}\n'
                                 f'[ "$*" = "-m qa_hpc.plan --gpu-count" ] && [ {gpus} -gt 0 ] && echo {gpus} && exit\n'
                                 f'exec {sys.executable} "$@"',
                       "torchrun": f'echo "TORCHRUN $*"; exec {sys.executable} {tmp / "report.py"}',
                       "numactl": "exit 0"}.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = demo_env(tiny_bert, tmp, QA_MODE="demo", QA_VENV="none", **extra)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["QA_DEMO_DATA"] = str(data)
    for key in ("LD_PRELOAD", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "OMP_NUM_THREADS"):
        if key not in extra:
            env.pop(key, None)
    proc = run(["bash", str(REPO / script)], env)
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


@pytest.mark.parametrize("levers, says, child", [
    ({"QA_CPU_ALLOCATOR": "jemalloc", "QA_CPU_LIB_SEARCH": "{empty}"},  # logged, not fatal
     "CPU_LEVERS allocator=none (QA_CPU_ALLOCATOR=jemalloc: no libjemalloc library found", {"LD_PRELOAD": "<unset>"}),
    ({"QA_CPU_ALLOCATOR": "none", "QA_CPU_AFFINITY": "1"},  # binds threads, leaves their count to run_qa.py
     "CPU_LEVERS allocator=none (QA_CPU_ALLOCATOR=none) affinity=OMP_PROC_BIND=close,OMP_PLACES=threads",
     {"OMP_PROC_BIND": "close", "OMP_PLACES": "threads", "OMP_NUM_THREADS": "<unset>"}),
    ({"QA_CPU_AFFINITY": "0"}, "affinity=off (QA_CPU_AFFINITY=0)", {"OMP_PROC_BIND": "<unset>"}),
    ({"QA_CPU_AFFINITY": "1", "OMP_PLACES": "cores"}, "affinity=kept the user's",
     {"OMP_PLACES": "cores", "OMP_PROC_BIND": "<unset>"}),
])
def test_levers_reach_the_training_process(levers: dict[str, str], says: str, child: dict[str, str], tiny_bert: Path,
                                           tmp_path: Path, demo_data: Path):
    (tmp_path / "empty").mkdir()
    levers = {k: v.format(empty=tmp_path / "empty") for k, v in levers.items()}
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, **levers)
    assert rc == 0 and says in log, log[-3000:]
    assert {k: child_env(log)[k] for k in child} == child


@pytest.mark.parametrize("binding, torchrun_has, threads", [
    ("exclusive", "--numa-binding=exclusive", "8"),  # the default, numactl there
    ("none", "", "<unset>"),
])
def test_ddp_job_binds_each_gpu_worker_near_its_gpu(binding: str, torchrun_has: str, threads: str, tiny_bert: Path,
                                                    tmp_path: Path, demo_data: Path):
    """A made-up node, 4 GPUs and 32 CPUs for the task: each worker an exclusive share of the CPUs of its GPU's NUMA
    node, and that share as its threads (run_qa.py's plan takes OMP_NUM_THREADS); QA_NUMA_BINDING=none: neither."""
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, "job_ddp.sh", gpus=4, QA_NUMA_BINDING=binding,
                         SLURM_CPUS_PER_TASK="32")
    assert rc == 0, log[-3000:]
    torchrun = re.search(r"^TORCHRUN (.*)$", log, re.M)
    assert torchrun and "--nproc_per_node=4 " in torchrun.group(1) and "--ddp_backend nccl" in torchrun.group(1)
    assert ("--numa-binding" in torchrun.group(1)) == bool(torchrun_has) and torchrun_has in torchrun.group(1)
    assert child_env(log)["OMP_NUM_THREADS"] == threads and f"numa_binding={binding} " in log


def test_unknown_value_is_a_usage_error(tiny_bert: Path, tmp_path: Path, demo_data: Path):
    rc, log = levers_job(tiny_bert, tmp_path, demo_data, QA_CPU_ALLOCATOR="mimalloc")
    assert rc == 2, log[-3000:]
    assert "QA_CPU_ALLOCATOR=mimalloc: use auto, jemalloc, tcmalloc or none" in log
    assert "CHILD_ENV" not in log


def test_training_runs_with_both_levers_on(tiny_bert: Path, tmp_path: Path, demo_data: Path):
    env = demo_env(tiny_bert, tmp_path, QA_MODE="demo", QA_CPU_ALLOCATOR="auto", QA_CPU_AFFINITY="1",
                   QA_DEMO_DATA=str(demo_data))
    proc = run(["bash", str(REPO / "job_cpu.sh"), "--max_eval_samples", "5"], env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert re.search(r"CPU_LEVERS allocator=\S+ .*affinity=OMP_PROC_BIND=close", log)
    assert re.search(r"^eval_f1=\d+\.\d+$", log, re.M)


# --- bench/gpu_smoke.sh: its timing logic on the CPU, its refusal without a GPU ---------------------------

SLOW_FIRST_STEP = """import sys, time
from transformers import TrainerCallback
sys.path.insert(0, "bench")
import gpu_smoke

class SlowFirstStep(TrainerCallback):  # as CUDA/cuBLAS start-up and the first batch make step 1 slow on a GPU
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            time.sleep(3.0)

sys.exit(gpu_smoke.train(sys.argv[1:], (SlowFirstStep(),)))
"""


def test_gpu_smoke_steady_state_leaves_the_slow_first_step_out(tiny_bert: Path, demo_files: dict, tmp_path: Path):
    out, results = tmp_path / "out", tmp_path / "results"
    train = run_qa_args(tiny_bert, demo_files, out, "--max_steps", "8", "--per_device_train_batch_size", "4",
                        "--precision", "fp32")
    proc = run([sys.executable, "-c", SLOW_FIRST_STEP, *train], offline_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    proc = run([sys.executable, "bench/gpu_smoke.py", "record", str(out), "--label", "cpu", "--warmup", "1",
                "--results_dir", str(results)], offline_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert re.search(r"^SMOKE label=cpu device=cpu gpus=1 precision=fp32 median_step_seconds=", proc.stdout, re.M)
    steps = json.loads((out / "step_times.json").read_text())["step_seconds"]
    (record,) = [json.loads(p.read_text()) for p in results.glob("gpu_smoke_*_cpu.json")]
    assert len(steps) == 8 and steps[0] >= 3.0 and max(steps[1:]) < 3.0
    assert record["median_step_seconds"] == pytest.approx(sorted(steps[1:])[3]) and record["steps_timed"] == 7
    assert record["whole_run_step_seconds"] > record["median_step_seconds"] + 3.0 / 8  # the whole run holds it
    assert record["samples_per_second"] == pytest.approx(4 / record["median_step_seconds"])
    assert record["projected_2_epochs_seconds"] == pytest.approx(2 * 88524 / record["samples_per_second"])
    assert record["learned"] is True and record["mfu"] is None and record["torch"]


def test_gpu_smoke_without_a_gpu_says_so_in_one_line():
    proc = run(["bash", str(REPO / "bench" / "gpu_smoke.sh")], offline_env(CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "GPU_SMOKE=not_run: no GPU here (torch sees none); run bench/gpu_smoke.sh on a GPU node"], proc.stderr
