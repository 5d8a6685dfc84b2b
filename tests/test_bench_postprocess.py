"""bench/postprocess_bench.py runs, checks identity, and reports every comparison (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_postprocess_bench_reports_identical_outputs(demo_files, tmp_path):
    out = tmp_path / "bench.json"
    for v2 in ([], ["--version_2_with_negative"]):
        proc = subprocess.run(
            [sys.executable, "-m", "bench.postprocess_bench", "--validation_file",
             str(demo_files["validation"]), "--random_logits", "--cache_dir", str(tmp_path / "cache"),
             "--repeats", "1", "--sizes", "5,16", "--json_out", str(out), *v2],
            capture_output=True, text=True, timeout=600, cwd=REPO,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        for key in ("POSTPROCESS ", "POSTPROCESS_DATASET ", "POSTPROCESS_WRITE "):
            rows = [line for line in lines if line.startswith(key)]
            assert len(rows) == 2, proc.stdout
            assert all("identical=True" in line for line in rows)
        report = json.loads(out.read_text())
        assert [r["examples"] for r in report["rows"]] == [5, 16]
        assert all(r["nbest_file_bytes"] > 0 and r["v2"] == bool(v2) for r in report["rows"])
