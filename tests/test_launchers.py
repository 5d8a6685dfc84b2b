"""The launchers as a user runs them, without SLURM: setup_bert.sh, job_ft3.sh, accelerate launch.

All offline (no hub here): setup_bert.sh must still finish and leave the offline demo ready;
job_ft3.sh must fall back to the offline demo, say so loudly, and exit with the run's status.
Tiny overrides (tiny random BERT, a few generated questions) keep each run to seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

TIMEOUT = 300
NO_SLURM = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_CPUS_PER_TASK", "SLURM_SUBMIT_DIR", "SLURM_JOB_NODELIST")


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NO_SLURM}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def demo_env(tiny_bert: Path, tmp: Path, **extra: str) -> dict[str, str]:
    return base_env(
        QA_DEMO_MODEL=str(tiny_bert), QA_DEMO_DATA=str(tmp / "data"), QA_DEMO_TRAIN="16", QA_DEMO_EVAL="9",
        QA_DEMO_CONTEXT_WORDS="40", QA_DEMO_BATCH="8", QA_MAX_SEQ_LENGTH="128", QA_DOC_STRIDE="32",
        QA_OUTPUT_DIR=str(tmp / "out"), QA_REPORT_TO="none", QA_LOG_DIR=str(tmp / "logs"), **extra,
    )


def run(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def test_job_ft3_falls_back_to_the_offline_demo_and_labels_it(tiny_bert: Path, tmp_path: Path):
    proc = run(["bash", str(REPO / "job_ft3.sh"), "--max_eval_samples", "5"], demo_env(tiny_bert, tmp_path))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
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


def test_setup_bert_offline_finishes_ready_for_the_demo(tmp_path: Path):
    """A copy of the checkout with no network: setup finishes, twice, and says what it got."""
    work = tmp_path / "checkout"
    keep = shutil.ignore_patterns(".git", ".venv", "hf_cache", "outputs", "logs", "runs", "data", "__pycache__")
    shutil.copytree(REPO, work, ignore=keep)
    (work / ".venv").symlink_to(REPO / ".venv")  # the project's venv (pip is not under test here)
    env = base_env(QA_SKIP_PIP="1", QA_DEMO_TRAIN="20", QA_DEMO_EVAL="5")
    for attempt in (1, 2):
        proc = run(["bash", "setup_bert.sh"], env, cwd=work)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-3000:]
        assert "HUB_REACHABLE=0" in log and "SETUP_READY=offline_demo" in log
    assert "demo data in data/demo" in log  # the second run kept what the first made
    for name in ("train.json", "validation.json"):
        assert (work / "data" / "demo" / name).is_file()
    assert (work / "logs").is_dir() and (work / "hf_cache").is_dir()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_cmd(config: str, tiny_bert: Path, files: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(REPO / "configs" / "accelerate" / config), *extra, str(REPO / "run_qa.py"),
        "--model_name_or_path", str(tiny_bert), "--train_file", str(files["train"]),
        "--validation_file", str(files["validation"]), "--do_train", "--do_eval", "--output_dir", str(out),
        "--max_seq_length", "128", "--doc_stride", "32", "--per_device_train_batch_size", "8",
        "--num_train_epochs", "1", "--report_to", "none", "--save_strategy", "no",
    ]


@pytest.mark.parametrize("config,world", [("cpu.yaml", 1), ("cpu_multi.yaml", 2)])
def test_accelerate_launch_cpu_configs(config: str, world: int, tiny_bert: Path, demo_files: dict, tmp_path: Path):
    out = tmp_path / "out"
    proc = run(accelerate_cmd(config, tiny_bert, demo_files, out, "--main_process_port", str(free_port())),
               base_env(), cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert f"DISTRIBUTED world_size={world}" in log
    if world > 1:
        assert "backend=gloo" in log
    assert len(re.findall(r"^eval_f1=", log, re.M)) == 1  # computed and printed once
    train = json.loads((out / "train_results.json").read_text())
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == -(-train["train_samples"] // (8 * world))


def test_accelerate_configs_load_as_intended():
    """The GPU configs cannot run here; accelerate must at least read them as what they claim to be."""
    from accelerate.commands.config.config_args import load_config_from_file

    expect = {
        "cpu.yaml": ("NO", 1), "cpu_multi.yaml": ("MULTI_GPU", 2), "single_gpu.yaml": ("NO", 1),
        "multi_gpu.yaml": ("MULTI_GPU", 4), "multi_node.yaml": ("MULTI_GPU", 8), "fsdp.yaml": ("FSDP", 4),
    }
    found = sorted(p.name for p in (REPO / "configs" / "accelerate").glob("*.yaml"))
    assert found == sorted(expect)
    for name, (kind, procs) in expect.items():
        cfg = load_config_from_file(str(REPO / "configs" / "accelerate" / name))
        assert cfg.distributed_type.value == kind and cfg.num_processes == procs, name
    assert load_config_from_file(str(REPO / "configs" / "accelerate" / "multi_node.yaml")).num_machines == 2
    fsdp = load_config_from_file(str(REPO / "configs" / "accelerate" / "fsdp.yaml")).fsdp_config
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"


# --- settings through the launchers: what the user asks for reaches run_qa.py unchanged ------------------


@pytest.mark.parametrize("qa_precision, want", [("fp32", "fp32"), ("none", "fp32"), ("bf16", "bf16")])
def test_job_passes_qa_precision_through(tiny_bert: Path, tmp_path: Path, qa_precision: str, want: str):
    """QA_PRECISION reaches run_qa.py as --precision (the script decides nothing); the run says what ran."""
    proc = run(["bash", str(REPO / "job_ft3.sh"), "--max_steps", "2", "--max_eval_samples", "3"],
               demo_env(tiny_bert, tmp_path, QA_PRECISION=qa_precision))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert f"PLAN device=cpu precision={want} (--precision {want})" in log
    assert re.search(rf"^EFFECTIVE rank=0 precision={want} ", log, re.M)


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


@pytest.mark.parametrize("launch, run_args, want, reason", [
    ((), (), "fp32", "accelerate mixed_precision=no"),  # cpu.yaml says mixed_precision: 'no'
    (("--mixed_precision", "bf16"), (), "bf16", "accelerate mixed_precision=bf16"),
    (("--mixed_precision", "bf16"), ("--precision", "fp32"), "fp32", "--precision fp32"),
])
def test_accelerate_mixed_precision_is_what_trains(tiny_bert: Path, demo_files: dict, tmp_path: Path, launch,
                                                   run_args, want, reason):
    proc = run(accelerate_train("cpu.yaml", tiny_bert, demo_files, tmp_path / "out", *launch, run_args=run_args),
               base_env(), cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert f"precision={want} ({reason})" in log
    assert re.search(rf"^EFFECTIVE rank=0 precision={want} ", log, re.M)


def test_single_gpu_config_keeps_the_gpus_slurm_gave(tmp_path: Path):
    """accelerate's gpu_ids would overwrite CUDA_VISIBLE_DEVICES: the config leaves it as Slurm set it."""
    script = tmp_path / "show.py"
    script.write_text('import os\nprint("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))\n')
    proc = run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO / "configs" / "accelerate" / "single_gpu.yaml"), str(script)],
               base_env(CUDA_VISIBLE_DEVICES="3"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CUDA_VISIBLE_DEVICES=3" in proc.stdout
