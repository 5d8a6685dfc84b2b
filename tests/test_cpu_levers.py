"""job_cpu.sh's CPU levers (scripts/env_setup.sh qa_cpu_levers): allocator preload and thread affinity.

What the training process really gets is checked from inside it: `python` on PATH is a stand-in that,
for `python run_qa.py ...`, reports its own environment and whether the allocator is mapped into it
(/proc/self/maps), and passes every other call (demo data) to the real interpreter. One real tiny
training run checks that training works with both levers on.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, skip_or_fail
from test_launchers import demo_env, run

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
