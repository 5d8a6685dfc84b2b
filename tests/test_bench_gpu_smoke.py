"""bench/gpu_smoke.sh on a machine without a GPU: a clear refusal, not a CPU run that looks like a GPU figure."""

from __future__ import annotations

import subprocess

from fixtures.runqa import PYTHON, REPO, qa_env


def test_gpu_smoke_refuses_without_a_gpu():
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_smoke.sh")], capture_output=True, text=True, timeout=120,
                          env=qa_env(CUDA_VISIBLE_DEVICES="", PY=PYTHON), cwd=REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ERROR: no GPU here (torch sees none)" in proc.stderr
    assert "SMOKE" not in proc.stdout
