"""The bulk dropout mask: torch's drop probability and scaling, the same mask forward and backward,
reproducible under the seed, and a model whose eval outputs do not change when it is installed."""

from __future__ import annotations

import copy
import math

import torch
from transformers import BertConfig, BertForQuestionAnswering

from qa_hpc.dropout import ATTENTION_NAME, BulkDropout, bulk_dropout, install


def tiny_bert_config(**dropout: float) -> BertConfig:
    return BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=100,
        attn_implementation="sdpa",
        **dropout,
    )


def test_drops_p_of_the_elements_scales_the_rest_and_masks_the_gradient() -> None:
    torch.manual_seed(0)
    x = torch.full((1000, 1000), 2.0, requires_grad=True)
    y = bulk_dropout(x, 0.1, training=True)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 4 * math.sqrt(0.1 * 0.9 / x.numel())  # within 4 standard deviations
    assert torch.equal(y[y != 0], torch.full_like(y[y != 0], 2.0 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad == 0, y == 0) and torch.allclose(x.grad[x.grad != 0], torch.tensor(1 / 0.9))
    assert bulk_dropout(x, 0.1, training=False) is x and bulk_dropout(x, 0.0, training=True) is x


def test_same_seed_same_masks_and_eval_outputs_unchanged() -> None:
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_bert_config()).eval()
    ids = torch.randint(0, 100, (3, 17))
    before = model(input_ids=ids).start_logits
    swapped = install(model)
    # embeddings + 3 a layer (attention, its output, the FFN output)
    assert swapped == sum(isinstance(m, BulkDropout) for m in model.modules()) == 1 + 3 * 2
    # private: listed in qa_hpc/private_api.py
    assert model.config._attn_implementation == ATTENTION_NAME
    assert torch.equal(model(input_ids=ids).start_logits, before)
    model.train()
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        runs.append(model(input_ids=ids).start_logits)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_padding_stays_masked_in_training() -> None:
    """The explicit attention path (training) must mask padded keys as SDPA does:
    same logits when nothing drops."""
    torch.manual_seed(0)  # p > 0: dropout runs, but p * 65536 rounds to 0
    torch_model = BertForQuestionAnswering(
        tiny_bert_config(hidden_dropout_prob=1e-9, attention_probs_dropout_prob=1e-9)
    ).train()
    install(bulk_model := copy.deepcopy(torch_model))
    ids = torch.randint(0, 100, (2, 9))
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    want, got = (m(input_ids=ids, attention_mask=mask).start_logits for m in (torch_model, bulk_model))
    assert torch.allclose(got[mask.bool()], want[mask.bool()], atol=1e-5)


def test_attention_dropout_draws_the_bulk_mask() -> None:
    """With only attention dropout on, the installed model drops other attention weights than torch's SDPA
    would under the same seed (its own mask), and the same ones again under that seed."""
    torch_model = BertForQuestionAnswering(
        tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    ).train()
    install(bulk_model := copy.deepcopy(torch_model))
    ids = torch.randint(0, 100, (2, 9))
    logits = []
    for model in (torch_model, bulk_model, bulk_model):
        torch.manual_seed(3)
        logits.append(model(input_ids=ids).start_logits)
    with torch.no_grad():
        undropped = bulk_model.eval()(input_ids=ids).start_logits
    assert not torch.allclose(logits[0], logits[1]) and torch.equal(logits[1], logits[2])
    assert not torch.allclose(logits[1], undropped)
