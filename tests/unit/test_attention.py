"""--attn_backend applied to torch's SDPA switches and read back: auto on a CPU changes nothing, a list
enables exactly its kernels, and a CPU's SDPA really runs only on the kernels left on (why the plan refuses
a CPU list without flash or math). The padding mask built for every batch: the same logits, no check of the
mask on the host."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers.masking_utils
from transformers import AutoModelForQuestionAnswering

from qa_hpc import attention
from qa_hpc.device import read_device_facts
from qa_hpc.flags import read_flags
from qa_hpc.plan import decide


@pytest.fixture(autouse=True)
def torch_default_kernels():
    """Every test starts and ends with torch's own state: every kernel enabled."""
    attention.apply(attention.ALL)
    yield
    attention.apply(attention.ALL)


def switches() -> dict[str, bool]:
    return {name: is_enabled() for name, (_, is_enabled) in attention.SWITCHES.items()}


def test_auto_on_a_cpu_changes_nothing():
    before = switches()
    plan = decide(read_flags(["--use_cpu"]), read_device_facts())
    attention.apply(plan.attn_backend)
    assert plan.attn_backend == "all" and switches() == before == dict.fromkeys(attention.SWITCHES, True)
    assert attention.enabled("sdpa") == "all"


@pytest.mark.parametrize(
    "asked, want",
    [("math,flash", "flash,math"), ("cudnn", "cudnn"), ("flash,efficient,math", "flash,efficient,math")],
)
def test_a_list_enables_exactly_its_kernels_and_reads_back(asked, want):
    attention.apply(asked)
    assert switches() == {name: name in want.split(",") for name in attention.SWITCHES}
    assert attention.enabled("sdpa") == attention.enabled("sdpa_bulk_dropout") == want
    assert attention.enabled("eager") == attention.enabled("flash_attention_2") == "n/a"


def test_a_cpu_runs_sdpa_only_on_the_kernels_left_on():
    q = torch.randn(2, 2, 8, 16)
    expected = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    for kernels in ("math", "flash"):
        attention.apply(kernels)
        torch.testing.assert_close(torch.nn.functional.scaled_dot_product_attention(q, q, q), expected)
    attention.apply("efficient,cudnn")  # GPU kernels only
    with pytest.raises(RuntimeError, match="No viable backend"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)


def test_every_batch_masked_gives_the_same_logits_without_the_hosts_check(tiny_bert: Path, monkeypatch):
    """mask_every_batch: transformers' SDPA attention's logits, for a batch with padding and one without,
    and not one check of the mask on the host (transformers' `padding_mask.all()`, a wait for the device on
    a GPU), where transformers' own checks each batch. A model with another attention keeps it."""
    plain = AutoModelForQuestionAnswering.from_pretrained(tiny_bert, attn_implementation="sdpa").eval()
    masked = AutoModelForQuestionAnswering.from_pretrained(tiny_bert, attn_implementation="sdpa").eval()
    eager = AutoModelForQuestionAnswering.from_pretrained(tiny_bert, attn_implementation="eager")
    assert attention.mask_every_batch(masked) and not attention.mask_every_batch(eager)
    assert (masked.config._attn_implementation, eager.config._attn_implementation) == (
        attention.ALWAYS_MASKED,
        "eager",
    )
    assert attention.enabled(attention.ALWAYS_MASKED) == attention.ALL  # SDPA's kernels, read back
    checks = []
    as_bool = torch.Tensor.__bool__

    def counted(tensor: torch.Tensor) -> bool:
        checks.append(sys._getframe(1).f_code.co_filename)
        return as_bool(tensor)

    monkeypatch.setattr(torch.Tensor, "__bool__", counted)
    ids = torch.randint(1000, 2000, (2, 24))
    padded = torch.ones_like(ids)
    padded[1, 12:] = 0
    host_checks = {}
    with torch.no_grad():
        for name, mask in (("unpadded", torch.ones_like(ids)), ("padded", padded)):
            for model in (plain, masked):
                checks.clear()
                out = model(input_ids=ids, attention_mask=mask)
                host_checks[name, model is masked] = checks.count(transformers.masking_utils.__file__)
                if model is plain:
                    want = out
            torch.testing.assert_close(out.start_logits, want.start_logits, atol=1e-5, rtol=0)
            torch.testing.assert_close(out.end_logits, want.end_logits, atol=1e-5, rtol=0)
    assert host_checks == {
        ("unpadded", False): 1,
        ("unpadded", True): 0,
        ("padded", False): 1,
        ("padded", True): 0,
    }
