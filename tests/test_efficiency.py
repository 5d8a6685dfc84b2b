"""Efficiency figures: FLOP model, peak table, real-token counts, MFU arithmetic."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForQuestionAnswering

from qa_hpc.features import real_lengths
from qa_hpc.model import ModelShape
from qa_hpc.observe.efficiency import peak_tflops, train_efficiency, train_flops_per_sequence


def _bert_base_on_meta():
    with torch.device("meta"):  # shapes only: no memory, no init time
        return BertForQuestionAnswering(BertConfig())


def test_bert_base_costs_about_212_gflop_per_384_token_training_sequence():
    shape = ModelShape.of(_bert_base_on_meta())
    n = shape.non_embedding_params
    assert (shape.layers, shape.hidden, shape.heads) == (12, 768, 12)
    assert 84e6 < n < 87e6, n  # 12 layers x 7.1M + pooler + QA head
    flops = train_flops_per_sequence(np.array([384]), n, 12, 768)[0]
    assert flops == pytest.approx(6 * n * 384 + 12 * 12 * 768 * 384 * 384)
    assert 205e9 < flops < 215e9
    # two epochs of the 88,524 SQuAD train features at 384 tokens: about 37.6 PFLOP
    assert 18.5e15 * 2 < flops * 88524 * 2 < 19.2e15 * 2


@pytest.mark.parametrize(
    "name, precision, tf32, want",
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", False, 312.0),
        ("NVIDIA A100-PCIE-40GB", "fp32", True, 156.0),
        ("NVIDIA A100-PCIE-40GB", "fp32", False, 19.5),
        ("NVIDIA H100 80GB HBM3", "bf16", False, 989.0),
        ("NVIDIA H100 PCIe", "bf16", False, 756.0),
        ("NVIDIA H200", "fp16", False, 989.0),
        ("Tesla T4", "fp16", False, 65.0),
        ("NVIDIA GeForce RTX 4090", "bf16", False, 165.2),
        ("NVIDIA L40", "bf16", False, 181.0),  # not L4's 121 (names are matched longest key first)
        ("NVIDIA L40S", "bf16", False, 362.0),
        ("NVIDIA L4", "bf16", False, 121.0),
        ("cpu", "fp32", False, None),
        ("Some Future GPU", "bf16", False, None),
    ],
)
def test_peak_table(name, precision, tf32, want):
    assert peak_tflops(name, precision, tf32) == want


def test_real_lengths_from_arrow_and_lists_count_mask_ones():
    masks = [[1] * 5 + [0] * 3, [1] * 8, [1, 1], [1] * 3 + [0] * 5]
    ds = datasets.Dataset.from_dict({"attention_mask": masks})
    want = [5, 8, 2, 3]
    assert real_lengths(ds).tolist() == want
    assert real_lengths(ds.select([3, 0])).tolist() == [3, 5]
    assert real_lengths({"attention_mask": masks}).tolist() == want


def test_train_efficiency_arithmetic():
    shape = ModelShape.of(_bert_base_on_meta())
    lengths = np.array([100, 200, 384])
    eff = train_efficiency(lengths, 2.0, 10.0, shape, "NVIDIA A100-SXM4-80GB", 4, "bf16", True)
    n = shape.non_embedding_params
    flops = 2 * sum(6 * n * s + 12 * 12 * 768 * s * s for s in lengths)
    assert eff.train_real_tokens == 2 * 684
    assert eff.train_tokens_per_second == pytest.approx(136.8)
    assert eff.train_samples_per_second == pytest.approx(0.6)
    assert eff.train_model_tflop == pytest.approx(flops / 1e12)
    assert eff.train_achieved_tflops == pytest.approx(flops / 10 / 1e12)
    assert eff.train_peak_tflops == 4 * 312.0
    assert eff.train_mfu == pytest.approx(flops / 10 / 1e12 / (4 * 312.0))
    lines = eff.log_lines()
    assert lines[0].startswith("TRAIN_TOKENS_PER_SECOND=136.8")
    assert any(line.startswith("MFU=0.") for line in lines)
    cpu = train_efficiency(lengths, 1.0, 10.0, shape, "cpu", 1, "fp32", False)
    assert cpu.train_mfu is None and "train_mfu" not in cpu.metrics()
    assert any(line.startswith("MFU=n/a") for line in cpu.log_lines())
