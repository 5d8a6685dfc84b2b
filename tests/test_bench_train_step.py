"""bench/train_step.py runs its variants and reports consistent figures (a smoke test, not a timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.train_step", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )


def test_variants_report_steps_and_json(tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    proc = _run(
        "--model", str(tiny_bert), "--variants", "fp32,fp32+fused,fp32+eager_attn", "--batch", "2",
        "--widths", "16,24", "--steps", "2", "--warmup", "1", "--rounds", "2", "--device", "cpu", "--json_out", str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    step_lines = [line for line in proc.stdout.splitlines() if line.startswith("STEP ")]
    assert [line.split()[1] for line in step_lines] == ["variant=fp32", "variant=fp32+fused", "variant=fp32+eager_attn"]
    assert all("mfu=n/a" in line for line in step_lines), "no peak on a CPU"
    data = json.loads(out.read_text())
    assert data["meta"]["widths"] == [16, 24] and data["meta"]["device"]
    for row in data["rows"]:
        assert row["median_step_s"] > 0 and row["mfu"] is None
        assert abs(row["samples_per_s"] - 2 / row["median_step_s"]) < 1e-6 * row["samples_per_s"]
        assert abs(row["tokens_per_s"] - 20 * 2 / row["median_step_s"]) < 1e-6 * row["tokens_per_s"]  # mean width 20
        assert row["achieved_tflops"] > 0
    assert data["rows"][0]["speedup_vs_first"] == 1.0


def test_gpu_only_variant_refused_on_cpu(tiny_bert: Path) -> None:
    proc = _run("--model", str(tiny_bert), "--variants", "fp16", "--device", "cpu", "--steps", "1")
    assert proc.returncode != 0
    assert "fp16 and tf32 need a CUDA GPU" in proc.stderr


def test_unknown_variant_part_named(tiny_bert: Path) -> None:
    proc = _run("--model", str(tiny_bert), "--variants", "fp32+turbo", "--device", "cpu", "--steps", "1")
    assert proc.returncode != 0
    assert "'fp32+turbo'" in proc.stderr and "turbo" in proc.stderr
