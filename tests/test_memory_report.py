"""memory.json and the MEMORY_* lines: measured peaks of real runs beside the anatomy estimate.

The estimate is checked against numbers computed here by hand (parameter count of the
saved model, 16/18 bytes per parameter, the activation formula); the measured figures
against what the machine allows (RSS below physical memory, every rank present).
"""

from __future__ import annotations

import json

import psutil
import pytest
import torch
from transformers import AutoModelForQuestionAnswering, BertConfig, BertForQuestionAnswering

from qa_hpc.model import ModelShape
from qa_hpc.observe.memory import MB, anatomy_estimate, measure_process, optimizer_bytes_per_param
from observe_runs import ok_run


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

    # the estimate, by hand: parameters of the saved model, fp32 + AdamW = 16 bytes each
    model = AutoModelForQuestionAnswering.from_pretrained(str(run.out_dir))
    params = sum(p.numel() for p in model.parameters())
    est = report["estimate"]
    assert est["params"] == params and est["trainable_params"] == params
    assert est["bytes_per_param"] == {"weights": 4, "gradients": 4, "optimizer": 8, "total": 16}
    assert est["weights_mb"] == round(params * 4 / MB, 1) and est["optimizer_mb"] == round(params * 8 / MB, 1)
    s, b, h, a, layers = 128, 8, 64, 2, 2
    activations = layers * s * b * h * (66 + 9 * a * s / h) + s * b * h * 9
    assert est["activations_mb"] == round(activations / MB, 1)
    assert est["total_mb"] == pytest.approx((params * 16 + activations) / MB, abs=0.1)
    assert report["measured_peak_mb"] == rss


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


def test_every_rank_is_in_the_report(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("ddp", tmp_path_factory, tiny_bert, demo_files)
    report = json.loads((run.out_dir / "memory.json").read_text())
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    peaks = [r["cpu"]["peak_rss_mb"] for r in report["ranks"]]
    assert all(p > 50 for p in peaks)
    assert report["max_over_ranks"]["cpu_peak_rss_mb"] == max(peaks)
    assert run.kv()["RUN_NODES"] == "1" and run.kv()["RUN_WORLD_SIZE"] == "2"


def _tiny() -> BertForQuestionAnswering:
    return BertForQuestionAnswering(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3,
                                               num_attention_heads=4, intermediate_size=64))


def test_bytes_per_param_follow_precision_and_optimizer():
    model = _tiny()
    n = sum(p.numel() for p in model.parameters())
    fp32 = anatomy_estimate(ModelShape.of(model), "fp32", "adamw_torch_fused", 4, 64)
    mixed = anatomy_estimate(ModelShape.of(model), "bf16", "adamw_torch", 4, 64)
    assert fp32["bytes_per_param"]["total"] == 16 and mixed["bytes_per_param"]["total"] == 18
    assert mixed["weights_mb"] == round(n * 6 / MB, 1)
    assert optimizer_bytes_per_param("adamw_bnb_8bit") == 2 and optimizer_bytes_per_param("sgd") == 0
    assert optimizer_bytes_per_param("adafactor") == 4
    # 16-bit activations: s*b*h*(34 + 5*a*s/h) per layer
    s, b, h, a = 64, 4, 32, 4
    per_layer = s * b * h * (34 + 5 * a * s / h)
    assert mixed["activations_mb"] == round((3 * per_layer + s * b * h * 5) / MB, 1)
    checkpointed = anatomy_estimate(ModelShape.of(model), "bf16", "adamw_torch", 4, 64, gradient_checkpointing=True)
    assert checkpointed["activations_mb"] < mixed["activations_mb"]
    frozen = _tiny()
    for p in frozen.bert.parameters():
        p.requires_grad_(False)
    est = anatomy_estimate(ModelShape.of(frozen), "fp32", "adamw_torch", 4, 64)
    assert est["trainable_params"] < est["params"] and est["gradients_mb"] < fp32["gradients_mb"]


def test_measure_process_on_this_machine():
    figures = measure_process(0)
    assert figures["cpu"]["peak_rss_mb"] > 0
    if torch.cuda.is_available():
        assert figures["cuda"]["total_mb"] > 0
    else:
        assert figures["cuda"] is None and figures["nvml"] is None and figures["nvml_note"] == "no CUDA device"
