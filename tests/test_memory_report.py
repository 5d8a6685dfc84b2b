"""memory.json and the MEMORY_* lines: measured peaks of real runs beside the anatomy estimate.

The estimate is checked against numbers worked out by hand in the comments (parameter counts
of two small BERTs layer by layer, 16/18 bytes per parameter, the activation formula evaluated);
the measured figures against what the machine allows (RSS below physical memory, every rank present).
"""

from __future__ import annotations


import torch
from transformers import BertConfig, BertForQuestionAnswering

from qa_hpc.model import ModelShape
from qa_hpc.observe.memory import anatomy_estimate, measure_process, optimizer_bytes_per_param


def _tiny() -> BertForQuestionAnswering:
    return BertForQuestionAnswering(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3,
                                               num_attention_heads=4, intermediate_size=64))


# _tiny() by hand (512 positions, 2 token types, no pooler):
#   embeddings 100*32 + 512*32 + 2*32 + LayerNorm 2*32 = 3,200 + 16,384 + 64 + 64  = 19,712
#   per layer: QKV 3*(32*32+32) = 3,168; out 32*32+32 = 1,056; LN 64; 32*64+64 = 2,112;
#              64*32+32 = 2,080; LN 64                                 -> 8,544 (x3 = 25,632)
#   qa_outputs 32*2+2                                                             =     66
#   params                                                                        = 45,410
# At s=128, b=16 (s*b*h = 128*16*32 = 65,536), a=4:
#   16-bit activations: per layer 65,536*(34 + 5*4*128/32) = 65,536*114 = 7,471,104 (x3 = 22,413,312)
#                       + embeddings 65,536*(2*2+1) = 327,680                 -> 22,740,992 B = 21.69 MiB
#   fp32 activations:   per layer 65,536*(66 + 9*4*128/32) = 65,536*210 = 13,762,560 (x3 = 41,287,680)
#                       + embeddings 65,536*(2*4+1) = 589,824                 -> 41,877,504 B = 39.94 MiB
#   checkpointed 16-bit: layer inputs 3*65,536*2 = 393,216 + one layer 7,471,104 + embeddings 327,680
#                                                                              -> 8,192,000 B = 7.81 MiB
#   fp32 + AdamW total:  45,410*16 = 726,560 + 41,877,504 = 42,604,064 B = 40.63 MiB
#   bf16 + AdamW total:  45,410*18 = 817,380 + 22,740,992 = 23,558,372 B = 22.47 MiB
PARAMS, S, B = 45_410, 128, 16


def test_bytes_per_param_follow_precision_and_optimizer():
    model = _tiny()
    fp32 = anatomy_estimate(ModelShape.of(model), "fp32", "adamw_torch_fused", B, S)
    mixed = anatomy_estimate(ModelShape.of(model), "bf16", "adamw_torch", B, S)
    assert fp32["params"] == fp32["trainable_params"] == PARAMS
    assert fp32["bytes_per_param"] == {"weights": 4, "gradients": 4, "optimizer": 8, "total": 16}
    assert mixed["bytes_per_param"] == {"weights": 6, "gradients": 4, "optimizer": 8, "total": 18}
    assert (fp32["activations_mb"], fp32["total_mb"]) == (39.9, 40.6)
    assert (mixed["activations_mb"], mixed["total_mb"]) == (21.7, 22.5)
    assert mixed["weights_mb"] == 0.3  # 45,410*6 = 272,460 B
    checkpointed = anatomy_estimate(ModelShape.of(model), "bf16", "adamw_torch", B, S, gradient_checkpointing=True)
    assert checkpointed["activations_mb"] == 7.8
    assert optimizer_bytes_per_param("adamw_bnb_8bit") == 2 and optimizer_bytes_per_param("sgd") == 0
    assert optimizer_bytes_per_param("adafactor") == 4
    frozen = _tiny()
    for p in frozen.bert.parameters():
        p.requires_grad_(False)
    est = anatomy_estimate(ModelShape.of(frozen), "fp32", "adamw_torch", B, S)
    # only qa_outputs (66 params) trains: no gradients or AdamW states for the other 45,344
    assert (est["params"], est["trainable_params"]) == (PARAMS, 66)
    assert est["total_mb"] == 40.1  # 45,410*4 + 66*(4+8) + 41,877,504 = 42,059,936 B = 40.11 MiB


def test_measure_process_on_this_machine():
    figures = measure_process(0)
    assert figures["cpu"]["peak_rss_mb"] > 0
    if torch.cuda.is_available():
        assert figures["cuda"]["total_mb"] > 0
    else:
        assert figures["cuda"] is None and figures["nvml"] is None and figures["nvml_note"] == "no CUDA device"
