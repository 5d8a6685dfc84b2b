"""memory.json and the MEMORY_* lines: measured peaks of real runs beside the anatomy estimate.

The estimate is checked against numbers worked out by hand in the comments (parameter counts
of two small BERTs layer by layer, 16/18 bytes per parameter, the activation formula evaluated);
the measured figures against what the machine allows (RSS below physical memory, every rank present).
"""

from __future__ import annotations

import json

import psutil
import pytest
import torch

from qa_hpc.observe.memory import MB
from observe_runs import ok_run


@pytest.mark.e2e
def test_memory_json_fields_are_present_and_sane(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("single", tmp_path_factory, tiny_bert, demo_files)
    report = json.loads((run.out_dir / "memory.json").read_text())
    rss = report["cpu"]["peak_rss_mb"]
    assert 50 < rss < psutil.virtual_memory().total / MB
    assert report["max_over_ranks"]["cpu_peak_rss_mb"] == rss
    assert [r["rank"] for r in report["ranks"]] == [0] and report["world_size"] == 1
    if torch.cuda.is_available():
        cuda = report["cuda"]
        assert 0 < cuda["peak_allocated_mb"] <= cuda["peak_reserved_mb"] <= cuda["total_mb"]
        assert report["nvml"] is None or report["nvml"]["used_mb"] >= cuda["peak_reserved_mb"] * 0.5
    else:
        assert report["cuda"] is None and report["nvml"] is None
        assert report["note"] == "no CUDA device"
        assert report["measured_source"].startswith("cpu peak RSS")

    # the estimate, by hand, for the tiny BERT of conftest.build_tiny_bert (vocab 30522, h=64, 2 layers,
    # 2 heads, intermediate 128, 512 positions) at s=128, b=8, fp32 + AdamW:
    #   embeddings 30522*64 + 512*64 + 2*64 + LayerNorm 2*64                = 1,986,432
    #   per layer: QKV 3*(64*64+64) + out 64*64+64 + LN 128 + 64*128+128
    #              + 128*64+64 + LN 128 = 12,480+4,160+128+8,320+8,256+128  =    33,472 (x2 = 66,944)
    #   qa_outputs 64*2+2                                                   =       130
    #   params                                                              = 2,053,506
    #   weights 4 B/param = 8,214,024 B = 7.83 MiB; AdamW 8 B/param = 16,428,048 B = 15.67 MiB
    #   activations: s*b*h = 128*8*64 = 65,536; per layer 65,536*(66 + 9*2*128/64) = 65,536*102
    #                = 6,684,672 (x2 = 13,369,344) + embeddings 65,536*9 = 589,824 -> 13,959,168 B = 13.31 MiB
    #   total 2,053,506*16 + 13,959,168 = 46,815,264 B = 44.65 MiB
    est = report["estimate"]
    assert est["params"] == est["trainable_params"] == 2_053_506
    assert est["bytes_per_param"] == {"weights": 4, "gradients": 4, "optimizer": 8, "total": 16}
    assert (est["weights_mb"], est["gradients_mb"], est["optimizer_mb"]) == (7.8, 7.8, 15.7)
    assert est["activations_mb"] == 13.3
    assert est["total_mb"] == 44.6
    assert report["measured_peak_mb"] == rss


@pytest.mark.e2e
def test_memory_lines_in_the_log_and_wall_clock_last(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("single", tmp_path_factory, tiny_bert, demo_files)
    report = json.loads((run.out_dir / "memory.json").read_text())
    kv = run.kv()
    assert float(kv["MEMORY_CPU_PEAK_RSS_MB"]) == pytest.approx(report["cpu"]["peak_rss_mb"], abs=0.05)
    assert float(kv["MEMORY_ESTIMATE_MB"]) == pytest.approx(report["estimate"]["total_mb"], abs=0.05)
    assert kv["MEMORY_ESTIMATE_BYTES_PER_PARAM"] == "16"
    if torch.cuda.is_available():
        assert float(kv["MEMORY_CUDA_PEAK_ALLOCATED_MB"]) == report["max_over_ranks"]["cuda_peak_allocated_mb"]
    else:
        assert kv["MEMORY_CUDA"] == "none (no CUDA device)"
    assert kv["RUN_WORLD_SIZE"] == "1" and kv["RUN_NODES"] == "1" and kv["RUN_PRECISION"] == "fp32"
    keys = [ln.split("=", 1)[0] for ln in run.text.splitlines() if ln.split("=", 1)[0].isidentifier() and "=" in ln]
    assert keys[-1] == "WALL_CLOCK_SECONDS"


@pytest.mark.e2e
def test_every_rank_is_in_the_report(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("ddp", tmp_path_factory, tiny_bert, demo_files)
    report = json.loads((run.out_dir / "memory.json").read_text())
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    peaks = [r["cpu"]["peak_rss_mb"] for r in report["ranks"]]
    assert all(p > 50 for p in peaks)
    assert report["max_over_ranks"]["cpu_peak_rss_mb"] == max(peaks)
    assert run.kv()["RUN_NODES"] == "1" and run.kv()["RUN_WORLD_SIZE"] == "2"
